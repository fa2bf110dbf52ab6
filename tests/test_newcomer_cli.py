"""A newcomer's three questions asked with one command each: direct flags instead of a
config file, names that resolve forgivingly, layouts that follow the model, the server-wide view,
vLLM/SGLang habits, and benchmark results held against the serving simulator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import COMMANDS_RUN_ONCE, REPO_ROOT

from infersim.cards.registry import engine_family, resolve_name
from cli_helpers import run_json, error_of

from infersim.cli.main import main
from infersim.run.config import load_run_config
from infersim.base.errors import InferSimError
from infersim.run.flags import RunFlags


# plain engine names mean the newest bundled card of that engine (cards/registry.py select_engine)
NEWEST_VLLM = engine_family("vllm")[-1].stem
VLLM_VERSION = engine_family("vllm")[-1].version
NEWEST_SGLANG = engine_family("sglang")[-1].stem


# ---------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize("kind, name, card", [
    ("hardware", "h100", "h100-sxm"), ("hardware", "H100", "h100-sxm"), ("hardware", "H100 SXM5", "h100-sxm"),
    ("hardware", "a100", "a100-sxm-80g"), ("hardware", "A6000", "rtx-a6000"),
    ("engines", "vLLM", NEWEST_VLLM), ("engines", "SGLang", NEWEST_SGLANG), ("engines", "TensorRT-LLM", "trtllm"),
    ("engines", "trt-llm", "trtllm"), ("engines", "tensorrt_llm", "trtllm"), ("engines", "sglang-oai", NEWEST_SGLANG),
    ("models", "Qwen/Qwen3-8B", "qwen3-8b"), ("models", "meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
    ("models", "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("models", "meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
    ("models", "Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("models", "deepseek-ai/DeepSeek-R1", "deepseek-v3"), ("models", "deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-v3.2"),
    ("models", "meta-llama/Llama-4-Maverick-17B-128E-Instruct", "llama-4-maverick"),
])
def test_names_resolve_forgivingly_and_say_so(kind: str, name: str, card: str) -> None:
    path, note = resolve_name(name, kind)
    assert path.stem == card
    assert note.startswith(f"{kind.rstrip('s') if kind != 'hardware' else 'hardware'} '{name}' -> {card} (")


def test_exact_names_and_paths_make_no_note() -> None:
    assert resolve_name("h100-sxm", "hardware")[1] == ""
    assert resolve_name(str(REPO_ROOT / "models" / "qwen3-8b.yaml"), "models")[1] == ""


def test_an_unknown_model_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "--model", "acme/NoSuchModel-7B", "--hardware", "h100")
    assert "model 'acme/NoSuchModel-7B' not found" in err and "pass the path of its HF config.json" in err
    # "h10" is no GPU: a prefix must end at a dash of the card's name (h100 -> h100-sxm)
    assert "hardware 'h10' not found" in error_of(capsys, "--model", "qwen3-8b", "--hardware", "h10")


def test_cards_list_names_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cards", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    engines = next(line for line in lines if line.startswith("engines"))
    listed = engines.split(": ", 1)[1].split(", ")
    assert {"deepspeed-zero-inference", "huggingface", "huggingface-compiled", "trtllm", "sglang-0.5",
            NEWEST_SGLANG, "vllm-0.11", "vllm-0.15", NEWEST_VLLM} <= set(listed) and listed == sorted(listed)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from infersim import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"infersim {__version__}\n"


# ---------------------------------------------------------------------------------------------
# A config.json becomes a card named after its model


def _hf_config(path: Path, name_or_path: str | None = None) -> Path:
    data = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000, "intermediate_size": 1536}
    if name_or_path is not None:
        data["_name_or_path"] = name_or_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("where, name_or_path, card", [
    ("Tiny-Llama-1B/config.json", None, "tiny-llama-1b"),  # its directory
    ("snapshot/config.json", "acme/Tiny-Llama-2B", "tiny-llama-2b"),  # its _name_or_path
    ("hub/models--acme--Tiny-Llama-3B/snapshots/0123abc/config.json", None, "tiny-llama-3b"),  # the HF cache
    ("acme_config.json", "acme/Other", "acme"),  # a file named for its model keeps that name
])
def test_a_config_json_is_named_after_its_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], where: str,
                                                name_or_path: str | None, card: str) -> None:
    config = _hf_config(tmp_path / where, name_or_path)
    monkeypatch.chdir(tmp_path)
    data = run_json(capsys, "--model", str(config), "--hardware", "h100")
    assert data["model"] == card
    assert main(["cards", "import-hf", str(config)]) == 0
    assert capsys.readouterr().out == f"wrote models/{card}.yaml (run it with --model {card})\n"
    assert yaml.safe_load((tmp_path / "models" / f"{card}.yaml").read_text())["name"] == card
    # the card written to ./models is found by its name from this directory
    assert run_json(capsys, "--model", card, "--hardware", "h100")["model"] == card


# ---------------------------------------------------------------------------------------------
# Direct flags and the layout that follows from the model


def test_the_first_question_in_one_command(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--model", "llama-3.1-70b", "--hardware", "h100", "--num-gpus", "8", "--tp", "8",
                    "--engine", "vLLM", "--isl", "2000", "--osl", "500")
    dep = data["deployment"]
    assert (data["model"], data["hardware"], data["engine"]["name"]) == ("llama-3.1-70b", "h100-sxm", "vllm")
    assert (dep["num_gpus"], dep["attention"], dep["ffn"]) == (8, {"tp": 8, "dp": 1}, {"tp": 8, "ep": 1, "dp": 1})
    assert (data["workload"]["isl"], data["workload"]["osl"]) == (2000, 500)
    assert data["notes"] == ["hardware 'h100' -> h100-sxm (an alias of bundled card h100-sxm)",
                             f"engine 'vLLM' -> {NEWEST_VLLM} (the newest bundled vllm card, vllm {VLLM_VERSION})"]
    # the batch left unset is the largest that fits, and the report gives the server's view of it
    batch = data["decode"]["batch_per_gpu"]
    assert batch == data["memory"]["max_batch_per_gpu"] > 1
    server = data["server"]
    assert server["decode_requests"] == 8 * batch and server["requests_per_scheduler"] == 8 * batch
    assert server["decode_tokens_per_s"] == pytest.approx(8 * data["decode"]["tgs"])


def test_the_text_report_shows_names_and_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "llama-3.1-70b", "--hardware", "h100", "--tp", "8", "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "  note:       hardware 'h100' -> h100-sxm (an alias of bundled card h100-sxm)" in out
    decode = out[out.index("DECODE"):].splitlines()
    per_gpu = int(decode[0].split("(")[1].split()[0])
    assert decode[1].startswith(f"  server: {8 * per_gpu:,} requests decoding at once on 8 GPUs, ")
    assert decode[1].endswith(f"one scheduler (attention TP8) runs {8 * per_gpu:,} of them (its max_num_seqs / "
                              "max_running_requests)")


def test_the_failing_examples_of_the_issue_now_run(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--config", "serve-llama-8b-h100.yaml", "--set", "model=llama-3.1-70b",
                    "--set", "deployment.num_gpus=8", "--set", "deployment.attention.tp=8", "--set", "engine=vllm")
    assert data["deployment"]["ffn"] == {"tp": 8, "ep": 1, "dp": 1}  # a dense FFN spans the attention TP group
    assert run_json(capsys, "--config", "qwen3-30b.yaml", "--set", "hardware=h100")["hardware"] == "h100-sxm"
    data = run_json(capsys, "--config", "serve-llama-8b-h100.yaml", "--set", "model=Qwen/Qwen3-8B")
    assert data["model"] == "qwen3-8b" and data["notes"][0].startswith("model 'Qwen/Qwen3-8B' -> qwen3-8b")
    # the README's own variant: the example's batch is now the largest that fits, so it fits
    assert main(["--config", "qwen3-30b.yaml", "--set", "hardware=h800", "--set",
                 "hardware.peak.hbm_bandwidth=4e12"]) == 0
    capsys.readouterr()


def test_an_moe_examples_expert_parallelism_is_dropped_for_a_dense_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--config", "qwen3-30b.yaml", "--model", "llama-3.1-8b")
    assert data["deployment"]["ffn"] == {"tp": 1, "ep": 1, "dp": 4} and data["deployment"]["attention"]["dp"] == 4
    assert "deployment.ffn.ep 4 of the config file dropped: llama-3.1-8b is dense (no experts to spread)" in data["notes"]
    # named on the command line it is checked, not adapted
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--model", "llama-3.1-8b", "--set", "deployment.ffn.ep=4")
    assert "deployment.ffn.ep" in err and "needs an MoE model" in err
    assert error_of(capsys, "--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "2", "--ep", "2") == \
        "infersim: error: --ep 2: expert parallelism needs an MoE model (llama-3.1-8b is dense)"


@pytest.mark.parametrize("flags, gpus, attention, ffn", [
    (["--tp", "8"], 8, {"tp": 8, "dp": 1}, {"tp": 8, "ep": 1, "dp": 1}),  # experts split over the TP group
    (["--tp", "8", "--ep", "8"], 8, {"tp": 8, "dp": 1}, {"tp": 1, "ep": 8, "dp": 1}),
    (["--tp", "8", "--ep", "4"], 8, {"tp": 8, "dp": 1}, {"tp": 2, "ep": 4, "dp": 1}),  # SGLang's moe_tp = tp / ep
    (["--dp-attention", "8", "--ep", "8"], 8, {"tp": 1, "dp": 8}, {"tp": 1, "ep": 8, "dp": 1}),
    (["--dp-attention", "4"], 4, {"tp": 1, "dp": 4}, {"tp": 4, "ep": 1, "dp": 1}),  # vLLM DP without EP
])
def test_layout_flags_on_an_moe_model(capsys: pytest.CaptureFixture[str], flags: list[str], gpus: int,
                                      attention: dict, ffn: dict) -> None:
    data = run_json(capsys, "--model", "qwen3-30b-a3b", "--hardware", "h100", *flags)
    dep = data["deployment"]
    assert (dep["num_gpus"], dep["attention"], dep["ffn"]) == (gpus, attention, ffn)


def test_flags_override_the_config_and_set_overrides_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--config", "qwen3-30b.yaml", "--tp", "2", "--set", "deployment.ffn.ep=2")
    dep = data["deployment"]
    # the config's 4 GPUs are kept (they divide by TP2: attention DP2); its moe_comm goes with its layout
    assert (dep["num_gpus"], dep["attention"], dep["ffn"]["ep"]) == (4, {"tp": 2, "dp": 2}, 2)
    assert any(note.startswith("deployment.moe_comm all-gather of the config file dropped") for note in data["notes"])


def test_gpus_beyond_a_node_fill_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--model", "llama-3.1-405b", "--hardware", "h100", "--tp", "8", "--pp", "2",
                    "--precision", "fp8")
    dep = data["deployment"]
    assert (dep["num_gpus"], dep["num_nodes"], dep["pp"]) == (16, 2, 2)
    assert "deployment.num_nodes 2: 16 GPUs fill 2 h100-sxm nodes of 8" in data["notes"]
    assert dep["precision"]["gemm"] == dep["precision"]["weights"] == "fp8"


def test_without_a_config_the_model_and_hardware_are_needed(capsys: pytest.CaptureFixture[str]) -> None:
    assert error_of(capsys, "--model", "qwen3-8b") == \
        "infersim: error: give --config FILE, or --hardware (e.g. --model llama-3.1-8b --hardware h100)"
    assert "--model and --hardware" in error_of(capsys, "--tp", "2")


def test_load_run_config_takes_the_flags() -> None:
    config = load_run_config(None, (), None, RunFlags(model="qwen3-8b", hardware="h200", tp=2, isl=1000, osl=100))
    assert (config.deployment.num_gpus, config.deployment.attention.tp, config.deployment.ffn.tp) == (2, 2, 2)
    assert (config.workload.isl, config.workload.osl, config.source) == (1000, 100, "command line")


# ---------------------------------------------------------------------------------------------
# DOES NOT FIT names the fix


def test_does_not_fit_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "llama-3.1-70b", "--hardware", "h100"]) == 1
    out = capsys.readouterr().out
    # 141 GB of bf16 weights on one 80 GB H100: with a quarter more for the KV cache, 4 GPUs
    assert "fix: more GPUs, about 4 x h100-sxm (e.g. --num-gpus 4 --tp 4), or fp8 weights (--precision fp8)" in out
    assert main(["--config", "qwen3-30b.yaml", "--set", "hardware=h800", "--batch-per-gpu", "100"]) == 1
    out = capsys.readouterr().out
    assert "at most 91 requests per GPU fit; fix: a batch of at most 91 per GPU (--batch-per-gpu 91, or leave " \
           "the batch unset: the largest that fits)" in out
    assert main(["--config", "qwen3-30b.yaml", "--set", "hardware=h800", "--batch-per-gpu", "91"]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------
# Serving: vLLM / SGLang names, a capped rate, any SLO percentile


def _serve_options(argv: list[str]) -> dict:
    import argparse

    from infersim.serve import cli as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers(dest="command"))
    return serve_cli.options_from_args(parser.parse_args(["serve", *argv]))


def test_serve_takes_the_benchmark_tools_names() -> None:
    ours = _serve_options(["--rate", "8", "--num-requests", "300", "--isl", "1000", "--osl", "200"])
    theirs = _serve_options(["--request-rate", "8", "--num-prompts", "300", "--random-input-len", "1000",
                             "--random-output-len", "200"])
    assert ours == theirs == {"mode": "poisson", "num_requests": 300, "seed": 0, "replicas": 1,
                              "router": "round-robin", "rate": 8.0, "isl": 1000, "osl": 200}
    assert _serve_options(["--max-concurrency", "16"])["concurrency"] == 16
    capped = _serve_options(["--request-rate", "20", "--max-concurrency", "8"])
    assert (capped["mode"], capped["rate"], capped["concurrency"]) == ("poisson", 20.0, 8)
    assert _serve_options(["--max-rate-under-slo", "--slo", "ttft=1s", "--slo-percentile", "99.9"])["percentiles"] == [99.9]


def test_slo_percentile_any_value_between_0_and_100(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _serve_options(["--rate", "4", "--slo-percentile", "100"])
    assert "a percentile is in (0, 100)" in capsys.readouterr().err


def test_a_capped_rate_never_has_more_requests_in_flight() -> None:
    from infersim.serve.api import simulate_serving

    config = load_run_config("serve-llama-8b-h100.yaml")
    summary = simulate_serving(config, {"mode": "poisson", "rate": 50.0, "concurrency": 4, "num_requests": 80,
                                        "isl": 500, "osl": 50, "requests": True, "percentiles": [95]})
    events = sorted([(r["arrival_s"], 1) for r in summary["requests"]] + [(r["finish_s"], -1) for r in summary["requests"]],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _t, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 4  # 50 req/s far beyond what 4 slots serve: the cap binds, and holds
    assert summary["max_concurrency"] == 4 and summary["request_rate"] == 50.0
    assert summary["median_ttft_ms"] <= summary["p95_ttft_ms"] <= summary["p99_ttft_ms"]
    uncapped = simulate_serving(config, {"mode": "poisson", "rate": 50.0, "num_requests": 80, "isl": 500, "osl": 50})
    assert uncapped["request_throughput"] > summary["request_throughput"]


def test_serve_without_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "Qwen/Qwen3-8B", "--hardware", "h100", "--request-rate", "4",
                 "--num-prompts", "40", "--random-input-len", "500", "--random-output-len", "50", "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["run"] == {"model": "qwen3-8b", "hardware": "h100-sxm", "num_gpus": 1, "engine": "sglang 0.5",
                           "title": "qwen3-8b on 1 x h100-sxm, sglang 0.5; Poisson 4 req/s"}
    assert data["completed"] == 40 and data["total_input_tokens"] == 40 * 500
    assert "infersim: note: model 'Qwen/Qwen3-8B' -> qwen3-8b" in captured.err


# ---------------------------------------------------------------------------------------------
# compare --bench-result: a serving benchmark against infersim serve at the same load

VLLM_SAMPLE = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"
SGLANG_SAMPLE = REPO_ROOT / "docs" / "examples" / "sglang-bench-serving-llama-3.1-8b-h100-c32.jsonl"


def test_vllm_bench_serve_result_at_its_rate(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "compare", "--bench-result", str(VLLM_SAMPLE), "--hardware", "h100")
    (result,) = data["results"]
    measured = json.loads(VLLM_SAMPLE.read_text())
    assert (result["kind"], result["backend"], result["model_id"]) == ("vllm_bench_serve", "vllm",
                                                                     "meta-llama/Llama-3.1-8B-Instruct")
    # the same load: Poisson at the file's rate and burstiness, its number of prompts and lengths
    assert result["serve_options"] == {"num_requests": 500, "mode": "poisson", "rate": 8.0, "burstiness": 1.0,
                                       "isl": 1000, "osl": 200}
    assert result["predicted_run"] == f"llama-3.1-8b on 1 x h100-sxm, vllm {VLLM_VERSION}; Poisson 8 req/s"
    metrics = {m["metric"]: m for m in result["metrics"]}
    assert metrics["mean TTFT"]["measured"] == measured["mean_ttft_ms"]
    assert metrics["output throughput"]["measured"] == measured["output_throughput"]
    tpot = metrics["median TPOT"]
    assert tpot["error"] == pytest.approx(tpot["predicted"] / tpot["measured"] - 1)
    # at 8 req/s the server keeps up: what comes out is what goes in, 8 x 200 tokens/s (less the tail)
    assert metrics["output throughput"]["predicted"] == pytest.approx(1600, rel=0.08)
    assert f"engine {NEWEST_VLLM}: the file's backend 'vllm'" in result["notes"]


def test_sglang_bench_serving_result_at_its_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "compare", "--bench-result", str(SGLANG_SAMPLE), "--model", "llama-3.1-8b",
                    "--hardware", "h100", "--engine", "vllm")
    (result,) = data["results"]
    assert result["kind"] == "bench_serving" and result["request_rate"] is None
    assert result["serve_options"] == {"num_requests": 640, "mode": "concurrency", "concurrency": 32,
                                       "isl": 2000, "osl": 500}
    assert result["predicted_run"].startswith(f"llama-3.1-8b on 1 x h100-sxm, vllm {VLLM_VERSION};")  # --engine wins
    assert {m["metric"] for m in result["metrics"]} >= {"mean TTFT", "p99 TPOT", "mean E2E latency",
                                                         "request throughput"}


def test_a_serving_result_needs_the_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "compare", "--bench-result", str(VLLM_SAMPLE))
    assert "a benchmark file does not say which GPUs served it: give --hardware" in err
    assert "give --model or --config" in error_of(capsys, "compare", "--bench-result", str(SGLANG_SAMPLE),
                                                  "--hardware", "h100")


def test_parse_serving_results_of_both_tools() -> None:
    from infersim.serve.bench_result import SGLANG, VLLM, parse_serving_result, serve_options

    vllm = parse_serving_result({**json.loads(VLLM_SAMPLE.read_text()), "request_rate": "inf", "max_concurrency": 16,
                                 "input_lens": [900, 1100], "output_lens": [200, 200], "failed": 3}, "x", 1)
    assert vllm.tool == VLLM and math.isinf(vllm.request_rate) and vllm.max_concurrency == 16
    options, notes = serve_options(vllm)
    assert options["mode"] == "concurrency" and options["isl"] == {"dist": "uniform", "min": 900, "max": 1100}
    assert options["osl"] == 200
    sglang = parse_serving_result(json.loads(SGLANG_SAMPLE.read_text()), "x", 1)
    assert sglang.tool == SGLANG and sglang.measured["mean_e2el_ms"] == 4621.5  # SGLang's mean_e2e_latency_ms
    rate = parse_serving_result({**json.loads(SGLANG_SAMPLE.read_text()), "request_rate": 4.0}, "x", 1)
    options, notes = serve_options(rate)
    assert (options["mode"], options["rate"], options["concurrency"]) == ("poisson", 4.0, 32)
    assert "sglang.bench_serving does not save its burstiness: Poisson arrivals (burstiness 1)" in notes
    with pytest.raises(InferSimError, match="no completed requests"):
        parse_serving_result({**json.loads(SGLANG_SAMPLE.read_text()), "completed": 0}, "x", 1)


# ---------------------------------------------------------------------------------------------
# The other commands take the flags too


def test_sweep_generate_and_roofline_take_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--model", "qwen3-8b", "--hardware", "h100", "--isl", "1000", "--osl", "100",
                 "--grid", "workload.decode_batch_per_gpu=8,16", "--workers", "1", "--out",
                 str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["workload.decode_batch_per_gpu"] for r in rows] == [8, 16] and all(r["fits"] for r in rows)
    capsys.readouterr()
    assert main(["generate", "--model", "opt-30b", "--hardware", "a6000", "--batch", "4", "--prompt-len", "64",
                 "--gen-len", "4", "--offload", "weights", "--engine", "hf", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch"] == 4
    pytest.importorskip("matplotlib")
    assert main(["roofline", "--model", "qwen3-8b", "--hardware", "h100", "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").stat().st_size > 0


@pytest.mark.xdist_group(COMMANDS_RUN_ONCE)
def test_validate_summary_is_the_accuracy_table(commands_run_once) -> None:
    """The README's accuracy command (run once per session, for the README's check as well)."""
    printed, status = commands_run_once.run("python -m infersim validate --summary")
    assert status == 0
    out = printed.splitlines()
    assert out[0].startswith("reference: infersim/validate/public/validation.yaml (shipped)")
    overall = next(line for line in out if line.startswith("overall:"))
    assert overall.startswith("overall: 96 numbers compared, median |error| ")
    table = out[out.index("SUMMARY (error = (predicted - measured) / measured)") + 3:]
    assert table[0].split()[:2] == ["overall", "96"]
    assert not any(line.startswith("deepgemm-") for line in out)  # no per-point rows


def test_the_bench_compare_picture_groups_statistics_of_one_quantity(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from infersim.plot.compare import draw_bench_compare

    data = run_json(capsys, "compare", "--bench-result", str(VLLM_SAMPLE), "--hardware", "h100")
    figure, drawn = draw_bench_compare(data)
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["TTFT", "TPOT", "ITL", "request throughput", "output throughput"]
    ttft = figure.axes[0]
    assert [t.get_text() for t in ttft.get_yticklabels()] == ["mean", "median", "p99"]
    errors = {m["metric"]: m["error"] for m in data["results"][0]["metrics"]}
    assert [t.get_text() for t in ttft.texts] == [f"{100 * errors[k]:+.0f}%" for k in
                                                  ("mean TTFT", "median TTFT", "p99 TTFT")]
    assert f"predicted: llama-3.1-8b on 1 x h100-sxm, vllm {VLLM_VERSION}; Poisson 8 req/s" in figure._suptitle.get_text()
