"""A multimodal checkpoint's encoder: the weights an engine that loads it holds beside the language model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from infersim.base.errors import ConfigError
from infersim.cards.hf_import import card_fields_from_hf, llama4_vision_params, qwen3_vision_params
from infersim.cards.model import ModelCard
from infersim.cli.main import main
from infersim.run.config import config_from_mapping
from infersim.run.memory import memory_budget, weights_per_gpu
from infersim.run.simulate import simulate

# Llama-4's vision_config (Scout's and Maverick's checkpoints alike)
LLAMA4_VISION = {"model_type": "llama4_vision_model", "hidden_size": 1408, "intermediate_size": 5632,
                 "num_hidden_layers": 34, "num_attention_heads": 16, "num_channels": 3, "patch_size": 14,
                 "image_size": 336, "pixel_shuffle_ratio": 0.5, "projector_input_dim": 4096,
                 "projector_output_dim": 4096, "vision_output_dim": 4096}


def test_llama4s_vision_tower_counted_by_hand() -> None:
    # one layer: q, k, v, o 1408 x 1408 with biases, fc1 1408 x 5632 and fc2 5632 x 1408 with biases, two norms with biases
    layer = 4 * (1408 * 1408 + 1408) + (1408 * 5632 + 5632) + (5632 * 1408 + 1408) + 2 * 2 * 1408
    assert layer == 23_807_872
    # class token, 24 x 24 + 1 positions, the 3 x 14 x 14 patch projection, pre and post norms with biases
    embeddings = 1408 + 577 * 1408 + 3 * 14 * 14 * 1408 + 4 * 1408
    # the pixel-shuffle adapter (1408 x 4 -> 4096 -> 4096) and the projector into Scout's 5120-wide model
    adapter_and_projector = 5632 * 4096 + 4096 * 4096 + 4096 * 5120
    assert llama4_vision_params(LLAMA4_VISION, 5120) == 34 * layer + embeddings + adapter_and_projector == 871_932_416


QWEN35_VISION = {"model_type": "qwen3_5_moe", "hidden_size": 1152, "intermediate_size": 4304, "depth": 27,
                 "in_channels": 3, "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048,
                 "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "deepstack_visual_indexes": []}


def test_a_qwen3_vl_style_vision_tower_counted_by_hand() -> None:
    # the Conv3d patch embedding (3 channels x 2 frames x 16 x 16 pixels, with bias) and 2,304 learned positions
    embed = 3 * 2 * 16 * 16 * 1152 + 1152 + 2304 * 1152
    # a block: two layer norms with biases, qkv 1152 -> 3456 and proj with biases, fc1 1152 -> 4304 and fc2 with biases
    block = 2 * 2 * 1152 + (1152 * 3456 + 3456) + (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152)
    # the merger: a norm over 1152, fc1 over the 2 x 2 merged patches (4,608) and fc2 into the model's 2,048
    mlp = 4608 * 4608 + 4608 + 4608 * 2048 + 2048
    assert qwen3_vision_params(QWEN35_VISION, 0) == embed + 27 * block + 2 * 1152 + mlp == 446_571_248
    # a deepstack merger (Qwen3-VL) is the same MLP, its norm over the merged 4,608
    assert qwen3_vision_params(QWEN35_VISION, 3) == 446_571_248 + 3 * (2 * 4608 + mlp)


def _scout(engine: str, tp: int = 2):
    return config_from_mapping({"model": "llama-4-scout-fp8", "hardware": "h100-sxm", "engine": engine,
                                "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}},
                                "workload": {"isl": 1000, "osl": 200}}, "test")


def _memory(config):
    return memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine, 2048)


@pytest.mark.parametrize("engine, tp, loaded", [("vllm@0.15", 2, True), ("vllm@0.11", 4, True), ("vllm@0.33", 1, True),
                                                ("sglang@0.5", 2, False), ("sglang@0.5.23", 2, False)])
def test_an_engine_that_loads_the_encoder_holds_its_16_bit_weights_split_over_tp(engine, tp, loaded) -> None:
    """vLLM builds Llama-4's vision tower unless images are limited to 0; SGLang leaves Llama-4's
    encoder unloaded unless --enable-multimodal."""
    config = _scout(engine, tp)
    memory = _memory(config)
    encoder = 871_932_416 * 2 / tp if loaded else 0.0
    assert memory.encoder_weights_bytes == encoder
    assert memory.weights_bytes == weights_per_gpu(config.model, config.deployment) + encoder


def test_every_pipeline_stage_holds_the_encoder() -> None:
    """vLLM builds the vision tower on every rank whatever its pipeline stage (mllama4.py has no
    stage test), so a PP2 GPU holds the same share as a PP1 GPU of the same TP, while its language
    layers halve."""
    config = config_from_mapping({"model": "llama-4-scout-fp8", "hardware": "h100-sxm", "engine": "vllm@0.15",
                                  "deployment": {"num_gpus": 4, "pp": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}},
                                  "workload": {"isl": 1000, "osl": 200}}, "test")
    memory = _memory(config)
    assert memory.encoder_weights_bytes == 871_932_416 * 2 / 2
    assert memory.weights_bytes == weights_per_gpu(config.model, config.deployment) + 871_932_416


def test_sglang_loads_the_encoder_of_an_architecture_it_does_not_leave_out() -> None:
    config = _scout("sglang@0.5")
    other = replace(config.model, encoder_architecture="Qwen2_5_VLForConditionalGeneration")
    memory = memory_budget(other, config.hardware, config.deployment, config.workload, None, config.engine, 2048)
    assert memory.encoder_weights_bytes == 871_932_416


def test_an_engine_card_that_does_not_say_counts_nothing_and_the_run_says_so() -> None:
    result = simulate(_scout("trtllm"))
    assert result.memory.encoder_weights_bytes == 0.0
    assert any("multimodal encoder (0.87B parameters) is not counted" in w and "memory.loads_encoder" in w
               for w in result.warnings)
    assert not any("multimodal encoder" in w for w in simulate(_scout("vllm@0.15")).warnings)


def test_a_serving_run_says_so_too(capsys) -> None:
    args = ["serve", "--model", "llama-4-scout-fp8", "--hardware", "h100-sxm", "--tp", "2", "--rate", "1",
            "--num-requests", "5", "--isl", "200", "--osl", "20", "--format", "json"]
    assert main([*args, "--engine", "trtllm"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("multimodal encoder (0.87B parameters) is not counted" in note for note in notes)
    assert main([*args, "--engine", "vllm@0.15"]) == 0
    assert not any("encoder" in note for note in json.loads(capsys.readouterr().out).get("notes", []))


def test_the_report_and_json_name_the_encoders_share(capsys) -> None:
    args = ["--model", "llama-4-scout-fp8", "--hardware", "h100-sxm", "--engine", "vllm@0.15", "--tp", "2",
            "--isl", "1000", "--osl", "200"]
    assert main(args) == 0
    assert "multimodal encoder (included in the weights above): 0.87 GB" in capsys.readouterr().out
    assert main([*args, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["encoder_weights_gb"] == pytest.approx(0.871932416)


def _mm_config(vision: dict) -> dict:
    text = {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "tie_word_embeddings": False}
    return {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text,
            "vision_config": vision}


def test_the_hf_importer_counts_llama4s_encoder_and_names_others_it_does_not() -> None:
    fields = card_fields_from_hf(_mm_config(LLAMA4_VISION), "config.json", "scout")
    assert fields["encoder_params"] == 871_932_416
    assert fields["encoder_architecture"] == "Llama4ForConditionalGeneration"
    # the vision_config's own kind says how to count it (here beside a Llama-4 text model: only the count is looked at)
    qwen = card_fields_from_hf(_mm_config({**QWEN35_VISION, "deepstack_visual_indexes": [8, 16, 24]}), "config.json", "qwen")
    assert qwen["encoder_params"] == qwen3_vision_params(QWEN35_VISION, 3)
    other = card_fields_from_hf(_mm_config({**LLAMA4_VISION, "model_type": "qwen2_vl"}), "config.json", "other")
    assert "encoder_params" not in other and "its qwen2_vl encoder (vision_config) is not counted" in other["source"]
    text_only = card_fields_from_hf(_mm_config(LLAMA4_VISION)["text_config"], "config.json", "text")
    assert "encoder_params" not in text_only


@pytest.mark.parametrize("key, value", [("hidden_size", 0), ("pixel_shuffle_ratio", "half"), ("image_size", True)])
def test_a_vision_config_the_count_cannot_use_is_named(key, value) -> None:
    with pytest.raises(ConfigError) as info:
        card_fields_from_hf(_mm_config({**LLAMA4_VISION, key: value}), "config.json", "scout")
    assert info.value.field == f"vision_config.{key}" and "positive number" in info.value.problem


def test_a_negative_encoder_is_refused_on_load(tmp_path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("name: tiny\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 4\n"
                    "head_dim: 16\nvocab_size: 100\nintermediate_size: 128\nencoder_params: -5\n")
    from infersim.run.config import load_model_card

    with pytest.raises(ConfigError) as info:
        load_model_card(str(card))
    assert info.value.field == "encoder_params"
    assert ModelCard.__dataclass_fields__["encoder_params"].default == 0
