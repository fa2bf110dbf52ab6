"""Hostile input: the serving, validation, engine-card and checkpoint surfaces.
Each case of the issue, first reproduced, now ends in a correct number or one clear message with
exit 1 (cannot run) or 2 (bad input), never 3 and never a traceback."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, shared_reference
from test_hostile_cli import one_line_error as one_line

from infersim.cli.main import main

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")

#: lines of a bundled model card that name things its HF config does not hold
HAND_WRITTEN = ("aliases:", "checkpoint:", "quantized_checkpoints:")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusing an argument (one line: infersim.cli.main.OneLineParser)
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


# ---- crashes -------------------------------------------------------------------------------------


def test_lognormal_std_of_1e300_is_the_number_rule_not_an_overflow(capsys):
    code, _, err = run(capsys, *SERVE, "--rate", "1", "--num-requests", "5",
                       "--isl", "{dist: lognormal, mean: 100, std: 1.0e+300}")
    assert code == 2
    one_line(err, "field 'std'", "out of range")
    # the largest std the rule lets through is drawn without overflow, and what it does is announced
    code, out, err = run(capsys, *SERVE, "--rate", "1", "--num-requests", "5", "--format", "json",
                         "--isl", "{dist: lognormal, mean: 100, std: 1.0e+40}")
    assert code == 0, err
    summary = json.loads(out)
    assert any("isl: realised mean" in n for n in summary["notes"])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_binary_trace_is_one_message(tmp_path, capsys, suffix):
    path = tmp_path / f"trace{suffix}"
    path.write_bytes(b"\xff\xfe\x00\x9c binary \x00\x01\n")
    code, _, err = run(capsys, *SERVE, "--trace", str(path))
    assert code == 2
    one_line(err, str(path), "not a UTF-8 text file")


def test_import_infersim_of_an_empty_table_is_one_message(tmp_path, capsys):
    (tmp_path / "src" / "gemm" / "h20").mkdir(parents=True)
    (tmp_path / "src" / "gemm" / "h20" / "data.csv").write_text("")
    code, _, err = run(capsys, "mfu", "import-infersim", str(tmp_path / "src"), "--out", str(tmp_path / "out"))
    assert code == 2
    one_line(err, "data.csv", "no data rows")


def test_plot_of_a_string_number_or_a_binary_file_is_one_message(tmp_path, capsys):
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--format", "json")
    data = json.loads(out)
    data["decode"]["tpot_ms"] = "fast"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "plot", str(path), "--out", str(tmp_path / "x.png"))
    assert code == 2
    one_line(err, "field 'decode.tpot_ms'", "expected a finite number")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff")
    code, _, err = run(capsys, "plot", str(binary), "--out", str(tmp_path / "y.png"))
    assert code == 2
    one_line(err, "not a text file")


# ---- trace replay ----------------------------------------------------------------------------------


def _trace(path: Path, rows: int, start: float = 0.0, gap: float = 0.5) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{start + gap * i},{100 + i},{5 + i % 7}\n" for i in range(rows)))
    return path


def test_a_trace_replays_every_row_and_a_cut_is_announced(tmp_path, capsys):
    path = _trace(tmp_path / "t.csv", 1500)
    code, out, _ = run(capsys, *SERVE, "--trace", str(path), "--format", "json")
    summary = json.loads(out)
    assert code == 0 and summary["completed"] == 1500 and "notes" not in summary  # the old default cut it to 1000
    code, out, _ = run(capsys, *SERVE, "--trace", str(path), "--num-requests", "400")
    assert code == 0 and "load:        400 requests, trace replay" in out
    assert "NOTES" in out and "replaying the first 400 of its 1,500 rows by arrival time" in out
    assert "1,100 rows dropped" in out


def test_a_trace_is_read_once_front_to_back(tmp_path, capsys):
    """A directory is named so; a pipe (read once, never rewound) replays like the file."""
    code, _, err = run(capsys, *SERVE, "--trace", str(tmp_path))
    assert code == 2
    one_line(err, "is a directory")
    path = _trace(tmp_path / "t.csv", 30)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, path.read_bytes())
    os.close(write_fd)
    try:
        code, piped, _ = run(capsys, *SERVE, "--trace", f"/dev/fd/{read_fd}", "--format", "json")
    finally:
        os.close(read_fd)
    code, plain, _ = run(capsys, *SERVE, "--trace", str(path), "--format", "json")
    assert json.loads(piped)["mean_e2el_ms"] == json.loads(plain)["mean_e2el_ms"] and json.loads(plain)["completed"] == 30


def test_trace_rows_are_held_as_typed_columns(tmp_path):
    from infersim.serve.trace_replay import read_trace

    path = _trace(tmp_path / "big.csv", 20_000)
    tracemalloc.start()
    try:
        rows = read_trace(path)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 20_000 and rows.order is None  # already in order: no index kept
    assert held < 20_000 * 60  # five 8-byte columns a row (a dict per row was ~1 KB)


def test_trace_cells_go_through_the_number_rule(tmp_path, capsys):
    cases = {
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1e300,10,5\n": "out of range",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\nnan,10,5\n": "must be a finite number",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,1e300,5\n": "too large",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,10.5,5\n": "not a whole number of tokens",
        # an Azure date-time's fraction is digits: '.5e3' is not 500 s
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5e3,10,5\n": "neither seconds nor a date-time",
    }
    for body, problem in cases.items():
        path = tmp_path / "t.csv"
        path.write_text(body)
        code, _, err = run(capsys, *SERVE, "--trace", str(path))
        assert code == 2, body
        one_line(err, "column", problem)


def test_extreme_times_give_a_number_or_one_message(tmp_path, capsys):
    """Arrivals spanning more than the float64 clock resolves (2^53 us) would print 0.00 ms."""
    code, _, err = run(capsys, *SERVE, "--rate", "1e-15", "--num-requests", "20")
    assert code == 2
    one_line(err, "spans", "beyond the 9.01e+09 s")
    code, _, err = run(capsys, *SERVE, "--rate", "1e-300")
    assert code == 2
    one_line(err, "--rate", "out of range")
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,10\n1e30,100,10\n")
    code, _, err = run(capsys, *SERVE, "--trace", str(path))
    assert code == 2
    one_line(err, "spans 1e+30 s")
    # absolute times far from zero are relative to the first row: latencies are unchanged
    near = _trace(tmp_path / "near.csv", 4, 0.0, 100.0)
    far = _trace(tmp_path / "far.csv", 4, 1.7e9, 100.0)  # Unix-epoch timestamps
    code, a, _ = run(capsys, *SERVE, "--trace", str(near), "--format", "json")
    code, b, _ = run(capsys, *SERVE, "--trace", str(far), "--format", "json")
    assert json.loads(a)["mean_ttft_ms"] > 0
    assert json.loads(b)["mean_ttft_ms"] == pytest.approx(json.loads(a)["mean_ttft_ms"], rel=1e-6)


# ---- serving: bounds and O(1) memory per request ------------------------------------------------------


@pytest.mark.parametrize("args, parts", [
    (["--rate", "2", "--disaggregate", "1000000P1D"], ("1,000,000", "at most 1,000 engine instances")),
    (["--rate", "2", "--replicas", "2", "--disaggregate", "1P1D"], ("replicas 2 with disaggregate",)),
    (["--rate", "2", "--num-requests", "1e8"], ("100,000,000", "at most 10,000,000 requests")),
    (["--rate-sweep", "1:1e12:1e-12"], ("1e+24 rates", "at most 1,000")),
    (["--rate", "2", "--slo", "ttft=2"], ("ttft=2 needs a unit",)),
    (["--rate", "2", "--slo", "ttft=2s,tpot=infms"], ("must be a finite number",)),
    (["--rate", "2", "--burstiness", "nan"], ("--burstiness", "finite")),
    (["--concurrency", "2.5"], ("--concurrency", "whole number")),
])
def test_unbounded_or_ambiguous_serving_options_are_one_line(capsys, args, parts):
    start = time.process_time()
    code, _, err = run(capsys, *SERVE, *args)
    assert code == 2 and time.process_time() - start < 5
    one_line(err, *parts)


def test_a_request_that_does_not_fit_is_cannot_run(capsys):
    # vLLM: SGLang rejects such a prompt on arrival for its KV pool (tests/test_serve_kv_pool.py)
    code, _, err = run(capsys, *SERVE, "--engine", "vllm", "--rate", "2", "--num-requests", "3", "--isl", "100000000",
                       "--max-model-len", "200000000")
    assert code == 1
    one_line(err, "request 0", "do not fit")


def test_more_instances_than_requests_are_not_built(capsys):
    code, out, _ = run(capsys, *SERVE, "--rate", "2", "--num-requests", "5", "--replicas", "1000", "--format", "json")
    summary = json.loads(out)
    assert code == 0 and summary["num_gpus"] == 1000 and summary["pools"][0]["instances"] == 1000
    assert summary["completed"] == 5


def test_finished_requests_leave_only_their_latencies():
    from infersim.run.config import load_run_config
    from infersim.serve.options import parse_options
    from infersim.serve.simulate import simulate_serving_run

    config = load_run_config("serve-llama-8b-h100.yaml")

    def held(count: int) -> int:
        tracemalloc.start()
        try:
            result = simulate_serving_run(config, parse_options({"mode": "poisson", "rate": 40.0, "num_requests": count,
                                                                 "isl": 200, "osl": 20}), keep_records=False)
            current, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(result.outcomes) == count and result.records == []
        return current

    per_request = (held(3000) - held(1000)) / 2000
    assert per_request < 250  # 32 bytes of latencies + ~16 per inter-token gap sample (was ~850 bytes of objects)


def test_requests_fed_one_at_a_time_take_the_same_steps_as_all_at_once():
    """_feed gives each instance only its next arrival; the steps equal those of every request given
    up front, as the scheduler looks no further ahead than the next arrival."""
    from infersim.run.config import load_run_config
    from infersim.serve.scheduler import RequestState
    from infersim.serve.arrivals import build_requests
    from infersim.serve.options import parse_options
    from infersim.serve.simulate import _feed, _pool

    config = load_run_config("serve-llama-8b-h100.yaml")
    opts = parse_options({"mode": "poisson", "rate": 30.0, "num_requests": 400, "replicas": 2,
                          "isl": {"dist": "lognormal", "mean": 800, "std": 400}, "osl": {"dist": "uniform", "min": 2,
                                                                                         "max": 300}})
    arrivals = build_requests(config, opts)
    finish = {}
    for how in ("lazily", "up front"):
        pool = _pool("colocated", config, 2, opts, arrivals.mean_isl, arrivals.mean_osl, arrivals.count)
        done: dict[int, tuple[float, float]] = {}
        for inst in pool.instances:
            inst.sink = lambda r, done=done: done.__setitem__(r.req.id, (r.first_token_s, r.finish_s))
        states = [RequestState(r) for r in arrivals.requests()]
        if how == "lazily":
            _feed(pool.instances, ((i % 2, st) for i, st in enumerate(states)))
        else:
            for i, st in enumerate(states):
                pool.instances[i % 2].add(st)
            for inst in pool.instances:
                inst.run()
        finish[how] = done
    assert finish["lazily"] == finish["up front"]


def test_lengths_clipped_far_from_the_asked_mean_are_announced(capsys):
    code, out, _ = run(capsys, *SERVE, "--rate", "1", "--num-requests", "200",
                       "--isl", "{dist: lognormal, mean: 1000, std: 1.0e+6}")
    assert code == 0
    note = next(line for line in out.splitlines() if "realised mean" in line)
    assert "lognormal distribution's mean is 1,000" in note and "fell below min 1 and were raised to it" in note


# ---- engine cards ----------------------------------------------------------------------------------


def _engine(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((REPO_ROOT / "engines" / "sglang-0.5.yaml").read_text())
    edit(data)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_capture_range_of_1e12_sizes_is_never_listed(tmp_path, capsys):
    def huge(data):
        data["overheads"]["cuda_graph_batch_sizes"] = [{"start": 1, "stop": 10**12, "step": 1}]
        data["overheads"]["cuda_graph_max_batch"] = [{"min_gpu_bytes": 0, "value": 10**12}]
    path = _engine(tmp_path, huge)
    start = time.process_time()
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"engine={path}", "--format", "json")
    assert code == 0, err
    assert time.process_time() - start < 10
    decode = json.loads(out)["decode"]
    assert decode["graph_padded_batch"] == decode["batch_per_gpu"] == 119  # every size captured: no padding


def test_next_captured_size_matches_listing_every_size():
    from infersim.cards.engine import _next_captured
    from infersim.run.config import load_engine_card

    for name in ("sglang", "vllm", "trtllm"):
        ranges = load_engine_card(name)[0].overheads.cuda_graph_batch_sizes
        sizes = sorted({s for r in ranges for s in range(r.start, r.stop + 1, r.step)})
        for batch in range(1, (sizes[-1] if sizes else 10) + 3):
            expected = next((s for s in sizes if s >= batch), 0)
            assert _next_captured(ranges, batch) == expected, (name, batch)


@pytest.mark.parametrize("edit, parts", [
    (lambda d: d["overheads"].__setitem__("cuda_graph_batch_sizes", [{"start": 512, "stop": 1, "step": 8}]),
     ("cuda_graph_batch_sizes[0]", "start is above stop")),
    (lambda d: d.__setitem__("fused_operations", ["rope_kv_stor"]),
     ("fused_operations[0]", "did you mean rope_kv_store")),
    (lambda d: d["scheduler"].__setitem__("chunked_prefill_tokens", [{"min_gpu_bytes": 200e9, "value": 8192}]),
     ("scheduler.chunked_prefill_tokens", "no tier covers GPUs below 2e+11 bytes")),
])
def test_engine_card_mistakes_are_refused_on_load(tmp_path, capsys, edit, parts):
    path = _engine(tmp_path, edit)
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"engine={path}")
    assert code == 2
    one_line(err, str(path), *parts)


def test_every_plan_operation_is_a_known_name():
    from infersim.run.config import config_from_mapping
    from infersim.cards.categories import is_operation_name
    from infersim.run.simulate import simulate

    names = set()
    for model in sorted(p.stem for p in (REPO_ROOT / "models").glob("*.yaml")):
        for dep in ({"num_gpus": 8, "attention": {"tp": 8}, "ffn": {"tp": 8}},
                    {"num_gpus": 8, "attention": {"tp": 2, "dp": 4}, "ffn": {"tp": 1, "ep": 8}, "overlap": "two-batch",
                     "lm_head": "gathered"}):
            run_config = {"model": model, "hardware": "b200", "deployment": dep, "mfu_tables": "none",
                          "workload": {"isl": 2048, "osl": 64, "decode_batch_per_gpu": 8}}
            try:
                result = simulate(config_from_mapping(run_config, "t"))
            except Exception:  # noqa: BLE001 - a layout this model cannot take
                continue
            names |= {op.name for stage in (result.prefill, result.decode) for op in stage.operations}
    assert {"rope_kv_store", "mla_norms_rope_kv_store", "gdn_recurrent", "experts_up"} <= names
    assert all(is_operation_name(n) for n in names), sorted(n for n in names if not is_operation_name(n))


def test_redundant_experts_past_a_copy_on_every_rank_are_refused_before_placement(capsys):
    start = time.process_time()
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.moe.load_balance=eplb",
                       "--set", "deployment.moe.redundant_experts=999999999996")
    assert code == 2 and time.process_time() - start < 5
    one_line(err, "field 'deployment.moe.redundant_experts'", "more than 384 = 128 experts x (EP 4 - 1)")


# ---- validate ----------------------------------------------------------------------------------------


def _reference(tmp_path: Path, **point) -> Path:
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": [{"id": "sgl-h20-decode-base", "source": "ANT", **point}]}))
    return path


def test_validate_measured_values_go_through_the_rule(tmp_path, capsys):
    path = _reference(tmp_path, value=1e300, unit="tok/s/GPU")
    code, _, err = run(capsys, "validate", "--reference", str(path))
    assert code == 2
    one_line(err, "sgl-h20-decode-base", "value", "out of range")


def test_validate_checks_each_points_unit_against_the_predicted_metric(tmp_path, capsys):
    path = _reference(tmp_path, value=40.0, unit="ms")
    code, _, err = run(capsys, "validate", "--reference", str(path))
    assert code == 2
    one_line(err, "sgl-h20-decode-base.unit", "measured in ms", "'decode.tgs' predicts tok/s")
    path = _reference(tmp_path, value=714, unit="")
    code, _, err = run(capsys, "validate", "--reference", str(path))
    assert code == 2
    one_line(err, "names no unit")
    from infersim.validate.units import unit_families

    assert unit_families("tok/s (per GPU)") == {"tok/s"} and unit_families("us, GB/s") == {"us", "GB/s"}
    assert unit_families("GB/s (NVLink if intranode else RDMA)") == {"GB/s"}


# ---- mfu import-infersim ---------------------------------------------------------------------------------


def test_import_infersim_refuses_an_efficiency_the_loaders_refuse(tmp_path, capsys):
    import shutil

    source = tmp_path / "published"
    shutil.copytree(shared_reference("infersim_bench_data"), source)
    table = source / "gemm" / "h20" / "data.csv"
    table.chmod(0o644)
    lines = table.read_text().splitlines()
    cells = lines[2].split(",")
    cells[3] = str(float(cells[3]) / 1000)  # a latency in ms written as us
    lines[2] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "mfu", "import-infersim", str(source), "--out", str(tmp_path / "out"))
    assert code == 2 and not (tmp_path / "out" / "h20").exists()
    one_line(err, f"{table}:3", "field 'latency_us'", "implies efficiency", "at most 1.25")


# ---- the checkpoint's quantisation ------------------------------------------------------------------------

BASE = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "intermediate_size": 12288,
        "torch_dtype": "bfloat16"}
MOE = {**BASE, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}


def _import(tmp_path: Path, config: dict) -> dict:
    from infersim.cards.hf_import import card_from_hf_file

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return card_from_hf_file(path, "m").get("quantization")


@pytest.mark.parametrize("config, expected", [
    ({**BASE, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}},
     {"method": "gptq", "weights": "int4", "expert_weights": "int4", "group_size": 128}),
    ({**BASE, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}},
     {"method": "awq", "weights": "int4", "group_size": 128}),
    ({**MOE, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "mlp.gate"]}},
     {"method": "fp8", "weights": "fp8", "expert_weights": "fp8", "activations": "fp8", "group_size": 16384}),
    ({**MOE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}},
     # the experts' NVFP4; attention, the only other linear weights of this MoE model, kept bf16
     {"method": "modelopt", "weights": "bf16", "expert_weights": "fp4", "activations": "fp4", "group_size": 16}),
    ({**MOE, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}},
     {"method": "mxfp4", "weights": "bf16", "expert_weights": "fp4", "group_size": 32}),
    ({**BASE, "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                      "config_groups": {"group_0": {"targets": ["Linear"],
                                                                    "weights": {"num_bits": 8, "type": "float"},
                                                                    "input_activations": {"num_bits": 8, "type": "float"}}},
                                      "ignore": ["lm_head"]}},
     {"method": "compressed-tensors", "weights": "fp8", "activations": "fp8"}),
    ({**BASE, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     {"method": "bitsandbytes", "weights": "int4", "detail": "bitsandbytes fp4 (bnb_4bit_quant_type not stated: "
      "transformers' default) 4-bit, weight-only (dequantised to bf16 for each GEMM)"}),
    ({**BASE, "quantization_config": {"quant_method": "bitsandbytes", "bnb_4bit_quant_type": "nf4"}},
     {"method": "bitsandbytes", "weights": "int4", "detail": "bitsandbytes nf4 4-bit, weight-only (dequantised to "
      "bf16 for each GEMM)"}),
    ({**BASE, "quantization_config": {"quant_method": "fp8", "ignored_layers": ["model.layers.*.self_attn",
                                                                                  "model.layers.*.mlp"]}},
     {"weights": "bf16", "activations": "fp8"}),  # every linear excluded: stored unquantised
])
def test_import_hf_reads_quantization_config(tmp_path, config, expected):
    quantization = _import(tmp_path, config)
    assert {k: quantization.get(k) for k in expected} == expected, quantization


def test_an_unmodelled_quant_method_is_one_message(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "quantization_config": {"quant_method": "hqq", "nbits": 4}}))
    code, _, err = run(capsys, "cards", "import-hf", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    one_line(err, "quantization_config.quant_method", "'hqq'", "not modelled")


def test_bundled_quantised_cards_are_the_importer_output():
    from infersim.cards.hf_import import card_from_hf_file
    from infersim.cli.cards import card_yaml

    for bundled, reference in (("deepseek-v3", "deepseek_v3_config.json"), ("deepseek-v3.2", "deepseek_v3.2_config.json"),
                               ("gpt-oss-120b", "gpt-oss-120b_config.json")):
        fields = card_from_hf_file(shared_reference("hf_configs", reference), bundled)
        assert fields["quantization"]["method"] in ("fp8", "mxfp4")
        # `aliases` and the checkpoints are the hand-written lines of a bundled card (other names of the model
        # and of its published weights, not in its config)
        lines = (REPO_ROOT / "models" / f"{bundled}.yaml").read_text().splitlines(keepends=True)
        assert "".join(line for line in lines if not line.startswith(HAND_WRITTEN)) == card_yaml(fields)


def _json_run(capsys, *sets: str) -> dict:
    code, out, err = run(capsys, "--config", "deepseek-v3.2.yaml", "--format", "json", *sets)
    assert code in (0, 1), err
    return json.loads(out)


def test_a_run_prices_the_checkpoint_unless_the_run_config_says_otherwise(capsys):
    """DeepSeek-V3.2's fp8 checkpoint run with bf16 GEMMs: fp8 weights (weight-only), not bf16 ones."""
    fp8 = _json_run(capsys)
    w8a16 = _json_run(capsys, "--set", "deployment.precision.gemm=bf16")
    bf16 = _json_run(capsys, "--set", "deployment.precision.gemm=bf16", "--set", "deployment.precision.weights=bf16")
    assert w8a16["memory"]["weights_gb"] == pytest.approx(fp8["memory"]["weights_gb"])
    assert bf16["memory"]["weights_gb"] > 1.9 * w8a16["memory"]["weights_gb"] - 3  # embeddings stay bf16
    assert w8a16["fits"] and w8a16["decode"]["tpot_ms"] < bf16["decode"]["tpot_ms"]
    origin = w8a16["weights_format"]
    assert (origin["weights"], origin["weights_from"], origin["gemm"], origin["gemm_from"]) == (
        "fp8", "checkpoint", "bf16", "run config")
    assert origin["checkpoint"]["detail"].startswith("fp8 e4m3, 128x128 blocks")
    assert bf16["weights_format"]["weights_from"] == "run config; the checkpoint stores fp8"
    code, out, _ = run(capsys, "--config", "deepseek-v3.2.yaml", "--set", "deployment.precision.gemm=bf16")
    assert "  weights:    fp8 from the checkpoint; GEMM inputs bf16 (run config); checkpoint: fp8 e4m3" in out


def test_the_checkpoint_sets_gemm_inputs_where_the_gpu_has_the_rate(capsys, tmp_path):
    """An fp8 W8A8 checkpoint: fp8 GEMMs on a GPU with fp8 tensor cores, bf16 (weight-only) on an A100."""
    from infersim.run.config import config_from_mapping

    def precision(hardware: str) -> tuple[str, str]:
        config = config_from_mapping({"model": "deepseek-v3", "hardware": hardware, "mfu_tables": "none",
                                      "deployment": {"num_gpus": 8, "attention": {"tp": 1, "dp": 8},
                                                     "ffn": {"tp": 1, "ep": 8}},
                                      "workload": {"isl": 1024, "osl": 128}}, "t")
        return config.deployment.precision.gemm, config.deployment.precision.weight_dtype

    assert precision("h200") == ("fp8", "fp8")
    assert precision("a100-sxm-80g") == ("bf16", "fp8")


def test_a_gptq_checkpoint_is_priced_int4(tmp_path, capsys):
    path = tmp_path / "qwen3-8b-gptq.json"
    path.write_text(json.dumps({**BASE, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}))
    plain = tmp_path / "qwen3-8b.json"
    plain.write_text(json.dumps(BASE))
    sets = ("--set", "deployment.num_gpus=1", "--set", "deployment.attention.dp=1", "--set", "deployment.ffn.ep=1",
            "--format", "json")
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"model={path}", *sets)
    gptq = json.loads(out)
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"model={plain}", *sets)
    bf16 = json.loads(out)
    assert gptq["weights_format"]["weights"] == "int4" and gptq["weights_format"]["weights_from"] == "checkpoint"
    assert gptq["weights_format"]["gemm"] == "bf16"  # weight-only: inputs stay bf16
    embedding = (151936 * 4096 + 2 * 4096 * 36) * 2 / 1e9  # tied with the LM head; norms: bf16 either way
    linear_bf16 = bf16["memory"]["weights_gb"] - embedding
    linear_int4 = gptq["memory"]["weights_gb"] - embedding
    assert linear_int4 == pytest.approx(linear_bf16 / 4, rel=0.01)


def test_a_sweep_derives_each_variants_weights_from_its_own_checkpoint(capsys):
    from infersim.sweep import SweepSpec, load_base, parse_grid
    from infersim.sweep.variants import Deriver as Variants

    spec = SweepSpec(load_base("deepseek-v3.2.yaml", ["deployment.precision.gemm=bf16"]),
                     tuple(parse_grid(["model=deepseek-v3.2,qwen3-235b-a22b"])))
    variants = Variants(spec.base, spec.axes)
    weights = [variants.complete(variants.deployment((m,)), variants.model((m,)), variants.hardware((m,))
                                 ).precision.weight_dtype for m in ("deepseek-v3.2", "qwen3-235b-a22b")]
    assert weights == ["fp8", "bf16"]


# ---- the disk cache --------------------------------------------------------------------------------------


def test_the_disk_cache_is_pruned_oldest_first_under_its_cap(tmp_path, monkeypatch):
    from infersim.base import diskcache

    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("INFERSIM_CACHE_MAX_MB", "1")
    old = [f"yaml-{i:016x}.entry" for i in range(8)]
    for i, name in enumerate(old):
        path = tmp_path / name
        path.write_bytes(b"x" * 200_000)
        os.utime(path, (1000.0 + i, 1000.0 + i))
    stale = tmp_path / f".tmp-{'0' * 32}"  # a writer that died
    stale.write_bytes(b"x")
    os.utime(stale, (1000.0, 1000.0))
    new = "yaml-ffffffffffffffff.entry"
    diskcache.write_json(new, "yaml", {"kept": True})
    left = {p.name for p in tmp_path.iterdir()}
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 0.75e6 and new in left and not stale.exists()
    kept = sorted(left - {new})
    assert kept == old[8 - len(kept):] and len(kept) == 3  # the oldest went first
    assert diskcache.read_json(new, "yaml") == {"kept": True}
    monkeypatch.setenv("INFERSIM_CACHE", "off")
    assert diskcache.cache_dir() is None and diskcache.prune() == []
