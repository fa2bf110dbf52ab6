"""Synthetic Kineto traces in SGLang's layout, for tests and the parse-rate benchmark.

`TraceBuilder` lays out what the PyTorch profiler would record: a CPU thread with user
annotations and launch calls (`cudaLaunchKernel` with a correlation id), the GPU kernels those
launches start (same correlation, `args.stream`), CUDA-graph replays (one `cudaGraphLaunch`,
every kernel of the graph sharing its correlation and no CPU annotations), plus the CPU noise
(`cpu_op`, `python_function`, flow arrows) that makes up most of a real trace. Times are
microseconds, as in the file.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPU_PID = 1000
CPU_TID = 1000


@dataclass(frozen=True)
class KernelSpec:
    """One kernel to place: name, duration (µs), stream; `gap_us` idle time before it; `join` makes
    it wait for every stream (an event wait), so tests can lay out exact cross-stream overlap."""

    name: str
    dur_us: float
    stream: int = 7
    gap_us: float = 1.0
    join: bool = False


class TraceBuilder:
    def __init__(self, device: int = 0, cpu_pid: int = CPU_PID, cpu_tid: int = CPU_TID,
                 start_us: float = 1_700_000_000_000_000.0, first_correlation: int = 1,
                 cpu_noise: int = 0) -> None:
        self.device = device
        self.cpu_pid = cpu_pid
        self.cpu_tid = cpu_tid
        self.cpu_us = start_us  # CPU clock: launches happen here
        self.gpu_us = start_us + 5.0  # GPU clock per stream runs behind the CPU
        self.stream_free: dict[int, float] = {}
        self.correlation = first_correlation
        self.cpu_noise = cpu_noise  # python_function / cpu_op events added per launch
        self.events: list[dict[str, Any]] = []

    # -- primitives ------------------------------------------------------------------------------

    def _next_correlation(self) -> int:
        corr = self.correlation
        self.correlation += 1
        return corr

    def annotation(self, name: str, start_us: float, end_us: float, tid: int | None = None) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.cpu_pid,
                            "tid": self.cpu_tid if tid is None else tid, "ts": start_us, "dur": end_us - start_us,
                            "args": {"External id": self._next_correlation()}})

    def _noise(self, at_us: float) -> None:
        for i in range(self.cpu_noise):
            self.events.append({"ph": "X", "cat": "python_function", "name": f"sglang/srt/layers/linear.py(123): forward_{i}",
                                "pid": self.cpu_pid, "tid": self.cpu_tid, "ts": at_us - 0.5 + i * 0.01, "dur": 0.4,
                                "args": {"Python parent id": 10 + i, "Python id": 11 + i, "Python thread": 0}})
            self.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": self.cpu_pid,
                                "tid": self.cpu_tid, "ts": at_us - 0.4 + i * 0.01, "dur": 0.3,
                                "args": {"External id": 900 + i, "Record function id": 0, "Ev Idx": i}})

    def _gpu_event(self, name: str, start: float, dur: float, stream: int, corr: int, cat: str = "kernel") -> None:
        args: dict[str, Any] = {"External id": corr, "device": self.device, "context": 1, "stream": stream,
                                "correlation": corr}
        if cat == "kernel":
            args.update({"registers per thread": 32, "shared memory": 0, "grid": [132, 1, 1], "block": [128, 1, 1]})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream,
                            "ts": start, "dur": dur, "args": args})

    def _place(self, spec: KernelSpec, not_before: float) -> float:
        ready = max(self.stream_free.values(), default=self.gpu_us) if spec.join else \
            self.stream_free.get(spec.stream, self.gpu_us)
        start = max(ready, self.gpu_us, not_before) + spec.gap_us
        self.stream_free[spec.stream] = start + spec.dur_us
        return start

    # -- what tests and the benchmark use --------------------------------------------------------

    def launch(self, spec: KernelSpec, api: str = "cudaLaunchKernel", cat: str = "kernel",
               tid: int | None = None) -> tuple[int, float]:
        """An eager launch: CPU call now, the kernel when its stream is free. Returns (corr, start)."""
        corr = self._next_correlation()
        self.cpu_us += 2.0
        self._noise(self.cpu_us)
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": self.cpu_pid,
                            "tid": self.cpu_tid if tid is None else tid, "ts": self.cpu_us, "dur": 1.5,
                            "args": {"External id": corr, "cbid": 211, "correlation": corr}})
        self.events.append({"ph": "s", "id": corr, "pid": self.cpu_pid, "tid": self.cpu_tid, "ts": self.cpu_us,
                            "cat": "ac2g", "name": "ac2g"})
        start = self._place(spec, self.cpu_us + 1.0)
        self._gpu_event(spec.name, start, spec.dur_us, spec.stream, corr, cat)
        return corr, start

    def eager(self, specs: Iterable[KernelSpec]) -> list[float]:
        return [self.launch(spec)[1] for spec in specs]

    def graph_replay(self, specs: Sequence[KernelSpec], with_launch: bool = True) -> int:
        """One cudaGraphLaunch: all kernels share its correlation and carry no CPU context."""
        corr = self._next_correlation()
        self.cpu_us += 3.0
        if with_launch:
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": self.cpu_pid,
                                "tid": self.cpu_tid, "ts": self.cpu_us, "dur": 8.0,
                                "args": {"External id": corr, "cbid": 311, "correlation": corr}})
        not_before = self.cpu_us + 2.0
        for spec in specs:
            start = self._place(spec, not_before)
            self._gpu_event(spec.name, start, spec.dur_us, spec.stream, corr)
        return corr

    def idle(self, us: float) -> None:
        """Advance both clocks (scheduler time between steps)."""
        end = max([self.cpu_us, self.gpu_us, *self.stream_free.values()]) + us
        self.cpu_us = self.gpu_us = end
        self.stream_free = {s: end for s in self.stream_free}

    def gpu_end(self) -> float:
        return max([self.gpu_us, *self.stream_free.values()])

    def drain(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out


def metadata_events(device: int = 0, cpu_pid: int = CPU_PID, streams: Iterable[int] = (7,)) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": cpu_pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": device, "tid": 0, "args": {"labels": f"GPU {device}"}},
    ]
    out += [{"name": "thread_name", "ph": "M", "ts": 0, "pid": device, "tid": s, "args": {"name": f"stream {s} "}}
            for s in streams]
    return out


def write_trace(path: str | Path, events: Iterable[dict[str, Any]], *, compress: bool | None = None,
                top_level: dict[str, Any] | None = None, bare_list: bool = False) -> Path:
    """Write events as Kineto does (one event per line); gzip when the name ends in .gz."""
    path = Path(path)
    compress = path.name.endswith(".gz") if compress is None else compress
    opener = gzip.open if compress else open
    head = top_level if top_level is not None else {
        "schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    with opener(path, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        if bare_list:
            out.write("[\n")
        else:
            out.write("{\n")
            for key, value in head.items():
                out.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
            out.write('  "traceEvents": [\n')
        first = True
        for event in events:
            out.write(("  " if first else ",\n  ") + json.dumps(event))
            first = False
        out.write("\n]" if bare_list else '\n  ],\n  "traceName": "synthetic"\n}\n')
    return path


# -- model layer recipes used by the tests and the benchmark --------------------------------------

ATTN_FA3 = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float> > > >(flash::FlashAttnFwdSm90<...>::Params)"
FA3_PREPARE = "void flash::prepare_varlen_num_blocks_kernel<1, true>(int, int, int, int const*, int const*, int const*, int const*, int const*, int const*, int, int, int, int, int, cutlass::FastDivmod, cutlass::FastDivmod, int*, int*, bool)"
RMSNORM = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)"
FUSED_ADD_RMSNORM = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)"
NVJET_QKV = "nvjet_tst_128x64_64x8_2x1_v_bz_TNT"
NVJET_O = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
NVJET_MLP = "nvjet_tst_192x8_64x5_2x1_v_bz_TNT"
NVJET_LM_HEAD = "nvjet_tst_384x8_64x4_1x2_h_bz_TNT"
ROPE = "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*, long*, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int)"
KV_STORE = "void (anonymous namespace)::store_kvcache<256l, 1, false, long>(void*, void*, void const*, void const*, long const*, long, long, long, long, long)"
ACT = "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &(float silu<float>(float const&))>(__nv_bfloat16*, __nv_bfloat16 const*, int)"
ALL_REDUCE = "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, __nv_bfloat16*, int, int)"
EMBEDDING = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
SAMPLING = "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::CUB_200200_900_NS::BlockScanAlgorithm)0, (cub::CUB_200200_900_NS::BlockReduceAlgorithm)2, 4u, false, float, int>(float*, int*, int*, float*, int*, float*, unsigned int, unsigned int, unsigned int)"
ROUTER_GEMM = "nvjet_tst_64x8_64x16_2x1_v_bz_TNN"
TOPK = "void topkGatingSoftmax<__nv_bfloat16, 8, 128, 4, 16>(__nv_bfloat16 const*, bool const*, float*, int, int*, int*, int, int, int)"
MOE_ALIGN = "void moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long)"
FUSED_MOE = "fused_moe_kernel"
MOE_SUM = "_moe_sum_reduce_kernel"
DISPATCH_LL = "void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, float*, int*, long*, void*, int*, void*, int*, long*, void const*, long const*, int*, int*, int, int, int, int, int, int, int, int, bool, bool)"
COMBINE_LL = "void deep_ep::internode_ll::combine<3, 10, 7168, 9>(void*, void*, int*, void*, void const*, long const*, int const*, int const*, int*, int*, int, int, int, int, int, int, int, int, int, bool, bool)"
MEMCPY_HTOD = "Memcpy HtoD (Pinned -> Device)"


def dense_layer(scale: float = 1.0, stream: int = 7) -> list[KernelSpec]:
    """A Llama-style TP layer as SGLang launches it. Durations scale with `scale`."""
    def k(name: str, us: float) -> KernelSpec:
        return KernelSpec(name, us * scale, stream)
    return [k(RMSNORM, 4), k(NVJET_QKV, 30), k(ROPE, 3), k(KV_STORE, 2), k(FA3_PREPARE, 1), k(ATTN_FA3, 50),
            k(NVJET_O, 20), k(ALL_REDUCE, 10), k(FUSED_ADD_RMSNORM, 4), k(NVJET_MLP, 60), k(ACT, 5),
            k(NVJET_MLP, 40), k(ALL_REDUCE, 10)]


def dense_step(layers: int, scale: float = 1.0) -> list[KernelSpec]:
    """Embedding, `layers` dense layers, final norm, LM head, softmax."""
    return [KernelSpec(EMBEDDING, 3 * scale), *[spec for _ in range(layers) for spec in dense_layer(scale)],
            KernelSpec(FUSED_ADD_RMSNORM, 4 * scale), KernelSpec(NVJET_LM_HEAD, 25 * scale),
            KernelSpec(SOFTMAX, 6 * scale)]
