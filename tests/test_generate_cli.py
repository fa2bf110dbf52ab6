"""`infersim generate` end to end, the benchmark's four-line log, and the reference model cards."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import REPO_ROOT, shared_reference
from infersim.cli.main import main
from infersim.run.config import load_model_card
from infersim.generate.report import format_log
from infersim.run.memory import total_parameters

from test_generate_metrics import mapping

EXAMPLE_LOG = """\
model size: 326.914 GB    cache size: 1.875 GB    hidden size (p): 0.010 GB
peak gpu mem: 12.341 GB   prefill latency: 8.234 s  prefill throughput: 497.52 token/s
decode latency: 42.106 s  decode throughput: 5.89 token/s
total latency: 50.340 s   total throughput: 5.08 token/s"""

_LOG_KEYS = {
    "model size": "model_size_gb", "cache size": "cache_size_gb", "hidden size (p)": "hidden_size_gb",
    "peak gpu mem": "peak_gpu_mem_gb", "prefill latency": "prefill_latency_s",
    "prefill throughput": "prefill_throughput_tok_s", "decode latency": "decode_latency_s",
    "decode throughput": "decode_throughput_tok_s", "total latency": "total_latency_s",
    "total throughput": "total_throughput_tok_s",
}


def parse_log(text: str) -> dict[str, float]:
    names = "|".join(re.escape(k) for k in _LOG_KEYS)
    return {_LOG_KEYS[k]: float(v) for k, v in re.findall(rf"({names}): ([\d.]+) (?:GB|s|token/s)", text)}


def test_log_layout_reproduces_the_example():
    assert format_log(parse_log(EXAMPLE_LOG)) == EXAMPLE_LOG


def test_log_layout_matches_the_reference_file():
    text = shared_reference("zero_inference.yaml").read_text()
    block = text.split("# Log format (one run):\n", 1)[1].splitlines()[:4]
    lines = [line[len("#   "):] for line in block]
    assert all(line.startswith(("model size", "peak gpu", "decode lat", "total lat")) for line in lines)
    assert format_log(parse_log("\n".join(lines))) == "\n".join(lines)


@pytest.fixture()
def config_file(tmp_path):
    raw = mapping(batch=4, prompt_len=32, gen_len=8)
    path = tmp_path / "tiny-generate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_log_format(config_file, capsys):
    assert main(["generate", "--config", str(config_file), "--format", "log", "--offload", "weights,kv"]) == 0
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert len(out) == 4
    assert out[0].startswith("model size: ") and "  cache size: " in out[0] and "  hidden size (p): " in out[0]
    assert out[1].startswith("peak gpu mem: ") and out[3].startswith("total latency: ")
    values = parse_log("\n".join(out))
    assert values["hidden_size_gb"] == pytest.approx(4 * 40 * 64 * 2 / 1e9, abs=5e-4)
    assert values["total_latency_s"] == pytest.approx(values["prefill_latency_s"] + values["decode_latency_s"], abs=2e-3)


def test_cli_json_and_flags_override_the_file(config_file, capsys):
    assert main(["generate", "--config", str(config_file), "--format", "json", "--batch", "8", "--gen-len", "3",
                 "--prompt-len", "16", "--weights", "int4", "--offload", "weights", "--no-prefetch"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["batch"], data["prompt_len"], data["gen_len"]) == (8, 16, 3)
    assert data["precision"]["weights"] == "int4"
    assert data["offload"] == {"weights": True, "kv": False, "weights_device": "cpu", "prefetch": False,
                               "dequantize": "int4 -> bf16"}
    assert data["decode_method"] == "step-by-step" and data["decode_steps"] == 2
    assert len(data["decode_step_latencies_s"]) == 2
    assert data["decode_latency_s"] == pytest.approx(sum(data["decode_step_latencies_s"]))
    assert data["total_latency_s"] == pytest.approx(data["prefill_latency_s"] + data["decode_latency_s"])
    assert data["prefill_throughput_tok_s"] == pytest.approx(8 * 16 / data["prefill_latency_s"])
    assert data["decode_throughput_tok_s"] == pytest.approx(8 * 2 / data["decode_latency_s"])
    assert data["total_throughput_tok_s"] == pytest.approx(8 * 3 / data["total_latency_s"])
    assert data["memory"]["host_weights_gb"] > 0 and data["memory"]["host_kv_gb"] == 0


def test_cli_text(config_file, capsys):
    assert main(["generate", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "InferSim generate: tiny on 1 x toy" in out
    assert "batch 4, prompt 32 tokens, generate 8 tokens" in out
    assert "decode timed step by step: 7 steps at KV length 33..39" in out
    assert "offload: none (weights and KV cache on the GPU)" in out


@pytest.mark.parametrize("args, message, code", [
    (["--gen-len", "0"], "'generate.gen_len' (value: 0): must be at least 1 token", 2),
    (["--batch", "100000"], "does not fit (tiny, batch 100000 x 32+8 tokens): GPU memory needs", 1),  # not bad input
    (["--offload", "everything"], "must be one of weights, kv", 2),
])
def test_cli_bad_input_one_line_exit_2(config_file, capsys, args, message, code):
    assert main(["generate", "--config", str(config_file), *args]) == code
    err = capsys.readouterr().err
    assert err.startswith("infersim: error: " if code == 2 else "infersim: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# ---- the reference models' cards ------------------------------------------------------------


def deepspeed_parameters(name: str) -> float:
    """The benchmark's own model-size formula (OPT/BLOOM: 4x MLP, biases, tied embeddings), in parameters."""
    m, _ = load_model_card(name)
    h, layers, vocab = m.hidden_size, m.num_hidden_layers, m.vocab_size
    per_layer = h * (3 * h + 1) + h * (h + 1) + h * (4 * h + 1) + h * 4 * (h + 1) + h * 4
    return layers * per_layer + vocab * (h + 1)


@pytest.mark.parametrize("name", ["opt-30b", "opt-66b", "opt-175b", "bloom-176b"])
def test_reference_cards_match_the_benchmark_model_size(name):
    card, _ = load_model_card(name)
    # InferSim counts norms without biases (2h instead of 4h per layer) and no bias on the embedding row sum
    assert total_parameters(card) == pytest.approx(deepspeed_parameters(name), rel=1e-5)
    assert card.tie_word_embeddings and card.ffn_activation in ("relu", "gelu")


def test_llama_2_70b_card():
    card, _ = load_model_card("llama-2-70b")
    assert (card.num_key_value_heads, card.intermediate_size, card.ffn_activation) == (8, 28672, "swiglu")
    assert total_parameters(card) == pytest.approx(68.98e9, rel=1e-3)  # Meta: 69B parameters


def test_reference_configs_load():
    for path in sorted((REPO_ROOT / "benchmarks" / "offload").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        assert raw["hardware"] == "rtx-a6000" and raw["generate"]["offload"] == ["weights"], path


def test_mixed_expert_weight_format_is_refused_not_misreported(capsys):
    from infersim.cli.main import main

    code = main(["generate", "--config", "gpt-oss-120b.yaml", "--batch", "8", "--prompt-len", "1024", "--gen-len", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "expert_weights" in err and "not modelled for whole generations" in err
