"""HF configs -> cards for the newer architectures: layer patterns, sliding windows,
Gated DeltaNet, DSA and MTP fields; bundled cards are exactly what the importer writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO_ROOT, shared_reference
from infersim.cards.hf_import import card_fields_from_hf, card_from_hf_file
from infersim.cards.model import ModelCard, validate_model
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.cli.cards import card_yaml
from infersim.run.config import load_model_card
from infersim.run.memory import total_parameters
from infersim.base.errors import ConfigError

BASE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 128}


def card(config: dict) -> ModelCard:
    fields = card_fields_from_hf(config, "test.json", "t")
    return validate_model(build(ModelCard, fields, "test"), "test")


@pytest.mark.parametrize("bundled, reference", [
    ("gpt-oss-120b", "gpt-oss-120b_config.json"),
    ("qwen3-next-80b-a3b", "qwen3-next-80B-A3B_config.json"),
    ("deepseek-v3.2", "deepseek_v3.2_config.json"),
    ("qwen3.5-35b-a3b", "qwen3.5-35B-A3B_config.json"),
])
def test_bundled_cards_are_the_importer_output(bundled, reference):
    fields = card_from_hf_file(shared_reference("hf_configs", reference), bundled)
    # the checkpoints a card names are hand-written: the published weights are not in the HF config
    lines = (REPO_ROOT / "models" / f"{bundled}.yaml").read_text().splitlines(keepends=True)
    assert "".join(line for line in lines if not line.startswith(("checkpoint:", "quantized_checkpoints:"))) \
        == card_yaml(fields)


def test_gpt_oss_alternates_sliding_and_full():
    m = card_from_hf_file(shared_reference("hf_configs", "gpt-oss-120b_config.json"))
    assert m["layer_types"] == ["sliding_attention", "full_attention"] and m["sliding_window"] == 128
    model, _ = load_model_card("gpt-oss-120b")
    assert model.layer_count("sliding_attention") == model.layer_count("full_attention") == 18
    assert (model.num_experts, model.num_experts_per_tok, model.moe_intermediate_size) == (128, 4, 2880)


def test_qwen3_next_interval_and_qwen35_layer_types_agree():
    nxt, _ = load_model_card("qwen3-next-80b-a3b")
    assert nxt.layer_kinds == ("linear_attention",) * 3 + ("full_attention",) + nxt.layer_kinds[4:]
    assert nxt.layer_count("linear_attention") == 36 and nxt.layer_count("full_attention") == 12
    assert (nxt.linear_num_key_heads, nxt.linear_num_value_heads, nxt.linear_key_head_dim,
            nxt.linear_value_head_dim, nxt.linear_conv_kernel_dim) == (16, 32, 128, 128, 4)
    assert nxt.attention_output_gate and nxt.mamba_ssm_dtype == "fp32"
    q35, _ = load_model_card("qwen3.5-35b-a3b")
    assert q35.layer_count("linear_attention") == 30 and q35.num_nextn_predict_layers == 1
    assert q35.attention_output_gate


def test_deepseek_v32_dsa_fields():
    ds, _ = load_model_card("deepseek-v3.2")
    assert (ds.index_n_heads, ds.index_head_dim, ds.index_topk, ds.num_nextn_predict_layers) == (64, 128, 2048, 1)
    assert ds.is_sparse_attention and not ds.is_hybrid


def test_every_reference_config_imports_or_fails_with_one_message(tmp_path, capsys):
    for path in sorted(shared_reference("hf_configs").glob("*.json")):
        code = main(["cards", "import-hf", str(path), "--out", str(tmp_path), "--force"])
        err = capsys.readouterr().err
        assert code == 0 or (code == 2 and err.count("\n") == 1), (path.name, err)
        if code == 0:
            load_model_card(str(tmp_path / f"{path.name.replace('_config.json', '').lower()}.yaml"))


def test_sliding_window_rules():
    assert card({**BASE, "sliding_window": 4096}).layer_kinds == ("sliding_attention",) * 4  # Mistral
    assert not card({**BASE, "sliding_window": 4096, "use_sliding_window": False}).is_hybrid  # Qwen2/3
    assert not card({**BASE, "sliding_window": None}).is_hybrid  # Mixtral
    gemma2 = card({**BASE, "model_type": "gemma2", "sliding_window": 4096})
    assert gemma2.layer_kinds == ("sliding_attention", "full_attention") * 2
    gemma3 = card({**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 512,
                   "sliding_window_pattern": 3})
    assert gemma3.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
    listed = card({**BASE, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention",
                                                                "full_attention", "sliding_attention"]})
    assert listed.layer_types == ("sliding_attention", "full_attention", "full_attention", "sliding_attention")
    # a window on an all-full model is dropped rather than kept unused
    assert "sliding_window" not in card_fields_from_hf({**BASE, "sliding_window": 8,
                                                         "layer_types": ["full_attention"] * 4}, "t", "t")


@pytest.mark.parametrize("extra, field", [
    ({"layer_types": ["full_attention", "retention"] * 2}, "layer_types"),
    ({"layer_types": ["full_attention", "chunked_attention"] * 2}, "attention_chunk_size"),  # no chunk given
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern"),
    ({"attn_layer_period": 8}, "attn_layer_period"),
    ({"full_attention_interval": 2, "mamba_ssm_dtype": "float64", "linear_num_key_heads": 2,
      "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8}, "mamba_ssm_dtype"),
])
def test_unsupported_layouts_are_refused_by_name(extra, field):
    with pytest.raises(ConfigError) as err:
        card({**BASE, **extra})
    assert err.value.field == field


def test_bundled_example_configs_run(capsys):
    for name in ("gpt-oss-120b.yaml", "qwen3-next.yaml", "deepseek-v3.2.yaml", "qwen3-8b-speculative.yaml"):
        assert main(["--config", name]) == 0, name
        assert "DECODE" in capsys.readouterr().out
    assert Path(REPO_ROOT / "models" / "qwen3-0.6b.yaml").is_file()


def test_llama4_interleaved_moe_and_chunked_attention_import():
    fields = card_from_hf_file(shared_reference("hf_configs", "llama-4-maverick_config.json"), "maverick")
    card = validate_model(build(ModelCard, fields, "maverick"), "maverick")
    assert card.moe_layer_interval == 2 and card.num_moe_layers == 24 and card.num_dense_layers == 24
    assert card.intermediate_size == 16384 and card.moe_intermediate_size == 8192  # dense vs expert width
    assert card.num_shared_experts == 1 and card.shared_width == 8192
    # every 4th layer global (no RoPE), the others attend within chunks of 8192 tokens
    assert card.layer_kinds[:4] == ("chunked_attention",) * 3 + ("full_attention",)
    assert card.attention_chunk_size == 8192 and card.sliding_window == 0 and "sliding_window" not in fields
    assert total_parameters(card) == pytest.approx(400e9, rel=0.01)  # Maverick: 400B total


def test_chunked_layer_types_import_with_their_chunk():
    m = card({**BASE, "layer_types": ["chunked_attention", "full_attention"] * 2, "attention_chunk_size": 16})
    assert m.layer_kinds == ("chunked_attention", "full_attention") * 2 and m.attention_chunk_size == 16
    # a chunk no layer uses is not carried over
    assert card({**BASE, "attention_chunk_size": 16}).attention_chunk_size == 0
