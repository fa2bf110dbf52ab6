"""The CPU context of a launch (annotations, operators, module frames) and the operator vocabulary."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

from infersim.trace.context import LaunchContexts, annotation_kind, region_stage
from infersim.trace.load import Annotation, RawTrace
from infersim.trace.operators import (ATTENTION_OP, BATCHED_MATMUL_OP, CONCAT_OP, ELEMENTWISE_OP, FRAME_ATTENTION,
                                      FRAME_EXPERTS, FRAME_LAYER, FRAME_MLP, FRAME_MODEL, FRAME_MOE, FRAME_NORM,
                                      FRAME_ROUTER, GEMM_OP, GROUPED_GEMM_OP, NORM_OP, NORM_PART_OP, OpShapes,
                                      attention_dims, frame_kind, gemm_dims, grouped_dims, op_class)


def _raw(annotations: list[tuple[str, float, float]], ops: list[tuple[str, float, float]],
         frames: list[tuple[str, float, float]], launches: list[float]) -> RawTrace:
    names: list[str] = []

    def name_id(text: str) -> int:
        if text not in names:
            names.append(text)
        return names.index(text)

    op_name = array("i", [name_id(n) for n, _, _ in ops])
    frame_name = array("i", [name_id(n) for n, _, _ in frames])
    launch_name = array("i", [name_id("cudaLaunchKernel")] * len(launches))
    return RawTrace(
        path=Path("x.json"), top_level={}, names=tuple(names), lanes=("0",), threads=(("1", "1"),),
        kernel_name=array("i"), kernel_kind=array("b"), kernel_start_us=array("d"), kernel_dur_us=array("d"),
        kernel_lane=array("i"), kernel_stream=array("q"), kernel_correlation=array("q"),
        launch_name=launch_name, launch_thread=array("i", [0] * len(launches)), launch_start_us=array("d", launches),
        launch_correlation=array("q", range(len(launches))),
        annotations=tuple(Annotation(n, 0, s, e) for n, s, e in annotations),
        op_name=op_name, op_thread=array("i", [0] * len(ops)), op_start_us=array("d", [s for _, s, _ in ops]),
        op_end_us=array("d", [e for _, _, e in ops]), op_shapes=array("i", [-1] * len(ops)),
        frame_name=frame_name, frame_thread=array("i", [0] * len(frames)),
        frame_start_us=array("d", [s for _, s, _ in frames]), frame_end_us=array("d", [e for _, _, e in frames]))


def test_context_of_each_launch_is_what_encloses_it() -> None:
    raw = _raw(
        annotations=[("ProfilerStep#1", 0, 100), ("decode", 10, 90), ("attn(F)", 20, 30), ("mlp(B)", 60, 70)],
        ops=[("aten::linear", 21, 29), ("aten::mm", 22, 28), ("aten::view", 40, 41), ("aten::add", 61, 62)],
        frames=[("nn.Module: LlamaForCausalLM_0", 12, 80), ("nn.Module: LlamaDecoderLayer_0", 15, 50),
                ("nn.Module: LlamaAttention_0", 19, 31)],
        launches=[5, 25, 40.5, 61.5, 95, 120])
    ctx = LaunchContexts(raw)
    names = raw.annotations
    # step: the innermost step annotation (the user region inside the profiler step)
    assert [names[i].name if i >= 0 else None for i in ctx.step] == [
        "ProfilerStep#1", "decode", "decode", "decode", "ProfilerStep#1", None]
    assert [names[i].name if i >= 0 else None for i in ctx.region] == [None, "attn(F)", None, None, None, None]
    assert list(ctx.backward) == [0, 0, 0, 1, 0, 0]
    # the outermost operator with a class: linear, not the mm inside it; views say nothing
    assert [raw.names[raw.op_name[i]] if i >= 0 else None for i in ctx.op] == [
        None, "aten::linear", None, "aten::add", None, None]
    chain = [tuple(raw.names[n] for n in ctx.frame_chains[c]) for c in ctx.frames]
    assert chain[1] == ("nn.Module: LlamaForCausalLM_0", "nn.Module: LlamaDecoderLayer_0",
                        "nn.Module: LlamaAttention_0")
    assert chain[3] == ("nn.Module: LlamaForCausalLM_0",)
    assert [ctx.layer_frame[i] for i in range(6)] == [-1, 1, 1, -1, -1, -1]
    assert [ctx.model_frame[i] for i in range(6)] == [-1, 0, 0, 0, -1, -1]


def test_ended_intervals_never_pile_up() -> None:
    """Thousands of sequential annotations and operators: the stack only holds what is open, so
    every launch still finds its own (a stack of ended entries would give it a stale context)."""
    n = 5000
    annotations = [(f"decode_{i}" if i % 2 else "prefill", 10.0 * i, 10.0 * i + 8) for i in range(n)]
    ops = [("aten::mm", 10.0 * i + 1, 10.0 * i + 3) for i in range(n)]
    raw = _raw(annotations, ops, [], [10.0 * i + 2 for i in range(n)] + [10.0 * i + 9 for i in range(n)])
    ctx = LaunchContexts(raw, step_regions=tuple({a for a, _, _ in annotations}))
    assert list(ctx.step[:n]) == list(range(n))
    assert list(ctx.op[:n]) == list(range(n))
    assert set(ctx.step[n:]) == {-1} and set(ctx.op[n:]) == {-1}


def test_annotation_kinds() -> None:
    assert annotation_kind("step[DECODE bs=8]") == "step"
    assert annotation_kind("ProfilerStep#3") == "profiler_step"
    assert annotation_kind("attn(F)") == "fwd_attn"
    assert annotation_kind("mlp(F)") == "fwd_ffn"
    assert annotation_kind("attn(B)") == "backward"
    assert annotation_kind("prefill") == annotation_kind("decode_step_3") == "region"
    assert annotation_kind("my_forward") == "other"
    assert annotation_kind("my_forward", ("my_forward",)) == "region"
    assert annotation_kind("prefill", ("my_forward",)) == "other"  # named regions replace the default ones
    assert (region_stage("prefill"), region_stage("decode_step_3"), region_stage("generate")) == (
        "prefill", "decode", None)


@pytest.mark.parametrize(("name", "expected"), [
    ("aten::linear", GEMM_OP), ("aten::mm", GEMM_OP), ("aten::bmm", BATCHED_MATMUL_OP),
    ("aten::scaled_dot_product_attention", ATTENTION_OP), ("aten::_scaled_dot_product_cudnn_attention", ATTENTION_OP),
    ("flash_attn::_flash_attn_forward", ATTENTION_OP), ("aten::_grouped_mm", GROUPED_GEMM_OP),
    ("aten::rms_norm", NORM_OP), ("aten::rsqrt", NORM_PART_OP), ("aten::cat", CONCAT_OP),
    ("aten::add", ELEMENTWISE_OP), ("aten::view", None), ("aten::empty_strided", None), ("aten::detach_", None),
    ("sgl_kernel::fused_add_rmsnorm", None), ("triton_poi_fused_add_cos_sin_0", None),
    ("flash_attn::_flash_attn_backward", None),
])
def test_operator_classes(name: str, expected: str | None) -> None:
    assert op_class(name) == expected


@pytest.mark.parametrize(("frame", "expected"), [
    ("nn.Module: LlamaDecoderLayer_3", FRAME_LAYER), ("nn.Module: LlamaAttention_3", FRAME_ATTENTION),
    ("nn.Module: LlamaMLP_0", FRAME_MLP), ("nn.Module: MixtralSparseMoeBlock_1", FRAME_MOE),
    ("nn.Module: Qwen2MoeSparseMoeBlock_1", FRAME_MOE), ("nn.Module: MixtralExperts_1", FRAME_EXPERTS),
    ("nn.Module: MixtralTopKRouter_0", FRAME_ROUTER), ("nn.Module: LlamaRMSNorm_4", FRAME_NORM),
    ("nn.Module: LlamaForCausalLM_0", FRAME_MODEL), ("nn.Module: GPT2Block_0", FRAME_LAYER),
])
def test_module_frame_kinds(frame: str, expected: str) -> None:
    assert frame_kind(frame) == expected


def test_gemm_dims_from_recorded_inputs() -> None:
    linear = OpShapes(((2, 128, 4096), (11008, 4096), ()), ("c10::BFloat16", "c10::BFloat16", ""), ())
    d = gemm_dims("aten::linear", linear)
    assert (d.m, d.k, d.n, d.dtype, d.seq, d.batch) == (256, 4096, 11008, "bf16", 128, 2)
    addmm = OpShapes(((1024,), (16, 4096), (4096, 1024)), ("c10::Half", "c10::Half", "c10::Half"), ())
    d = gemm_dims("aten::addmm", addmm)
    assert (d.m, d.k, d.n, d.dtype) == (16, 4096, 1024, "fp16")
    # a matmul of two activations is no weight GEMM
    assert gemm_dims("aten::matmul", OpShapes(((1, 64, 1), (1, 1, 128)), ("float", "float"), ())) is None
    assert gemm_dims("aten::linear", OpShapes(((2, 4096), (1024, 2048)), ("float", "float"), ())) is None


def test_attention_and_grouped_dims() -> None:
    sdpa = OpShapes(((2, 32, 1, 128), (2, 8, 130, 128), (2, 8, 130, 128), (), (), (), (), ()),
                    ("c10::BFloat16",) * 3 + ("",) * 5, ("", "", "", "", "0.", "False", "", "True"))
    d = attention_dims("aten::scaled_dot_product_attention", sdpa)
    assert (d.batch, d.num_heads, d.num_kv_heads, d.q_len, d.kv_len, d.qk_head_dim, d.causal) == (
        2, 32, 8, 1, 130, 128, False)
    flash = OpShapes(((4, 512, 32, 128), (4, 512, 8, 128), (4, 512, 8, 128)), ("c10::BFloat16",) * 3, ())
    d = attention_dims("flash_attn::_flash_attn_forward", flash)
    assert (d.batch, d.q_len, d.num_heads, d.num_kv_heads) == (4, 512, 32, 8)
    grouped = OpShapes(((256, 4096), (8, 4096, 28672), (8,)), ("c10::BFloat16", "c10::BFloat16", "int"), ())
    g = grouped_dims(grouped)
    assert (g.tokens, g.experts, g.k, g.n) == (256, 8, 4096, 28672)
    transposed = OpShapes(((256, 14336), (8, 4096, 14336), (8,)), ("c10::BFloat16", "c10::BFloat16", "int"), ())
    assert grouped_dims(transposed).n == 4096
