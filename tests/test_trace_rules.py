"""The kernel rule table: shipped rules classify real kernel names; user rules come first; bad rules fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.base.errors import InferSimError
from infersim.cards import categories as cat
from infersim.trace.rules import GEMM, OTHER, RULE_MODULES, load_rules, shipped_rules

# (kernel name as it appears in a trace, module, role) — names from ../shared/reference/kernel_names.md
KNOWN = [
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90"
     "<2, cute::tuple<cute::C<128>, cute::C<128>, cute::C<192> >, 128, cutlass::bfloat16_t> > > >(Params)",
     cat.ATTN_CORE, "attention"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 5, 256>>(Params)",
     cat.ATTN_CORE, None),
    ("void flash::prepare_varlen_num_blocks_kernel<1, true>(int, int)", cat.ATTN_CORE, None),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u>(Params)", cat.ATTN_CORE,
     "attention"),
    ("void flashinfer::mla::hopper::BatchMLAPageAttentionHopperKernel<KTraits, Params>(Params)", cat.ATTN_CORE,
     "attention"),
    ("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>>(Flash_fwd_mla_params)",
     cat.ATTN_CORE, "attention"),
    ("_fwd_kernel", cat.ATTN_CORE, "attention"),
    ("_fwd_kernel_stage2", cat.ATTN_CORE, None),
    ("_fwd_kernel_ep_scatter_1", cat.ROUTER, None),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>()",
     cat.ELEMENTWISE, None),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", GEMM, None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     GEMM, None),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x3_tn_align8>(Params)", GEMM, None),
    ("void deep_gemm::fp8_gemm_kernel<7168u, 16384u, 256u, 128u, 128u, 0u, 128u, 1u, 3u, 128u, 128u, 2u, true, "
     "(deep_gemm::GemmType)0>(...)", GEMM, None),
    ("void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 128u, 128u, 0u, 128u, 1u, 3u, 128u, 128u, 2u, true, "
     "(deep_gemm::GemmType)2>(...)", cat.MOE_EXPERTS, None),
    ("fused_moe_kernel", cat.MOE_EXPERTS, None),
    ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE17GroupProblemShape", cat.MOE_EXPERTS,
     None),
    ("void topkGatingSoftmax<__nv_bfloat16, 8, 128, 4, 16>(__nv_bfloat16 const*)", cat.ROUTER, "topk"),
    ("moe_fused_gate_kernel", cat.ROUTER, "topk"),
    ("void router_gemm_kernel<__nv_bfloat16, 128, 8, 16, 256, 7168>()", cat.ROUTER, None),
    ("void moe_align_block_size_kernel<int>(int const*)", cat.ROUTER, None),
    ("_moe_sum_reduce_kernel", cat.MOE_EXPERTS, None),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", cat.ALL_REDUCE, None),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", cat.DP_GATHER, None),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", cat.ALL_REDUCE, None),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*)", cat.ALL_REDUCE, None),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>()",
     cat.ALL_REDUCE, "norm"),
    ("void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, float*)", cat.DISPATCH, None),
    ("void deep_ep::legacy::internode_ll::combine<3, 10, 7168, 9>(void*)", cat.COMBINE, None),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(int4*)", cat.COMBINE, None),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", cat.DISPATCH, None),
    ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, dpsk::ep::internode::SourceMeta*)", cat.DISPATCH,
     None),
    ("void dpsk::ep::internode::cached_notify<false>(int, int)", cat.COMBINE, None),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", cat.ELEMENTWISE, "norm"),
    ("kernel_cutlass_kernel_flashinfernormkernelsfused_add_rmsnormFusedAddRMSNormKernel_object_at__tensorptrbf16_0",
     cat.ELEMENTWISE, "norm"),
    ("void (anonymous namespace)::fused_qknorm_warp<128l, true, __nv_bfloat16>()", cat.ELEMENTWISE, None),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", cat.ELEMENTWISE, "norm"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &(float silu<float>(float const&))>()",
     cat.ELEMENTWISE, None),
    ("void per_token_group_quant_8bit_kernel<__nv_bfloat16, c10::Float8_e4m3fn, false>()", cat.ELEMENTWISE, None),
    ("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u>()", cat.ELEMENTWISE, None),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>()", cat.LM_HEAD, None),
    ("create_flashinfer_kv_indices_triton", cat.OVERHEAD, None),
    ("void vllm::vocab_embedding::vocab_parallel_embedding_kernel<>", cat.EMBEDDING, None),
    ("Memcpy HtoD (Pinned -> Device)", OTHER, None),
    ("Memset (Device)", OTHER, None),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", cat.MOE_EXPERTS, None),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda>>",
     cat.ELEMENTWISE, None),
]


@pytest.mark.parametrize("name, module, role", KNOWN)
def test_shipped_rules_classify_known_kernels(name: str, module: str, role: str | None) -> None:
    rule = load_rules().match(name)
    assert rule is not None, name
    assert (rule.module, rule.role) == (module, role), rule.name


def test_shipped_rules_are_valid_and_use_known_modules() -> None:
    rules = shipped_rules()
    assert len(rules) > 30
    assert all(r.module in RULE_MODULES for r in rules)
    assert len({r.name for r in rules}) == len(rules)


def test_place_dependent_rules() -> None:
    table = load_rules()
    index_select = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long>()"
    assert table.module_of(index_select, "before_layers") == cat.EMBEDDING
    assert table.module_of(index_select, "in_layers") == cat.ELEMENTWISE
    softmax = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float>()"
    assert table.module_of(softmax, "after_layers") == cat.LM_HEAD
    assert table.module_of(softmax, "in_layers") == cat.ELEMENTWISE
    norm = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>()"
    assert table.module_of(norm, "after_layers") == cat.LM_HEAD  # the final norm
    assert table.match(norm).role == "norm"  # layers are found without place rules


def test_unknown_kernel_matches_nothing() -> None:
    assert load_rules().match("my_custom_fused_thing_v2") is None
    assert load_rules().module_of("my_custom_fused_thing_v2") == "unmatched"


def test_user_rules_take_precedence(tmp_path: Path) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text("rules:\n"
                    "  - {name: mine.custom, pattern: '^my_custom_fused', module: moe_experts}\n"
                    "  - {name: mine.nvjet_is_ffn, pattern: '^nvjet_tst_64x8', module: dense_ffn}\n")
    table = load_rules([user])
    assert table.match("my_custom_fused_thing_v2").name == "mine.custom"
    assert table.module_of("nvjet_tst_64x8_64x16_4x1_v_bz_TNT") == cat.DENSE_FFN
    assert table.module_of("nvjet_tst_128x64_64x8_2x1_v_bz_TNT") == GEMM  # the shipped rule still applies
    assert table.sources[0] == str(user)


def test_bare_list_user_file(tmp_path: Path) -> None:
    user = tmp_path / "list.yaml"
    user.write_text("- pattern: 'foo'\n  module: other\n")
    rule = load_rules([user]).match("xfoo")
    assert rule.module == OTHER and rule.name == "list.yaml#0"


@pytest.mark.parametrize("text, message", [
    ("rules:\n  - {pattern: '(unclosed', module: router}\n", "rules[0].pattern' (value: '(unclosed'): invalid regular expression"),
    ("rules:\n  - {pattern: 'x', module: mlp}\n", "rules[0].module' (value: 'mlp'): unknown module"),
    ("rules:\n  - {pattern: 'x'}\n", "rules[0].module': required field is missing"),
    ("rules:\n  - {pattern: 'x', module: other, colour: red}\n", "rules[0].colour' (value: 'red'): unknown key"),
    ("rules:\n  - {pattern: 'x', module: other, role: boss}\n", "unknown role"),
    ("rules:\n  - {pattern: 'x', module: other, where: middle}\n", "unknown place"),
    ("rules:\n  - {pattern: 'x', module: other, where: after_layers, role: norm}\n", "cannot have a 'role'"),
    ("rules:\n  - {pattern: '', module: other}\n", "non-empty regular expression"),
    ("rules:\n  - just a string\n", "expected a mapping"),
    ("rules: {pattern: x}\n", "expected a list"),
    ("patterns: []\n", "unknown key"),
    ("", "empty rules file"),
    ("rules: [\n", "malformed YAML"),
])
def test_bad_user_rules_fail_with_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    user = tmp_path / "bad.yaml"
    user.write_text(text)
    with pytest.raises(InferSimError) as info:
        load_rules([user])
    assert str(user) in str(info.value)
    assert message in str(info.value)


def test_missing_rules_file(tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="rules file not found"):
        load_rules([tmp_path / "none.yaml"])


def _one_step_trace() -> tuple[list[dict], list[dict]]:
    """The events of one annotated two-layer prefill step, and its kernel events among them."""
    from tracegen.synthetic import TraceBuilder, dense_step

    builder = TraceBuilder()
    start = builder.cpu_us
    builder.eager(dense_step(2))
    builder.annotation("step[EXTEND bs=1 toks=512]", start, builder.cpu_us + 1)
    events = builder.drain()
    return events, [e for e in events if e.get("cat") == "kernel"]


def _compared(tmp_path: Path, capsys, events: list[dict]) -> tuple[str, float]:
    """`compare --trace` of the events: its output and the step's measured span (ms)."""
    from tracegen.synthetic import write_trace

    from infersim.cli.main import main

    path = tmp_path / "trace.json"
    write_trace(path, events)
    assert main(["compare", "--trace", str(path), "--config", "qwen3-30b.yaml"]) == 0
    out = capsys.readouterr().out
    span = next(line for line in out.splitlines() if line.startswith("step time"))
    return out, float(span.split(":")[1].split()[0].replace(",", ""))


def test_a_kernel_starting_an_hour_after_its_launch_is_dropped_and_said(tmp_path, capsys) -> None:
    """A kernel timestamp an hour past its launch (another clock, a corrupted event) would make the
    step an hour long: it is dropped and counted, and the step is the other kernels' span."""
    events, kernels = _one_step_trace()
    kernels[0]["ts"] = kernels[0]["ts"] + 3.6e9
    out, span_ms = _compared(tmp_path, capsys, events)
    assert "1 GPU event dropped: start more than a minute after the CPU launched them" in out
    assert "before the CPU launched" not in out
    assert span_ms < 10  # the step's own kernels


@pytest.mark.parametrize("shift_us", [-1.7e15, 3.6e9])
def test_a_kernel_without_a_launch_far_from_every_launch_is_dropped_and_said(tmp_path, capsys, shift_us) -> None:
    """A kernel whose correlation names no launch is placed by its time alone; at another clock's
    time (0 among Unix times, an hour past the last launch) it would join the first or last step and
    stretch it by that much: it is dropped and counted instead."""
    events, kernels = _one_step_trace()
    kernel = kernels[0] if shift_us < 0 else kernels[-1]
    kernel["ts"] = kernel["ts"] + shift_us
    kernel["args"] = {"stream": kernel["args"]["stream"]}  # no correlation: no launch of its own
    out, span_ms = _compared(tmp_path, capsys, events)
    assert "1 GPU event dropped: no launch of their own, and a start more than a second before the trace's first " \
           "launch or more than a minute after its last" in out
    assert span_ms < 10  # the step's own kernels
