"""Synthetic traces in SGLang's layout pin the attribution exactly.

A run is written as SGLang does: one gzipped file per rank (`prof-TP-<r>-EP-<r>.trace.json.gz`), an
eager prefill step inside a `step[EXTEND ...]` annotation, decode steps as CUDA-graph replays (one
`cudaGraphLaunch`, no CPU annotations) followed by eager sampling, DeepEP communication on its own
stream overlapping the shared expert. Every duration is chosen here, so every number is known.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.base.errors import InferSimError
from infersim.cards import categories as cat
from infersim.trace import LaneMeasure, StageMeasure, measure_trace
from infersim.trace.rules import load_rules
from tracegen.synthetic import (ACT, ATTN_FA3, COMBINE_LL, DISPATCH_LL, EMBEDDING, FUSED_ADD_RMSNORM, FUSED_MOE,
                                      MEMCPY_HTOD, MOE_SUM, NVJET_LM_HEAD, NVJET_MLP, NVJET_O, NVJET_QKV, RMSNORM,
                                      ROPE, ROUTER_GEMM, SAMPLING, TOPK, KernelSpec, TraceBuilder, dense_step,
                                      metadata_events, write_trace)

US = 1e-6
COMPUTE, COMM = 7, 27


def moe_layer(scale: float = 1.0) -> list[KernelSpec]:
    """A DeepSeek/Qwen-MoE decode layer: DeepEP low-latency dispatch on stream 27 runs while the
    shared expert (27 µs of kernels at scale 1) runs on stream 7; the combine overlaps nothing."""
    def k(name: str, us: float, stream: int = COMPUTE, join: bool = False) -> KernelSpec:
        return KernelSpec(name, us * scale, stream, gap_us=1.0, join=join)
    return [
        k(RMSNORM, 4), k(NVJET_QKV, 30), k(ROPE, 3), k(ATTN_FA3, 50), k(NVJET_O, 20),
        k(FUSED_ADD_RMSNORM, 4), k(ROUTER_GEMM, 10), k(TOPK, 3),
        k(DISPATCH_LL, 40, COMM, join=True),
        k(NVJET_MLP, 15), k(ACT, 2), k(NVJET_MLP, 10),  # shared expert, same start as the dispatch
        k(FUSED_MOE, 30, join=True), k(ACT, 3), k(FUSED_MOE, 20),
        k(COMBINE_LL, 30, COMM, join=True),
        k(MOE_SUM, 2, join=True),
    ]


def decode_graph(layers: int, scale: float = 1.0) -> list[KernelSpec]:
    return [KernelSpec(EMBEDDING, 2 * scale), *[s for _ in range(layers) for s in moe_layer(scale)],
            KernelSpec(RMSNORM, 4 * scale, join=True), KernelSpec(NVJET_LM_HEAD, 25 * scale)]


# per layer at scale 1, µs
MOE_LAYER = {cat.ELEMENTWISE: 4 + 3 + 4 + 2 + 3, cat.ATTN_PROJ: 30 + 20, cat.ATTN_CORE: 50, cat.ROUTER: 10 + 3,
             cat.DISPATCH: 40, cat.SHARED_EXPERT: 15 + 10, cat.MOE_EXPERTS: 30 + 20 + 2, cat.COMBINE: 30}
DENSE_LAYER = {cat.ELEMENTWISE: 4 + 3 + 2 + 4 + 5, cat.ATTN_PROJ: 30 + 20, cat.ATTN_CORE: 1 + 50,
               cat.ALL_REDUCE: 10 + 10, cat.DENSE_FFN: 60 + 40}


def sglang_rank(path: Path, scale: float = 1.0, decode_steps: int = 3, layers: int = 2,
                device: int = 0, builder: TraceBuilder | None = None, write: bool = True) -> TraceBuilder:
    b = builder or TraceBuilder(device=device, cpu_noise=2)
    start = b.cpu_us
    b.eager(dense_step(layers, scale))
    b.annotation("step[EXTEND bs=2 toks=512]", start, b.cpu_us + 1.0)
    for _ in range(decode_steps):
        b.idle(100.0)
        b.graph_replay(decode_graph(layers, scale))
        b.eager([KernelSpec(SAMPLING, 7 * scale, join=True), KernelSpec(MEMCPY_HTOD, 2 * scale)])
    if write:
        write_trace(path, metadata_events(device, streams=(COMPUTE, COMM)) + b.drain())
    return b


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sglang")
    for rank in range(2):
        sglang_rank(directory / f"prof-TP-{rank}-EP-{rank}.trace.json.gz", scale=1.0 + rank)
    return directory


@pytest.fixture(scope="module")
def rank0(run_dir: Path) -> LaneMeasure:
    (lane,) = measure_trace(str(run_dir))
    return lane


def _layer_modules(stage: StageMeasure, layer: int) -> dict[str, float]:
    return {m: round(t / US, 6) for m, t in stage.layers[layer].modules}


def test_default_is_rank_zero_with_both_stages(rank0: LaneMeasure) -> None:
    assert rank0.rank == "TP-0-EP-0"
    assert rank0.path.endswith("prof-TP-0-EP-0.trace.json.gz")
    assert [s.stage for s in rank0.stages] == ["prefill", "decode"]
    assert rank0.outside_steps_kernels == 0


def test_eager_prefill_step_from_sglang_annotation(rank0: LaneMeasure) -> None:
    prefill = rank0.stage("prefill")
    (step,) = prefill.steps
    assert step.label == "step[EXTEND bs=2 toks=512]"
    assert (step.step_source, step.layer_source, step.num_layers) == ("step annotation", "kernel pattern", 2)
    for layer in range(2):
        assert _layer_modules(prefill, layer) == DENSE_LAYER
    modules = {m.module: m for m in prefill.modules}
    assert modules[cat.EMBEDDING].time_s == pytest.approx(3 * US)
    assert modules[cat.LM_HEAD].time_s == pytest.approx((4 + 25 + 6) * US)  # final norm, LM head, softmax
    assert modules[cat.DENSE_FFN].per_layer_s == pytest.approx(100 * US)
    assert modules[cat.LM_HEAD].per_layer_s == pytest.approx(35 * US)  # once per step: per layer = per step
    kernels = 1 + 2 * 13 + 3  # embedding, two layers, final norm + LM head + softmax
    assert step.kernel_time_s == pytest.approx((3 + 2 * sum(DENSE_LAYER.values()) + 35) * US)
    # one stream, 1 µs launch gap before every kernel
    assert step.span_s == pytest.approx(step.kernel_time_s + (kernels - 1) * US)
    assert step.busy_s == pytest.approx(step.kernel_time_s)


def test_cuda_graph_decode_steps_from_the_kernel_sequence(rank0: LaneMeasure) -> None:
    decode = rank0.stage("decode")
    assert len(decode.steps) == 3
    assert all(s.step_source == "CUDA-graph replay" and s.num_layers == 2 for s in decode.steps)
    for layer in range(2):
        assert _layer_modules(decode, layer) == MOE_LAYER
    modules = {m.module: m for m in decode.modules}
    assert modules[cat.EMBEDDING].time_s == pytest.approx(2 * US)
    # final norm and LM head from the graph, sampling from the eager tail of the step
    assert modules[cat.LM_HEAD].time_s == pytest.approx((4 + 25 + 7) * US)
    assert modules["other"].time_s == pytest.approx(2 * US)  # the HtoD copy
    assert modules[cat.ROUTER].per_layer_s == pytest.approx(13 * US)


def test_overlapped_communication_is_split_into_exposed_and_hidden(rank0: LaneMeasure) -> None:
    decode = rank0.stage("decode")
    dispatch, combine = decode.module(cat.DISPATCH), decode.module(cat.COMBINE)
    # dispatch runs 40 µs; the shared expert (15 + 2 + 10 µs, 1 µs gaps) covers 27 of them
    assert dispatch.time_s == pytest.approx(2 * 40 * US)
    assert dispatch.hidden_s == pytest.approx(2 * 27 * US)
    assert dispatch.exposed_s == pytest.approx(2 * 13 * US)
    assert combine.hidden_s == 0.0 and combine.exposed_s == pytest.approx(2 * 30 * US)
    step = decode.steps[0]
    # streams are not added up: busy time is the union, kernel time the sum
    assert step.kernel_time_s - step.busy_s == pytest.approx(2 * 27 * US)
    comm = next(s for s in rank0.streams if s.stream == COMM)
    assert comm.communication_s == pytest.approx(3 * 2 * (40 + 30) * US)


def test_other_rank_and_all_ranks(run_dir: Path) -> None:
    (rank1,) = measure_trace(str(run_dir), rank="1")
    assert rank1.rank == "TP-1-EP-1"
    assert _layer_modules(rank1.stage("decode"), 0) == {m: 2 * t for m, t in MOE_LAYER.items()}
    lanes = measure_trace(str(run_dir / "*.trace.json.gz"), rank="all")
    assert [lane.rank for lane in lanes] == ["TP-0-EP-0", "TP-1-EP-1"]
    with pytest.raises(InferSimError, match="no trace file for TP rank 5"):
        measure_trace(str(run_dir), rank="5")


def test_stage_filter(run_dir: Path) -> None:
    (lane,) = measure_trace(str(run_dir), stage="decode")
    assert [s.stage for s in lane.stages] == ["decode"]


def test_merged_file_with_colliding_correlation_ids(tmp_path: Path) -> None:
    """Two ranks' events in one file: GPU lanes by pid, launches resolved within each process."""
    first = sglang_rank(tmp_path / "unused", write=False, device=0,
                        builder=TraceBuilder(device=0, cpu_pid=100, cpu_tid=100))
    second = sglang_rank(tmp_path / "unused", write=False, scale=3.0, device=1,
                         builder=TraceBuilder(device=1, cpu_pid=200, cpu_tid=200))
    merged = write_trace(tmp_path / "merged-run.trace.json.gz", first.drain() + second.drain())
    lanes = measure_trace(str(merged), rank="all")
    assert [lane.rank for lane in lanes] == ["GPU 0", "GPU 1"]
    for lane, scale in zip(lanes, (1.0, 3.0)):
        assert [s.stage for s in lane.stages] == ["prefill", "decode"]
        assert _layer_modules(lane.stage("prefill"), 1) == {m: scale * t for m, t in DENSE_LAYER.items()}
        assert _layer_modules(lane.stage("decode"), 1) == {m: scale * t for m, t in MOE_LAYER.items()}
    (only,) = measure_trace(str(merged), rank="1")
    assert only.rank == "GPU 1"
    with pytest.raises(InferSimError, match="no GPU 4"):
        measure_trace(str(merged), rank="4")


def test_stage_from_file_name_and_eager_decode(tmp_path: Path) -> None:
    """--disable-cuda-graph decode without step annotations; the stage comes from the file name."""
    prefill = TraceBuilder()
    prefill.eager(dense_step(2))
    write_trace(tmp_path / "p-TP-0-EXTEND.trace.json.gz", prefill.drain())
    decode = TraceBuilder()
    for _ in range(2):
        decode.eager(dense_step(2, scale=0.5))
        decode.idle(50.0)
    write_trace(tmp_path / "p-TP-0-DECODE.trace.json.gz", decode.drain())
    (lane,) = measure_trace(str(tmp_path), layers_per_step=2)
    assert [s.stage for s in lane.stages] == ["prefill", "decode"]
    assert len(lane.stage("decode").steps) == 2
    for step in lane.stage("decode").steps:
        assert step.num_layers == 2
        modules = {m.module: m.time_s for m in step.modules}
        # each pass keeps its own LM head and softmax, and the next pass its embedding
        assert modules[cat.LM_HEAD] == pytest.approx((4 + 25 + 6) / 2 * US)
        assert modules[cat.EMBEDDING] == pytest.approx(3 / 2 * US)
    assert _layer_modules(lane.stage("decode"), 0) == {m: t / 2 for m, t in DENSE_LAYER.items()}
    (unsplit,) = measure_trace(str(tmp_path / "p-TP-0-DECODE.trace.json.gz"))
    assert unsplit.stage("decode").num_layers == 4  # without --layers-per-step: one step of 4 layers


def test_graph_replays_without_cpu_activities(tmp_path: Path) -> None:
    """Profiles with CPU activities off have no launches: shared correlation ids still mark graphs."""
    b = TraceBuilder()
    for _ in range(2):
        b.graph_replay(decode_graph(3), with_launch=False)
        b.idle(50.0)
    (lane,) = measure_trace(str(write_trace(tmp_path / "gpu-only.json", b.drain(), bare_list=True)))
    (decode,) = lane.stages
    assert decode.stage == "decode" and len(decode.steps) == 2 and decode.num_layers == 3
    assert _layer_modules(decode, 2) == MOE_LAYER


def test_unmatched_kernels_are_listed_and_counted_then_fixed_by_a_user_rule(tmp_path: Path) -> None:
    b = TraceBuilder()
    specs = dense_step(2)
    specs.insert(5, KernelSpec("my_custom_fused_gate_v2", 7.0))  # inside layer 0's attention
    b.eager(specs)
    path = write_trace(tmp_path / "custom-TP-0.trace.json", b.drain())
    (lane,) = measure_trace(str(path))
    (stage,) = lane.stages
    assert [(u.name, u.count, round(u.time_s / US, 6)) for u in stage.unmatched] == [("my_custom_fused_gate_v2", 1, 7.0)]
    assert stage.module("unmatched").time_s == pytest.approx(7 * US)  # never dropped
    rules = tmp_path / "mine.yaml"
    rules.write_text("rules:\n  - {pattern: '^my_custom_fused_gate', module: attn_proj}\n")
    (fixed,) = measure_trace(str(path), rules=load_rules([rules]))
    assert fixed.stages[0].unmatched == ()
    assert _layer_modules(fixed.stages[0], 0)[cat.ATTN_PROJ] == 50 + 7


def test_trace_without_attention_has_no_step(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.eager([KernelSpec(NVJET_MLP, 5.0), KernelSpec(ACT, 1.0)])
    (lane,) = measure_trace(str(write_trace(tmp_path / "mlp-only.json", b.drain())))
    assert lane.stages == ()
    assert lane.outside_steps_kernels == 2
    assert "no forward step found" in lane.notes[0]


def test_trace_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="no trace files"):
        measure_trace(str(tmp_path))
    with pytest.raises(InferSimError, match="no such file"):
        measure_trace(str(tmp_path / "missing.json.gz"))
    with pytest.raises(InferSimError, match="no file matches"):
        measure_trace(str(tmp_path / "*.trace.json.gz"))
    (tmp_path / "broken-TP-0.trace.json").write_text('{"traceEvents": [{"ph": "X", ')
    with pytest.raises(InferSimError, match=r"broken-TP-0\.trace\.json: truncated"):
        measure_trace(str(tmp_path))


def test_mla_decode_with_fused_allreduce_norm_layer_boundaries(tmp_path: Path) -> None:
    """DeepSeek-style MLA decode under TP with flashinfer all-reduce fusion: the fused all-reduce +
    residual + RMSNorm kernel ends each half-layer; q_a / kv_a norms inside attention do not."""
    fused_a = "void dsv3_fused_a_gemm_kernel<128, 8, 7168, 2112>()"
    q_a_norm = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(q_a)"
    ar_norm = "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>()"
    mla = "void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>>(Flash_fwd_mla_params)"
    mla_combine = "void flash::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 64>(Flash_fwd_mla_params)"
    kv_write = "set_mla_kv_buffer_kernel"

    def layer(first: bool) -> list[KernelSpec]:
        start = KernelSpec(RMSNORM if first else ar_norm, 6.0)
        return [start, KernelSpec(fused_a, 11.0), KernelSpec(q_a_norm, 2.0), KernelSpec(q_a_norm, 2.0),
                KernelSpec(NVJET_QKV, 13.0), KernelSpec(NVJET_O, 7.0), KernelSpec(ROPE, 3.0), KernelSpec(kv_write, 2.0),
                KernelSpec(mla, 40.0), KernelSpec(mla_combine, 5.0), KernelSpec(NVJET_O, 6.0),
                KernelSpec(NVJET_O, 17.0), KernelSpec(ar_norm, 9.0), KernelSpec(NVJET_MLP, 50.0), KernelSpec(ACT, 4.0),
                KernelSpec(NVJET_MLP, 30.0)]

    graph = [KernelSpec(EMBEDDING, 2.0), KernelSpec("get_mla_metadata_kernel", 1.0),
             *layer(True), *layer(False), *layer(False), KernelSpec(ar_norm, 8.0), KernelSpec(NVJET_LM_HEAD, 20.0)]
    b = TraceBuilder()
    b.graph_replay(graph)
    (lane,) = measure_trace(str(write_trace(tmp_path / "mla-TP-0.trace.json.gz", b.drain())))
    (decode,) = lane.stages
    assert decode.num_layers == 3
    assert _layer_modules(decode, 1) == {
        cat.ALL_REDUCE: 6 + 9,  # this layer's input all-reduce+norm and its post-attention one
        cat.ATTN_PROJ: 11 + 13 + 7 + 6 + 17,  # fused q_a/kv_a, q_b, absorb BMMs, o_proj
        cat.ELEMENTWISE: 2 + 2 + 3 + 2 + 4,  # q_a / kv_a norms, rope, MLA KV write, activation
        cat.ATTN_CORE: 40 + 5,
        cat.DENSE_FFN: 50 + 30,
    }
    assert _layer_modules(decode, 0)[cat.ELEMENTWISE] == 6 + 2 + 2 + 3 + 2 + 4  # plain input RMSNorm in layer 0
    modules = {m.module: m.time_s / US for m in decode.modules}
    assert modules[cat.LM_HEAD] == pytest.approx(20.0)
    assert modules[cat.ATTN_CORE] == pytest.approx(3 * 45 + 1)  # the per-step MLA metadata kernel too
    assert modules[cat.ALL_REDUCE] == pytest.approx(9 + 2 * (6 + 9) + 8)  # layer 0 starts with a plain norm
