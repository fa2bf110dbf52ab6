"""The command line end to end, and every kind of bad input: one clear line, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, public_reference, shared_reference
from infersim.cli.main import main


def run_cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    # the checkout under test, whether or not it is also installed
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "infersim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=env)


def test_text_report_end_to_end(tmp_path):
    # from another directory: bundled example configs resolve by name
    proc = run_cli("--config", "qwen3-30b.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "qwen3-30b-a3b on h20" in out
    assert "PREFILL  step" in out and "DECODE   TPOT" in out
    # the step holds 4 prompts per GPU: one prompt alone is the TTFT a benchmark approaches at low load
    assert "single-request TTFT" in out and "prefills 4 prompts per attention group together" in out
    assert "moe_experts" in out and "attn_core" in out
    assert "largest decode batch that fits" in out


def test_json_report_has_the_documented_shape():
    proc = run_cli("--config", "qwen3-30b.yaml", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"model", "hardware", "deployment", "workload", "prefill", "decode", "memory", "warnings"} <= set(data)
    assert data["model"] == "qwen3-30b-a3b" and data["hardware"] == "h20"
    # the config leaves the batch to 'max': the largest whose KV cache (ISL + OSL = 6,144 tokens of
    # 98,304 bytes each per GPU) fits in the KV space; SGLang's running-request cap is far above it
    fit = int(data["memory"]["kv_capacity_gb"] * 1e9 // (6144 * 98304))
    assert data["decode"]["batch_per_gpu"] == data["memory"]["max_batch_per_gpu"] == fit == 119
    assert data["decode"]["tgs"] == pytest.approx(119 / (data["decode"]["tpot_ms"] / 1e3))
    assert data["server"]["decode_requests"] == 4 * 119 and data["server"]["requests_per_scheduler"] == 119
    assert data["server"]["decode_tokens_per_s"] == pytest.approx(4 * data["decode"]["tgs"])
    assert data["prefill"]["tgs"] == pytest.approx(16384 / (data["prefill"]["ttft_ms"] / 1e3))
    for stage in ("prefill", "decode"):
        modules = data[stage]["modules"]
        assert {"name", "time_us", "flops", "bytes", "bound", "source"} <= set(modules[0])
        assert {m["bound"] for m in modules} <= {"compute", "memory", "comm", "overhead"}
        assert {m["source"] for m in modules} <= {"table", "roofline", "card"}
        assert sum(m["time_us"] for m in modules) >= data[stage].get("ttft_ms", data[stage].get("tpot_ms")) * 1e3 * 0.999
    assert set(data["memory"]) >= {"weights_gb", "kv_bytes_per_token", "kv_capacity_gb", "max_batch_per_gpu"}
    assert data["memory"]["kv_bytes_per_token"] == 48 * 2 * 4 * 128 * 2
    assert any("roofline" in w for w in data["warnings"])


def test_set_overrides_reach_config_and_cards(capsys):
    assert main(["--config", "qwen3-30b.yaml", "--format", "json", "--set", "workload.decode_batch_per_gpu=10",
                 "--set", "model.num_key_value_heads=8"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decode"]["batch_per_gpu"] == 10
    assert data["memory"]["kv_bytes_per_token"] == 48 * 2 * 8 * 128 * 2


def test_hf_config_accepted_as_model(capsys, tmp_path):
    config = shared_reference("hf_configs", "qwen3-8B_config.json")
    assert main(["--config", "qwen3-30b.yaml", "--format", "json", "--set", f"model={config}",
                 "--set", "deployment.ffn.ep=1", "--set", "deployment.moe_comm=all-to-all", "--set", "workload.decode_batch_per_gpu=64"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "qwen3-8b"


def test_import_hf_writes_a_loadable_card_for_every_reference_config(tmp_path):
    configs = sorted(shared_reference("hf_configs").glob("*.json"))
    assert main(["cards", "import-hf", *map(str, configs), "--out", str(tmp_path)]) == 0
    from infersim.run.config import load_model_card

    for path in tmp_path.glob("*.yaml"):
        card, _ = load_model_card(str(path))
        assert card.hidden_size > 0
    assert len(list(tmp_path.glob("*.yaml"))) == len(configs)
    deepseek, _ = load_model_card(str(tmp_path / "deepseek_v3.yaml"))
    assert (deepseek.num_experts, deepseek.kv_lora_rank, deepseek.first_k_dense_replace) == (256, 512, 3)
    opt, _ = load_model_card(str(tmp_path / "opt-30b.yaml"))
    assert (opt.ffn_activation, opt.intermediate_size, opt.num_key_value_heads) == ("relu", 28672, 56)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = yaml.safe_load((REPO_ROOT / "configs" / "qwen3-30b.yaml").read_text())


def bad_config(tmp_path: Path, change) -> str:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    change(data)
    return str(write(tmp_path, "bad.yaml", yaml.safe_dump(data)))


def error_of(capsys, *args: str) -> str:
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_missing_file(capsys, tmp_path):
    err = error_of(capsys, "--config", str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in err and "not found" in err


def test_malformed_yaml(capsys, tmp_path):
    path = write(tmp_path, "broken.yaml", "model: [unclosed\nhardware: h20\n")
    err = error_of(capsys, "--config", str(path))
    assert "broken.yaml" in err and "malformed YAML" in err and "line" in err


def test_unknown_key(capsys, tmp_path):
    err = error_of(capsys, "--config", bad_config(tmp_path, lambda d: d["deployment"].update(tpp=2)))
    assert "bad.yaml" in err and "deployment.tpp" in err and "unknown key" in err


def test_wrong_type(capsys, tmp_path):
    err = error_of(capsys, "--config", bad_config(tmp_path, lambda d: d["workload"].update(isl="long")))
    assert "workload.isl" in err and "'long'" in err and "whole number" in err


@pytest.mark.parametrize("value", [0, -5])
def test_zero_or_negative_sizes(capsys, tmp_path, value):
    err = error_of(capsys, "--config", bad_config(tmp_path, lambda d: d["workload"].update(osl=value)))
    assert "workload.osl" in err and str(value) in err and "greater than 0" in err


def test_bad_model_card_value(capsys):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "model.hidden_size=-1")
    assert "qwen3-30b-a3b.yaml" in err and "hidden_size" in err and "-1" in err


def test_heads_not_divisible_by_tp(capsys, tmp_path):
    err = error_of(capsys, "--config", bad_config(tmp_path, lambda d: d["deployment"].update(
        num_gpus=3, attention={"tp": 3, "dp": 1}, ffn={"tp": 1, "ep": 1, "dp": 3}, moe_comm="all-gather")))
    assert "attention.tp" in err and "num_attention_heads (32) is not divisible by attention.tp (3)" in err


def test_ep_larger_than_experts(capsys, tmp_path):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "model.num_experts=2",
                   "--set", "model.num_experts_per_tok=2")
    assert "deployment.ffn.ep" in err and "larger than the model's 2 experts" in err


def test_gpus_not_matching_layout(capsys):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.num_gpus=8")
    assert "deployment.attention" in err and "tp x dp must equal the 8 GPUs" in err


def test_unknown_bundled_name(capsys):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "hardware=h9000")
    assert "h9000" in err and "h20" in err  # lists what is bundled


def test_gemm_format_the_gpu_lacks(capsys):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "hardware=a100-sxm-80g",
                   "--set", "deployment.precision.gemm=fp8")
    assert "deployment.precision.gemm" in err and "a100-sxm-80g has no fp8 tensor-core rate" in err


def test_bad_override_syntax(capsys):
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.num_gpus")
    assert "dotted.field=value" in err


def test_no_traceback_in_subprocess(tmp_path):
    proc = run_cli("--config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "missing.yaml" in proc.stderr


@pytest.mark.parametrize("tables, mean_bound", [(None, 0.06), ("none", 0.05)])
def test_published_validation_within_targets(tables, mean_bound):
    # the six published cases within 5% mean |error| on the roofline, 6% with the bundled tables
    public_reference("published.yaml")
    proc = subprocess.run([sys.executable, "benchmarks/validate_published.py", "--format", "json",
                           *(["--mfu-tables", tables] if tables else [])],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert len(report["cases"]) == 6
    assert report["mean_abs_error"] <= mean_bound
    assert report["max_abs_error"] <= 0.15


def test_expert_tp_without_gathering_tokens_is_refused(capsys):
    # a TP-sharded expert needs every token of its group; an all-to-all only moves routed copies
    err = error_of(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.attention.tp=4",
                   "--set", "deployment.attention.dp=1", "--set", "deployment.ffn.tp=4", "--set", "deployment.ffn.ep=1",
                   "--set", "deployment.moe_comm=all-to-all")
    assert "deployment.moe_comm" in err and "'all-to-all'" in err and "needs moe_comm: all-gather" in err
    assert main(["--config", "qwen3-30b.yaml", "--format", "json", "--set", "deployment.attention.tp=4",
                 "--set", "deployment.attention.dp=1", "--set", "deployment.ffn.tp=4", "--set", "deployment.ffn.ep=1",
                 "--set", "deployment.moe_comm=all-gather"]) == 0


def test_expert_tp_without_a_named_moe_comm_gathers_tokens(capsys, tmp_path):
    # the only path a TP-sharded expert can take is the default when the run names none
    config = tmp_path / "tp4.yaml"
    config.write_text(yaml.safe_dump({
        "model": "qwen3-30b-a3b", "hardware": "h100-sxm",
        "deployment": {"num_gpus": 4, "attention": {"tp": 4}, "ffn": {"tp": 4}},
        "workload": {"isl": 1024, "osl": 1024, "prefill_tokens_per_gpu": 8192, "decode_batch_per_gpu": 64}}))
    assert main(["--config", str(config), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["deployment"]["moe_comm"] == "all-gather"
    # expert parallelism: the engine's path. SGLang without DeepEP and vLLM 0.11 (allgather_reducescatter)
    # gather; TensorRT-LLM gathers at EP4, not above Qwen3's top-8; DeepEP named by the run is kept
    config.write_text(config.read_text().replace("ffn:\n    tp: 4", "ffn:\n    ep: 4\n    tp: 1"))
    for engine in ("sglang", "vllm", "trtllm"):
        assert main(["--config", str(config), "--format", "json", "--set", f"engine={engine}"]) == 0
        assert json.loads(capsys.readouterr().out)["deployment"]["moe_comm"] == "all-gather"
    assert main(["--config", str(config), "--format", "json", "--set", "deployment.moe_comm=deepep-normal"]) == 0
    assert json.loads(capsys.readouterr().out)["deployment"]["moe_comm"] == "deepep-normal"


def test_max_batch_is_even_under_two_batch_overlap(capsys):
    assert main(["--config", "benchmarks/published/deepseek-v3-h800-decode.yaml", "--format", "json",
                 "--set", "workload.decode_batch_per_gpu=max"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decode"]["batch_per_gpu"] % 2 == 0
    assert data["memory"]["max_batch_per_gpu"] - 1 <= data["decode"]["batch_per_gpu"] <= data["memory"]["max_batch_per_gpu"]


def test_odd_batch_with_two_batch_overlap_names_the_field(capsys):
    err = error_of(capsys, "--config", "benchmarks/published/deepseek-v3-h800-decode.yaml",
                   "--set", "workload.decode_batch_per_gpu=127")
    assert "workload.decode_batch_per_gpu (127)" in err and "two-batch" in err


def test_tables_of_another_gpu_are_flagged(capsys):
    assert main(["--config", "benchmarks/published/qwen3-8b-h20-decode.yaml", "--format", "json",
                 "--mfu-tables", "imported/h800"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("measured on NVIDIA H800 SXM are used for hardware card h20" in w for w in warnings)
    assert main(["--config", "benchmarks/published/qwen3-8b-h20-decode.yaml", "--format", "json",
                 "--mfu-tables", "imported/h20"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert not any("measured on" in w for w in warnings)
    fallback = next(w for w in warnings if w.startswith("no table covers"))
    assert "o_proj" in fallback and "input_norm" not in fallback  # elementwise kernels are never table kernels
