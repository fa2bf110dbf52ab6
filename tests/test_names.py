"""Names a new user types: what resolves (exactly, by alias or checkpoint id, a release of the same
weights, a unique prefix in whole words), what a model name says about its weight format, what is
refused with a suggestion, and that a name with extra words never becomes another model's card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.base.errors import InferSimError
from infersim.cards.registry import bundled_names, resolve_card, served_model_name
from cli_helpers import run_json, error_of

from infersim.cli.main import main

VLLM_SAMPLE = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"


@pytest.mark.parametrize("kind, name, card, how", [
    ("models", "deepseek-r1", "deepseek-v3", "an alias of bundled card deepseek-v3"),
    ("models", "DeepSeek-R1", "deepseek-v3", "an alias"),
    ("models", "qwen3-235b", "qwen3-235b-a22b", "the only bundled card whose name begins with those words"),
    ("models", "Qwen3-30B", "qwen3-30b-a3b", "the only bundled card"),
    ("models", "Llama-3.3-70B-Instruct", "llama-3.1-70b", "an alias"),
    ("models", "meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b", "the bundled card of that model"),
    ("models", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b", "the checkpoint"),
    ("hardware", "H100-80GB", "h100-sxm", "alias (H100 80GB HBM3)"),
    ("hardware", "mi300x", "mi300x", None),
])
def test_names_that_resolve(kind: str, name: str, card: str, how: str | None) -> None:
    resolved = resolve_card(name, kind)
    assert resolved.path.stem == card and resolved.quantization is None
    if how is None:
        assert resolved.note == ""
    else:
        assert resolved.note.startswith(f"{kind.rstrip('s')} '{name}' -> {card} (") and how in resolved.note


@pytest.mark.parametrize("kind, name, suggested", [
    ("models", "llama3-70b", "llama-3.1-70b"), ("models", "Llama-3-70B-Instruct", "llama-3.1-70b"),
    ("models", "qwen3-8", "qwen3-8b"), ("hardware", "H100-SXM-80", "h100-sxm"), ("hardware", "mi300", "mi300x"),
    ("engines", "sglan", "sglang"), ("engines", "vlm", "vllm"),
])
def test_a_miss_suggests_the_closest_card(kind: str, name: str, suggested: str) -> None:
    with pytest.raises(InferSimError) as exc:
        resolve_card(name, kind)
    text = str(exc.value)
    assert f"'{name}' not found; did you mean {suggested}" in text


@pytest.mark.parametrize("name, candidates", [
    ("qwen3", "qwen3-0.6b, qwen3-235b-a22b, qwen3-30b-a3b, qwen3-8b, qwen3-next-80b-a3b"),
    ("llama-3.1", "llama-3.1-405b, llama-3.1-70b, llama-3.1-8b"),
])
def test_a_prefix_of_several_cards_lists_them(name: str, candidates: str) -> None:
    with pytest.raises(InferSimError, match=f"'{name}' is ambiguous: it may mean {candidates};"):
        resolve_card(name, "models")


def test_a_name_with_extra_words_is_another_model(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "--model", "evilcorp/qwen3-8b-but-actually-70b", "--hardware", "h100")
    assert "begins with the name of bundled card qwen3-8b but goes on with 'but actually 70b'" in err
    assert "did you mean" not in err


# Words a model's HF id may carry after the base name without naming other weights.
RELEASE = st.sampled_from(["Instruct", "Chat", "hf", "it", "2507", "v0.1", "Thinking"])
# Words that would make it another model (sizes, other families, fine-tunes).
OTHER = st.sampled_from(["70b", "but", "actually", "Distill", "Llama", "MoE", "x2", "uncensored", "Coder", "VL"])


@settings(max_examples=60, deadline=None)
@given(card=st.sampled_from(bundled_names("models")), release=st.lists(RELEASE, max_size=2),
       other=st.lists(OTHER, min_size=1, max_size=3), org=st.sampled_from(["", "evilcorp/", "Qwen/"]))
def test_a_card_name_followed_by_other_words_never_resolves_to_that_card(card: str, release: list[str],
                                                                        other: list[str], org: str) -> None:
    name = org + "-".join([card, *release, *other])
    try:
        resolved = resolve_card(name, "models")
    except InferSimError as exc:
        assert "not found" in str(exc) or "ambiguous" in str(exc)
    else:
        # only a card whose own name or checkpoint really is that longer name may match
        assert resolved.path.stem != card, resolved.note


@pytest.mark.parametrize("name, gemm, weights", [
    ("Qwen/Qwen3-8B-FP8", "fp8", "fp8"),  # the card's quantized_checkpoints entry
    ("Qwen/Qwen3-8B-AWQ", "bf16", "int4"), ("Qwen/Qwen3-8B-GPTQ-Int4", "bf16", "int4"),
    ("Qwen/Qwen3-8B-GPTQ-Int8", "bf16", "int8"), ("RedHatAI/Qwen3-8B-FP8-dynamic", "fp8", "fp8"),
    ("RedHatAI/Qwen3-8B-quantized.w4a16", None, None),  # "quantized.w4a16" is one word: not a release, refused
])
def test_a_model_name_that_states_its_weight_format_prices_that_format(
        capsys: pytest.CaptureFixture[str], name: str, gemm: str | None, weights: str | None) -> None:
    if weights is None:
        assert "not found" in error_of(capsys, "--model", name, "--hardware", "h100")
        return
    data = run_json(capsys, "--model", name, "--hardware", "h100")
    assert data["model"] == "qwen3-8b"
    assert (data["deployment"]["precision"]["gemm"], data["deployment"]["precision"]["weights"]) == (gemm, weights)
    assert data["weights_format"]["weights_from"] == "checkpoint"
    assert any("-> qwen3-8b" in note and "read from the name" in note for note in data["notes"])
    # the linear weights shrink to the stated format; the embedding and the untied LM head
    # (2 x 151,936 x 4,096 bf16 values) stay bf16
    bf16 = run_json(capsys, "--model", "Qwen/Qwen3-8B", "--hardware", "h100")["memory"]["weights_gb"] * 1e9
    embeddings = 2 * 151_936 * 4_096 * 2
    per_value = {"fp8": 1, "int8": 1, "int4": 0.5}[weights]
    expected = (bf16 - embeddings) * per_value / 2 + embeddings
    assert data["memory"]["weights_gb"] * 1e9 == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("name, words", [
    ("Qwen/Qwen3-8B-GGUF", "'gguf'"), ("unsloth/Qwen3-8B-bnb-4bit", "'4bit'"),
    ("TheBloke/Qwen3-8B-GPTQ", "GPTQ but not in how many bits"), ("acme/Qwen3-8B-AWQ-FP8", "AWQ with"),
])
def test_a_weight_format_that_cannot_be_priced_from_a_name_is_refused(capsys: pytest.CaptureFixture[str],
                                                                      name: str, words: str) -> None:
    err = error_of(capsys, "--model", name, "--hardware", "h100")
    assert f"model '{name}'" in err and "config.json" in err
    assert words.split(" with")[0] in err


def test_explicit_precision_beats_the_name_and_says_what_the_checkpoint_stores(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--model", "Qwen/Qwen3-8B-AWQ", "--hardware", "h100", "--precision", "FP8")
    assert data["deployment"]["precision"]["weights"] == "fp8"
    assert data["weights_format"]["weights_from"] == "run config; the checkpoint stores int4"


def test_choices_ignore_case_and_suggest(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--model", "qwen3-8b", "--hardware", "h100", "--precision", "FP8",
                    "--kv-cache-dtype", "FP8")
    assert data["deployment"]["precision"]["gemm"] == "fp8" and data["deployment"]["precision"]["kv_cache"] == "fp8"
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "qwen3-8b", "--hardware", "h100", "--precision", "fp9"])
    assert exit_.value.code == 2
    assert "invalid choice: 'fp9'; did you mean 'fp8'?" in capsys.readouterr().err


@pytest.mark.parametrize("override, hint", [
    ("model.num_expert=256", "did you mean 'num_experts'?"),
    ("deploymnt.num_gpus=2", "did you mean 'deployment'?"),
    ("deployment.moe_comm=alltoall", "did you mean all-to-all?"),
])
def test_set_suggests_the_field_or_value(capsys: pytest.CaptureFixture[str], override: str, hint: str) -> None:
    assert hint in error_of(capsys, "--model", "qwen3-30b-a3b", "--hardware", "h100", "--set", override)


def test_a_bench_files_local_path_model_id_is_read_by_its_last_part(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert served_model_name("/models/Llama-3.3-70B-Instruct")[0] == "Llama-3.3-70B-Instruct"
    assert served_model_name("meta-llama/Llama-3.1-8B-Instruct")[0] == "meta-llama/Llama-3.1-8B-Instruct"
    data = json.loads(VLLM_SAMPLE.read_text())
    data["model_id"] = "/models/Llama-3.3-70B-Instruct"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(data))
    result = run_json(capsys, "compare", "--bench-result", str(bench), "--hardware", "h100", "--tp", "8")
    (one,) = result["results"]
    assert one["predicted_run"].startswith("llama-3.1-70b on 8 x h100-sxm")
    assert any("is a path on the server; its last part Llama-3.3-70B-Instruct names the model" in n
               for n in one["notes"])


def test_a_bench_files_model_id_with_a_format_prices_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(VLLM_SAMPLE.read_text())
    data["model_id"] = "/models/Qwen3-8B-GPTQ-Int4"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(data))
    assert main(["compare", "--bench-result", str(bench), "--hardware", "h100"]) == 0
    assert "checkpoint format GPTQ int4 read from the name" in capsys.readouterr().err
