"""The command line against generated hostile values: every entry point - the run with
--set, serve and its trace files, validate, plot, mfu import-infersim, cards import-hf - called in
process through `infersim.cli.main.main` with numbers and text a careless script or a hostile user writes.

Whatever comes in: the exit status is 0, 1 (cannot run) or 2 (bad input); for 1 and 2 stderr is
exactly one line; there is never a traceback or an internal error (3); and for 0 every number in the
JSON printed is finite and non-negative (but for the few that are signed by meaning)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT
from hypothesis import HealthCheck, event, given, settings
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

from infersim.cli.main import main

# numbers as a command line or a file writes them: text, so that YAML/JSON spellings reach the parsers
SPECIAL_TEXT = ["0", "-1", "1", "2", "7", "0.5", "2.5", "1e15", "1e16", "1e30", "1e300", "-1e300", "1e-300", "1e-45",
                "1e-15", "inf", "-inf", "nan", ".inf", ".nan", "Infinity", "abc", "", " ", "true", "null", "[1, 2]",
                "{a: 1}", "4096", "4096.5", "9" * 60, "0x10", "1_000", "١٢"]
NUMBER_TEXT = st.one_of(st.sampled_from(SPECIAL_TEXT), st.integers(-10**18, 10**18).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(1, 64).map(str))
JSON_VALUES = st.one_of(st.sampled_from([0, -1, 1, 2.5, 1e15, 1e16, 1e30, 1e300, -1e300, 1e-300, float("inf"),
                                         float("nan"), "abc", "12", "", True, None, [], {}, [1], "1e3"]),
                        st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True))

#: numbers a result may hold below zero by meaning (backlog_growth: arrivals minus admissions over the
#: second half of a stage, below zero when the queue drains)
SIGNED = {"overlap_saved_ms", "kv_capacity_gb", "error", "error_pct", "signed_mean_error", "signed_mean_error_pct",
          "backlog_growth"}
#: INFERSIM_FUZZ_EXAMPLES=500 for a deeper search than CI's
EXAMPLES = int(os.environ.get("INFERSIM_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def check_numbers(data: Any, key: str = "") -> None:
    if isinstance(data, bool) or data is None or isinstance(data, str):
        return
    if isinstance(data, (int, float)):
        assert math.isfinite(data), (key, data)
        assert data >= 0 or key in SIGNED, (key, data)
    elif isinstance(data, dict):
        for k, v in data.items():
            check_numbers(v, str(k))
    elif isinstance(data, list):
        for v in data:
            check_numbers(v, key)


def drive(capsys: pytest.CaptureFixture[str], argv: list[str], json_out: bool = True) -> int:
    """Run the command line in process and check the contract; returns the exit status."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse (one line: infersim.cli.main.OneLineParser)
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    try:
        event(f"{argv[0] if not argv[0].startswith('-') else 'run'}: exit {code}")  # --hypothesis-show-statistics
    except InvalidArgument:  # called outside a generated example
        pass
    if code:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, (argv, err)
    elif json_out:
        check_numbers(json.loads(out))
    return code


RUN_FIELDS = ["workload.isl", "workload.osl", "workload.decode_batch_per_gpu", "workload.prefill_tokens_per_gpu",
              "deployment.num_gpus", "deployment.attention.tp", "deployment.ffn.ep", "deployment.moe.redundant_experts",
              "deployment.moe.routing_skew", "model.hidden_size", "model.num_experts", "model.num_hidden_layers",
              "model.quantization.weights", "model.quantization.group_size", "hardware.peak.hbm_bandwidth",
              "hardware.peak.hbm_bytes", "hardware.derates.memory_efficiency", "hardware.derates.kernel_launch_overhead",
              "engine.overheads.step_fixed", "engine.memory.reserved_bytes", "engine.scheduler.page_size",
              "engine.fused_operations", "engine.overheads.cuda_graph_batch_sizes"]


@FUZZ
@given(field=st.sampled_from(RUN_FIELDS), value=NUMBER_TEXT, model=st.sampled_from(["qwen3-30b-a3b", "deepseek-v3"]))
def test_the_run_with_hostile_overrides(capsys, field, value, model):
    sets = ["--set", f"{field}={value}"]
    if model == "deepseek-v3":
        sets += ["--set", "model=deepseek-v3", "--set", "deployment.num_gpus=16", "--set", "deployment.num_nodes=2",
                 "--set", "deployment.attention.dp=16", "--set", "deployment.ffn.ep=16", "--set", "hardware=h800"]
        sets = sets[2:] + sets[:2]  # the fuzzed value last: it wins
    drive(capsys, ["--config", "qwen3-30b.yaml", *sets, "--format", "json"])


SERVE = ["serve", "--config", "serve-llama-8b-h100.yaml", "--format", "json"]
SERVE_OPTIONS = ["--rate", "--num-requests", "--concurrency", "--burstiness", "--replicas", "--prefix-hit-rate",
                 "--seed", "--isl", "--osl", "--slo", "--disaggregate", "--trace-time-scale"]
SLOS = st.one_of(NUMBER_TEXT.map(lambda v: f"ttft={v}"), NUMBER_TEXT.map(lambda v: f"ttft={v}ms,tpot={v}s"),
                 st.sampled_from(["ttft=2s", "tpot=50ms", "", ",", "ttft", "ttft=1ms", "latency=1s"]))
DISAGGREGATE = st.one_of(st.sampled_from(["1P1D", "2P1D", "0P1D", "1000000P1D", "9" * 40 + "P1D", "P", "3X1D", ""]),
                         st.tuples(st.integers(0, 1500), st.integers(0, 1500)).map(lambda t: f"{t[0]}P{t[1]}D"))
LENGTH = st.one_of(NUMBER_TEXT.filter(lambda v: not v.lstrip("-").isdigit() or len(v) > 6 or abs(int(v)) < 4000),
                   st.builds(lambda d, m, s, lo, hi: "{" + f"dist: {d}, mean: {m}, std: {s}, min: {lo}, max: {hi}" + "}",
                             st.sampled_from(["lognormal", "normal", "uniform", "fixed", "zipf"]),
                             st.sampled_from(["1", "100", "1000", "1.0e+15", "0", "-5", "nan", "abc"]),
                             st.sampled_from(["0", "1", "1.0e+6", "1.0e+40", "1.0e+300", "-1", ".inf"]),
                             st.sampled_from(["1", "2", "0", "1.5"]), st.sampled_from(["0", "50", "4000", "1"])))


@FUZZ
@given(option=st.sampled_from(SERVE_OPTIONS), number=NUMBER_TEXT, slo=SLOS, disaggregate=DISAGGREGATE, length=LENGTH,
       small=st.integers(1, 40))
def test_serve_with_a_hostile_option(capsys, option, number, slo, disaggregate, length, small):
    value = {"--slo": slo, "--disaggregate": disaggregate, "--isl": length, "--osl": length}.get(option, number)
    if option == "--num-requests" and value.isdigit() and int(value) > 2000:
        value = str(small)  # a valid count this large is a long (correct) run, not a hostile one
    load = [] if option in ("--rate", "--concurrency") else ["--rate", "4"]
    count = [] if option == "--num-requests" else ["--num-requests", "8"]
    drive(capsys, [*SERVE, *load, *count, option, value])


TRACE_CELLS = st.one_of(NUMBER_TEXT, st.sampled_from(["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46.5e3",
                                                      "2023-13-45 99:99:99", "yesterday"]))


@FUZZ
@given(cells=st.lists(st.tuples(TRACE_CELLS, TRACE_CELLS, TRACE_CELLS), min_size=1, max_size=3),
       jsonl=st.booleans(), binary=st.sampled_from([b"", b"\xff\xfe", b"\x00\x00", b"\xc3\x28"]))
def test_serve_replays_a_hostile_trace(capsys, tmp_path_factory, cells, jsonl, binary):
    path = tmp_path_factory.mktemp("trace") / ("t.jsonl" if jsonl else "t.csv")
    if jsonl:
        def cell(v: str) -> Any:
            try:
                return json.loads(v)
            except ValueError:
                return v
        body = "".join(json.dumps({"arrival_s": cell(a), "input_tokens": cell(i), "output_tokens": cell(o)},
                                  allow_nan=True) + "\n" for a, i, o in cells)
    else:
        body = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{a},{i},{o}\n" for a, i, o in cells)
    path.write_bytes(body.encode() + binary)
    drive(capsys, [*SERVE, "--trace", str(path)])


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(value=JSON_VALUES, unit=st.sampled_from(["tok/s/GPU", "ms", "", "TFLOPS", "tok/s per node", "furlongs"]))
def test_validate_a_hostile_reference(capsys, tmp_path_factory, value, unit):
    from conftest import shared_reference

    shared_reference()  # the mapping's runs name bundled cards only; skip where ../shared is absent, as CI has it
    path = tmp_path_factory.mktemp("ref") / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": [{"id": "sgl-h20-decode-base", "source": "X", "unit": unit,
                                                     "value": value}]}, allow_unicode=True))
    drive(capsys, ["validate", "--reference", str(path), "--format", "json"])


@pytest.fixture(scope="module")
def run_json() -> dict[str, Any]:
    from infersim.run.config import load_run_config
    from infersim.cli.report import to_json_data
    from infersim.run.simulate import simulate

    return to_json_data(simulate(load_run_config(REPO_ROOT / "configs" / "qwen3-30b.yaml")))


@settings(max_examples=max(4, EXAMPLES // 6), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from([("decode", "tpot_ms"), ("prefill", "ttft_ms"), ("memory", "weights_gb"),
                              ("decode", "tgs"), ("hardware_peaks", "hbm_bandwidth")]), value=JSON_VALUES)
def test_plot_a_hostile_result(capsys, tmp_path_factory, run_json, where, value):
    pytest.importorskip("matplotlib")
    data = json.loads(json.dumps(run_json))
    data[where[0]][where[1]] = value
    folder = tmp_path_factory.mktemp("plot")
    path = folder / "run.json"
    path.write_text(json.dumps(data, allow_nan=True))
    drive(capsys, ["plot", str(path), "--out", str(folder / "x.png")], json_out=False)


@FUZZ
@given(rows=st.lists(st.tuples(NUMBER_TEXT, NUMBER_TEXT), min_size=0, max_size=3))
def test_import_infersim_a_hostile_table(capsys, tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("published")
    table = folder / "src" / "gemm" / "h20" / "data.csv"
    table.parent.mkdir(parents=True)
    lines = ["m,k,n,latency_us,mfu", "64,2048,6144,12.5,0.4", "128,2048,6144,15.1,0.6"]
    lines += [f"256,4096,{4096 + i},{latency},{mfu}" for i, (latency, mfu) in enumerate(rows)]
    table.write_text("\n".join(lines) + "\n")
    drive(capsys, ["mfu", "import-infersim", str(folder / "src"), "--out", str(folder / "out")], json_out=False)


QUANT = st.fixed_dictionaries({}, optional={
    "quant_method": st.sampled_from(["fp8", "mxfp4", "gptq", "awq", "modelopt", "compressed-tensors", "bitsandbytes",
                                     "hqq", "", 7, None]),
    "bits": JSON_VALUES, "group_size": JSON_VALUES, "weight_block_size": st.sampled_from([[128, 128], [0, 1], "x", [1]]),
    "quant_algo": st.sampled_from(["NVFP4", "FP8", "W4A8_AWQ", "INT2", 3]),
    "modules_to_not_convert": st.sampled_from([["lm_head"], ["self_attn"], ["mlp"], "lm_head", [1], ["re:("]]),
    "config_groups": st.sampled_from([{}, {"g": {"weights": {"num_bits": 4, "type": "float"}}},
                                      {"g": {"weights": {"num_bits": 3}}}, "x"]),
})


@FUZZ
@given(quant=st.one_of(QUANT, JSON_VALUES, st.sampled_from([None, {"quant_method": "fp8"}, {"quant_method": "mxfp4"}])),
       field=st.sampled_from(["hidden_size", "num_experts", "num_hidden_layers"]),
       value=st.one_of(st.sampled_from([2048, 24, 64]), JSON_VALUES))
def test_import_hf_a_hostile_config(capsys, tmp_path_factory, quant, field, value):
    folder = tmp_path_factory.mktemp("hf")
    config = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "vocab_size": 32000, "intermediate_size": 6144, "num_experts": 64,
              "num_experts_per_tok": 4, "moe_intermediate_size": 512, "quantization_config": quant, field: value}
    path = folder / "config.json"
    path.write_text(json.dumps(config, allow_nan=True))
    code = drive(capsys, ["cards", "import-hf", str(path), "--out", str(folder / "out")], json_out=False)
    if code == 0:  # what was written loads and runs, or is refused with one message
        card = next((folder / "out").glob("*.yaml"))
        drive(capsys, ["--config", "qwen3-30b.yaml", "--set", f"model={card}", "--set", "deployment.ffn.ep=4",
                       "--format", "json"])


def test_the_fuzz_reaches_past_validation(capsys):
    """A test that cannot fail is a defect: the serve fuzz's base runs, and a hostile value is refused."""
    assert drive(capsys, [*SERVE, "--rate", "4", "--num-requests", "8"]) == 0
    assert drive(capsys, [*SERVE, "--rate", "4", "--num-requests", "8", "--burstiness", "nan"]) == 2
    assert Path(REPO_ROOT / "configs" / "serve-llama-8b-h100.yaml").is_file()
