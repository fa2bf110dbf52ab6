"""A checkpoint that leaves the attention projections unquantised and quantises the rest (the
compressed-tensors FP8 Llama-4-Scout ignores `re:.*self_attn.*`): the attention weights keep their
16-bit format (precision.attention_weights), in memory and in their GEMMs, which run bf16 as an
unquantised linear layer does; the FFN and shared experts stay fp8."""

from __future__ import annotations

import pytest

from infersim.cards.deployment import Deployment, MixerDeployment, Precision
from infersim.cards.quantization import quantization_from_hf
from infersim.cli.main import main
from infersim.modules.attention import attention_after_core, attention_before_core
from infersim.run.config import config_from_mapping
from infersim.run.memory import weights_per_gpu
from infersim.shapes.kernels import GemmShape

# a tiny dense model: 2 layers of width 64, 4 query heads and 2 KV heads of 16, FFN 128, vocab 128
TINY = {"name": "tiny", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 128, "intermediate_size": 128}
CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
                                  "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}


def test_the_importer_gives_unquantised_attention_a_format_of_its_own() -> None:
    config = {"quantization_config": {**CT_FP8, "ignore": ["re:.*self_attn.*", "lm_head"]}, "torch_dtype": "bfloat16"}
    got = quantization_from_hf(config, "c.json", dict(TINY))
    assert (got["weights"], got["attention_weights"], got["activations"]) == ("fp8", "bf16", "fp8")
    assert got["detail"].endswith("attention kept bf16")
    # a checkpoint that quantises the attention too has one format
    assert "attention_weights" not in quantization_from_hf({"quantization_config": {**CT_FP8, "ignore": ["lm_head"]}},
                                                           "c.json", dict(TINY))


def _config(**precision):
    return config_from_mapping({"model": {**TINY, "quantization": {"method": "compressed-tensors", "weights": "fp8",
                                                                   "expert_weights": "fp8", "activations": "fp8",
                                                                   "attention_weights": "bf16"}},
                                "hardware": "h100-sxm", "engine": "vllm",
                                "deployment": {"num_gpus": 1, **({"precision": precision} if precision else {})},
                                "workload": {"isl": 64, "osl": 8}}, "test")


def test_the_checkpoints_attention_format_reaches_the_run_unless_the_run_names_one() -> None:
    prec = _config().deployment.precision
    assert (prec.gemm, prec.weight_dtype, prec.attention_weight_dtype, prec.attention_gemm_dtype) == \
        ("fp8", "fp8", "bf16", "bf16")
    named = _config(attention_weights="fp8").deployment.precision
    assert (named.attention_weight_dtype, named.attention_gemm_dtype) == ("fp8", "fp8")


def test_weights_by_hand() -> None:
    config = _config()
    # per layer: attention q 64x64, k and v 64x32 each, o 64x64 = 12,288 in bf16; FFN 3 x 64 x 128 =
    # 24,576 in fp8; norms 2 x 64 a layer and the embedding and LM head 2 x 128 x 64 in bf16
    assert weights_per_gpu(config.model, config.deployment) == 2 * (12288 * 2 + 24576) + (2 * 2 * 64 + 2 * 128 * 64) * 2
    fp8 = Deployment(num_gpus=1, precision=Precision(gemm="fp8", weights="fp8"))
    assert weights_per_gpu(config.model, fp8) == 2 * (12288 + 24576) + (2 * 2 * 64 + 2 * 128 * 64) * 2


def test_the_attention_projections_run_bf16_gemms_beside_fp8_ones() -> None:
    config = _config()
    mixer = MixerDeployment.of(config.deployment)
    ops = attention_before_core(config.model, mixer, "decode", 8) + attention_after_core(config.model, mixer, "decode", 8)
    gemms = {op.name: (op.shape.dtype, op.shape.weight_dtype) for op in ops if isinstance(op.shape, GemmShape)}
    assert "o_proj" in gemms and set(gemms.values()) == {("bf16", "bf16")}


def test_the_report_says_it(capsys) -> None:
    assert main(["--model", "llama-4-scout-fp8", "--hardware", "h100", "--engine", "vllm@0.15", "--tp", "2",
                 "--isl", "600", "--osl", "250"]) == 0
    out = capsys.readouterr().out
    assert "attention projections stored bf16, GEMMs bf16" in out and "attention bf16 (checkpoint)" in out


@pytest.mark.parametrize("stored", ["bf16", "fp16"])
def test_sixteen_bit_attention_runs_bf16(stored) -> None:
    assert Precision(gemm="fp8", weights="fp8", attention_weights=stored).attention_gemm_dtype == "bf16"
    assert Precision(gemm="fp8", weights="fp8").attention_gemm_dtype == "fp8"
