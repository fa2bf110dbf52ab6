"""A GPU trace synthesised from a real CPU trace: test data for attribution, steps and tables.

No GPU was available when this was written, so the test traces of HF transformers models are
built in two halves:

1. the CPU side is *recorded*: `benchmarks/gpu/record_traces.py` runs the model on a CPU under
   `torch.profiler` with `record_shapes=True, with_stack=True` (every `cpu_op` with its input
   shapes, every Python frame with the `nn.Module` frames, the user's `record_function` regions);
2. the GPU side is *synthesised* here, as PyTorch on an H100 would record it: each CPU operator
   that does work on the device gets a `cudaLaunchKernel` inside it and a kernel on stream 7 with
   the same `correlation`, named as the CUDA build of PyTorch names it (cuBLAS `nvjet_sm90_tst_*`,
   cuDNN `cudnn_generated_fort_native_sdpa_sm90_*`, `CatArrayBatchedCopy`, `reduce_kernel<...MeanOps`,
   CUTLASS grouped GEMM, ATen elementwise kernels). Only the CPU-only dispatch of attention is
   renamed to the CUDA one (`_scaled_dot_product_flash_attention_for_cpu` ->
   `_scaled_dot_product_cudnn_attention`). Durations come from a simple H100 cost model (below);
   the CPU side is re-timed as an eager launch loop (a few microseconds per operator and frame,
   the CPU waiting for the GPU at the end of each user region, where the recording synchronises).

`mode="compiled"` rewrites the same kernels as torch.compile (Inductor) would launch them: runs of
elementwise work between GEMMs / attention fused into Triton kernels named after the ATen ops
they fuse (`triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3` is a norm), launched with
`cuLaunchKernel` from CPU operators of the same name inside `Torch-Compiled Region: 0/0`, GEMMs as
extern `aten::mm`, no nn.Module frames. `mode="graphs"` replays each step's kernels from one
`cudaGraphLaunch` (all sharing its correlation, as CUDA-graph replays do).

The cost model (microseconds; H100 SXM, bf16) is deliberately independent of the simulator's:
GEMM max(2 m_pad k n / 712 TFLOP/s, bytes / 2.85 TB/s) + 3 (m padded to 64 rows);
attention max(causal FLOPs / 544 TFLOP/s, bytes / 2.85 TB/s) + 4; grouped GEMM
max(FLOPs / 593 TFLOP/s, active experts' weight bytes / 2.68 TB/s) + 6 (active experts: those R routed
rows hit under uniform routing, E (1 - (1 - 1/E)^R), each padded to 64 rows); elementwise and reductions
bytes / 2.0 TB/s + 2: the bytes each kernel reads and writes (a torch.cat's TensorList, whose element
type the profiler does not record, at 2 bytes per element) at 60% of the 3.35 TB/s HBM3 peak, what
ATen's vectorised elementwise kernels stream at, over a 2 us floor (the shortest kernels an H100 runs,
launch and tail included). GPU side: a kernel starts 5 after its launch call when the GPU is idle
(launch latency), 1 after the previous kernel on a busy stream (0.4 inside a CUDA-graph replay).
CPU side (the eager launch loop): 4 per operator that launches, before its launch call, 3 per
cudaLaunchKernel, 1.5 per operator that launches nothing, 1 per Python frame, 4 per nn.Module call, 2
per annotation, the GPU waited for at the end of each user region. The recording's own CPU times are
not kept (they are a CPU running the kernels' work itself), so the host costs these traces carry are
this model's.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infersim.trace.operators import GEMM_OP, GROUPED_GEMM_OP, op_class

DEVICE_NAME = "NVIDIA H100 80GB HBM3"
DEVICE_PROPERTIES = [{"id": 0, "name": DEVICE_NAME, "totalGlobalMem": 85520809984, "computeMajor": 9,
                      "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                      "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
                      "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
                      "sharedMemPerMultiprocessor": 233472}]
STREAM = 7

# the cost model (see the module docstring)
PEAK_BF16 = 989.4e12
GEMM_RATE = PEAK_BF16 * 0.72
ATTENTION_RATE = PEAK_BF16 * 0.55
GROUPED_RATE = PEAK_BF16 * 0.60
HBM = 3.35e12
GEMM_BANDWIDTH = HBM * 0.85
GROUPED_BANDWIDTH = HBM * 0.80
ELEMENTWISE_BANDWIDTH = 2.0e12
GEMM_FIXED_US, ATTENTION_FIXED_US, GROUPED_FIXED_US, ELEMENTWISE_FIXED_US = 3.0, 4.0, 6.0, 2.0
LAUNCH_LATENCY_US = 5.0  # kernel start after its launch call starts
KERNEL_GAP_US = 1.0  # back-to-back kernels on one stream
GRAPH_GAP_US = 0.4  # back-to-back kernels of a CUDA-graph replay

# the CPU side of an eager launch loop (microseconds)
FRAME_US = 1.0  # a Python frame
MODULE_FRAME_US = 4.0  # an nn.Module call (hooks, __call__)
OP_US = 1.5  # an ATen operator that launches nothing
LAUNCH_OP_US = 4.0  # an operator that launches, before the launch call
LAUNCH_CALL_US = 3.0  # cudaLaunchKernel
ANNOTATION_US = 2.0

_ELEMENT_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "bool": 1,
                  "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1}
_RENAMED_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_cudnn_attention"}
# leaf operators that launch nothing on a GPU either
_NO_KERNEL = frozenset({"aten::resize_", "aten::lift_fresh", "aten::detach_", "aten::alias", "aten::clone",
                        "aten::contiguous", "aten::zeros", "aten::ones", "aten::full", "aten::to",
                        "aten::_to_copy", "aten::empty", "aten::empty_like", "aten::empty_strided",
                        "aten::scalar_tensor", "aten::zeros_like", "aten::ones_like", "aten::new_zeros"})
# operators that make the CPU wait for the GPU (a device-to-host copy of a count or a value)
_SYNCING = frozenset({"aten::nonzero", "aten::_local_scalar_dense", "aten::item", "aten::masked_select",
                      "aten::unique", "aten::_unique2", "aten::bincount", "aten::repeat_interleave"})

_EW = "void at::native::vectorized_elementwise_kernel<4, {functor}, std::array<char*, {arity}ul> >(int, {functor}, std::array<char*, {arity}ul>)"
_REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, {ops}, unsigned int, {out}, 4, 4> >"
           "(at::native::ReduceOp<float, {ops}, unsigned int, {out}, 4, 4>)")
_KERNEL_NAMES: dict[str, str] = {
    "add": _EW.format(functor="at::native::CUDAFunctor_add<c10::BFloat16>", arity=3),
    "add_": _EW.format(functor="at::native::CUDAFunctorOnSelf_add<c10::BFloat16>", arity=2),
    "sub": _EW.format(functor="at::native::CUDAFunctor_sub<c10::BFloat16>", arity=3),
    "mul": _EW.format(functor="at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
                              "at::native::binary_internal::MulFunctor<float> >", arity=3),
    "mul_": _EW.format(functor="at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
                               "at::native::binary_internal::MulFunctor<float> >", arity=2),
    "div": _EW.format(functor="at::native::BinaryFunctor<float, float, float, at::native::binary_internal::DivFunctor<float> >",
                      arity=3),
    "div_": _EW.format(functor="at::native::BinaryFunctor<float, float, float, at::native::binary_internal::DivFunctor<float> >",
                       arity=3),
    "pow": _EW.format(functor="at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<float, float>"
                              "(at::TensorIteratorBase&, float)::{lambda(float)#2}", arity=2),
    "rsqrt": _EW.format(functor="at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
                                "const::{lambda()#2}::operator()() const::{lambda(float)#1}", arity=2),
    "silu": _EW.format(functor="at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}"
                               "::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}",
                       arity=2),
    "neg": _EW.format(functor="at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
                              "const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}", arity=2),
    "cos": _EW.format(functor="at::native::cos_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
                              "const::{lambda()#2}::operator()() const::{lambda(float)#1}", arity=2),
    "sin": _EW.format(functor="at::native::sin_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
                              "const::{lambda()#2}::operator()() const::{lambda(float)#1}", arity=2),
    "copy_": ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
              "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
              "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
              "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, ...)"),
    "fill_": _EW.format(functor="at::native::FillFunctor<c10::BFloat16>", arity=1),
    "zero_": _EW.format(functor="at::native::FillFunctor<float>", arity=1),
    "mean": _REDUCE.format(ops="at::native::MeanOps<float, float, float, float>", out="float"),
    "sum": _REDUCE.format(ops="at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()"
                              "(at::TensorIterator&)::{lambda(float, float)#1}>", out="float"),
    "argmax": _REDUCE.format(ops="at::native::ArgMaxOps<float>", out="long"),
    "max": _REDUCE.format(ops="at::native::MaxOps<float>", out="float"),
    "cat": ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
            "unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, "
            "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, "
            "unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"),
    "index_select": ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
                     "-2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo"
                     "<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, "
                     "unsigned int, unsigned int, long)"),
    "_softmax": ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                 "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"),
    "index_copy_": "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>(...)::{lambda(int)#1}>(long, ...)",
    "index_put_": "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>(...)::{lambda(int)#1}>(long, ...)",
    "index_add_": "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true, at::native::ReduceAdd>(...)",
    "index": "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>(...)::{lambda(int)#1}>(long, ...)",
    "histc": "void at::cuda::kernelHistogram1D<float, float, long, 1, 2, -1, (at::cuda::CUDAHistogramMemoryType)0>(...)",
    "cumsum": "void at::native::tensor_kernel_scan_innermost_dim<long, std::plus<long> >(long*, long const*, unsigned int, unsigned int, unsigned int, long, std::plus<long>)",
    "random_": ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<unsigned int, 4, "
                "at::native::templates::cuda::random_from_to_kernel<at::CUDAGeneratorImpl*>(...)>(...)"),
    "arange": "void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out(...)::{lambda()#1}::operator()() const::{lambda()#3}::operator()() const::{lambda(long)#1}>(int, ...)",
    "gather": "void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_internal_kernel<false, c10::BFloat16>::operator()(...)::{lambda(int)#1}>(int, ...)",
    "scatter": "void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_internal_kernel<true, long>::operator()(...)::{lambda(int)#1}>(int, ...)",
    "nonzero": "void at::native::flag_kernel<512, 16, unsigned char>(unsigned char const*, long*, long, long, int)",
}
_TOPK_KERNELS = ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, unsigned int>, ...)",
                 "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>(...)")
_SORT_KERNEL = "void at::native::radixSortKVInPlace<2, -1, 32, 4, long, long, unsigned int>(...)"
_NVJET = "nvjet_sm90_tst_{tile}_{stages}_v_bz_{layout}"
_CUDNN_SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_{knob}_64x64x128_4x1x1_kernel0_0"
_GROUPED = ("void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::GemmUniversal"
            "<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<"
            "cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecializedCooperative<4, cute::tuple<cute::C<2>, cute::C<1>, "
            "cute::C<1> >, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>, cutlass::bfloat16_t, ...> > > >"
            "(cutlass::gemm::kernel::GemmUniversal<...>::Params)")


# ---------------------------------------------------------------------------------------------
# The cost model


def _tensor_bytes(dims: Any, dtype: Any) -> float:
    """Bytes of one recorded input: a tensor, or a TensorList (torch.cat's inputs), whose element type
    the profiler does not record: its tensors are taken as 2-byte (bf16) elements."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        return sum(_tensor_bytes(d, "") for d in dims)
    if not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return 0.0
    return float(math.prod(dims)) * _ELEMENT_BYTES.get(dtype, 2)


def _input_bytes(args: dict[str, Any]) -> list[float]:
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    return [_tensor_bytes(d, types[i] if i < len(types) else "") for i, d in enumerate(dims)]


def gemm_us(m: float, k: float, n: float, batch: float = 1.0) -> float:
    m_pad = math.ceil(max(m, 1) / 64) * 64
    compute = 2.0 * batch * m_pad * k * n / GEMM_RATE
    memory = batch * (m * k + k * n + m * n) * 2 / GEMM_BANDWIDTH
    return max(compute, memory) * 1e6 + GEMM_FIXED_US


def attention_us(batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, dim: int) -> float:
    pairs = q_len * kv_len - (q_len * (q_len - 1) / 2 if q_len > 1 else 0)  # causal: the upper triangle is skipped
    flops = 4.0 * batch * heads * pairs * dim
    memory = batch * (2 * heads * q_len * dim + 2 * kv_heads * kv_len * dim) * 2
    return max(flops / ATTENTION_RATE, memory / GEMM_BANDWIDTH) * 1e6 + ATTENTION_FIXED_US


def grouped_us(rows: int, experts: int, k: int, n: int) -> float:
    # experts whose weights are read: the expected distinct experts `rows` routed rows hit under uniform
    # routing (random weights route about evenly), E (1 - (1 - 1/E)^rows); not min(E, rows), which takes
    # every routed row to a different expert (8 rows over 8 experts hit 5.3 of them, not 8)
    active = experts * (1.0 - (1.0 - 1.0 / experts) ** max(rows, 1)) if experts > 0 else 1.0
    rows_pad = max(rows, active * 64) if rows < active * 64 else rows
    flops = 2.0 * rows_pad * k * n
    memory = active * k * n * 2 + rows * (k + n) * 2
    return max(flops / GROUPED_RATE, memory / GROUPED_BANDWIDTH) * 1e6 + GROUPED_FIXED_US


def elementwise_us(moved_bytes: float) -> float:
    return moved_bytes / ELEMENTWISE_BANDWIDTH * 1e6 + ELEMENTWISE_FIXED_US


@dataclass(frozen=True)
class KernelSpec:
    name: str
    dur_us: float
    category: str = "kernel"  # kernel / gpu_memcpy / gpu_memset
    api: str = "cudaLaunchKernel"


def _nvjet(m: float, layout: str = "TNT") -> str:
    if m <= 64:
        return _NVJET.format(tile="64x8", stages="64x16_4x1", layout=layout)
    if m <= 512:
        return _NVJET.format(tile="128x64", stages="64x8_2x1", layout=layout)
    return _NVJET.format(tile="256x128", stages="64x4_2x1", layout=layout)


def kernels_for(op_name: str, args: dict[str, Any]) -> list[KernelSpec]:
    """The kernels a CUDA build of PyTorch launches for one leaf operator, with their durations."""
    base = op_name.split("::", 1)[-1]
    dims = args.get("Input Dims") or []
    cls = op_class(op_name)
    try:
        if base in ("mm", "addmm", "_scaled_mm"):
            a, b = (dims[1], dims[2]) if base == "addmm" else (dims[0], dims[1])
            return [KernelSpec(_nvjet(a[0]), gemm_us(a[0], a[1], b[1]))]
        if base in ("bmm", "baddbmm"):
            a, b = (dims[1], dims[2]) if base == "baddbmm" else (dims[0], dims[1])
            return [KernelSpec(_nvjet(a[1], "NNT"), gemm_us(a[1], a[2], b[2], a[0]))]
        if "scaled_dot_product" in base and "cudnn" in base:
            q, k = dims[0], dims[1]
            knob = 3 if q[2] > 1 else 7
            return [KernelSpec(_CUDNN_SDPA.format(knob=knob), attention_us(q[0], q[1], k[1], q[2], k[2], q[3]))]
        if cls == GROUPED_GEMM_OP:
            x, w = dims[0], dims[1]
            k = x[1]
            n = w[2] if w[1] == k else w[1]
            return [KernelSpec(_GROUPED, grouped_us(x[0], w[0], k, n))]
        if cls == GEMM_OP:
            return []  # linear / matmul: the mm inside launches
    except (IndexError, TypeError):
        return [KernelSpec(_nvjet(64), GEMM_FIXED_US)]
    sizes = _input_bytes(args)
    largest = max(sizes, default=0.0)
    if base == "_local_scalar_dense":  # .item(): a device-to-host copy of one value, then the CPU waits
        return [KernelSpec("Memcpy DtoH (Device -> Pageable)", 1.5, "gpu_memcpy")]
    if base == "topk":
        return [KernelSpec(name, elementwise_us(largest) + 1.0) for name in _TOPK_KERNELS]
    if base in ("sort", "argsort"):
        return [KernelSpec(_SORT_KERNEL, elementwise_us(2 * largest) + 2.0)]
    if base == "cat":
        return [KernelSpec(_KERNEL_NAMES["cat"], elementwise_us(2 * sum(sizes)))]
    if base in ("mean", "sum", "argmax", "max", "amax"):
        return [KernelSpec(_KERNEL_NAMES.get(base, _KERNEL_NAMES["sum"]), elementwise_us(largest) + 1.0)]
    if base == "copy_":
        return [KernelSpec(_KERNEL_NAMES["copy_"], elementwise_us(sum(sizes)))]
    if base == "index_select":
        out = _tensor_bytes([(dims[2] or [1])[0], (dims[0] or [1, 1])[-1]], "c10::BFloat16") if len(dims) > 2 else 0.0
        return [KernelSpec(_KERNEL_NAMES["index_select"], elementwise_us(2 * out))]
    name = _KERNEL_NAMES.get(base)
    if name is None:
        functor = f"at::native::{base.rstrip('_')}_kernel_cuda(at::TensorIteratorBase&)::{{lambda()#1}}"
        name = _EW.format(functor=functor, arity=2)
    moved = largest * 2 if base in ("fill_", "zero_", "random_", "arange") else sum(sizes) + largest
    return [KernelSpec(name, elementwise_us(moved))]


# ---------------------------------------------------------------------------------------------
# Re-timing the CPU side and placing the GPU side


@dataclass
class _Node:
    event: dict[str, Any]
    children: list[_Node] = field(default_factory=list)

    @property
    def cat(self) -> str:
        return self.event.get("cat", "")

    @property
    def end(self) -> float:
        return float(self.event["ts"]) + float(self.event.get("dur", 0.0))


def _tree(events: list[dict[str, Any]]) -> list[_Node]:
    events = sorted(events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
    roots: list[_Node] = []
    stack: list[_Node] = []
    for event in events:
        node = _Node(event)
        start = float(event["ts"])
        while stack and stack[-1].end < start:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


# operators the CUDA build runs as one kernel (or a fixed few) of its own: the CPU build's
# internals below them (mean = sum + div_, mm's resolve_conj, ...) do not exist on a GPU and are dropped
_ATOMIC = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "mean", "sum", "argmax", "max", "amax", "_softmax",
                     "softmax", "_log_softmax", "topk", "sort", "argsort", "cat", "index_select", "_grouped_mm",
                     "_scaled_dot_product_cudnn_attention", "pow", "rsqrt", "silu", "mul", "add", "sub", "neg", "cos",
                     "sin", "div", "div_", "copy_", "fill_", "zero_", "histc", "cumsum", "index_add_", "index_copy_",
                     "index_put_", "nonzero", "random_", "arange", "gather", "scatter", "mul_", "add_", "where"})


def _does_work(name: str) -> bool:
    return op_class(name) is not None and name not in _NO_KERNEL


def _has_work_below(node: _Node) -> bool:
    return any((c.cat == "cpu_op" and _does_work(c.event["name"])) or _has_work_below(c) for c in node.children)


def _launching(node: _Node) -> bool:
    """Whether this CPU operator launches its own kernels on a GPU (renaming it first); the CPU
    internals of an operator the GPU runs as one kernel are removed from the tree."""
    name = node.event["name"] = _RENAMED_OPS.get(node.event["name"], node.event["name"])
    if not _does_work(name):
        return False
    if name.split("::", 1)[-1] in _ATOMIC:
        node.children = [c for c in node.children if c.cat != "cpu_op"]
        return True
    return not _has_work_below(node)


class _Emitter:
    """Walks the CPU tree in program order: new CPU times, launches, and the GPU stream."""

    def __init__(self, pid: Any, tid: Any, first_correlation: int = 100_000) -> None:
        self.pid, self.tid = pid, tid
        self.out: list[dict[str, Any]] = []
        self.gpu_free = 0.0
        self.correlation = first_correlation
        self.kernels = 0

    def _runtime(self, name: str, ts: float, dur: float, corr: int, external: Any, cat: str = "cuda_runtime") -> None:
        args: dict[str, Any] = {"cbid": 211 if name == "cudaLaunchKernel" else 307, "correlation": corr}
        if external is not None:
            args["External id"] = external
        self.out.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": round(ts, 3),
                         "dur": round(dur, 3), "args": args})
        self.out.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": round(ts, 3), "cat": "ac2g",
                         "name": "ac2g"})

    def gpu_event(self, spec: KernelSpec, start: float, corr: int, external: Any) -> float:
        args: dict[str, Any] = {"queued": 0, "device": 0, "context": 1, "stream": STREAM, "correlation": corr}
        if external is not None:
            args["External id"] = external
        if spec.category == "kernel":
            args.update({"registers per thread": 128, "shared memory": 0, "grid": [132, 1, 1], "block": [384, 1, 1]})
        self.out.append({"ph": "X", "cat": spec.category, "name": spec.name, "pid": 0, "tid": STREAM,
                         "ts": round(start, 3), "dur": round(spec.dur_us, 3), "args": args})
        self.out.append({"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": round(start, 3), "cat": "ac2g",
                         "name": "ac2g", "bp": "e"})
        self.kernels += 1
        return start + spec.dur_us

    def launch(self, spec: KernelSpec, at: float, external: Any) -> float:
        """A launch call at CPU time `at`; returns the CPU time after it."""
        self.correlation += 1
        api = "cudaMemcpyAsync" if spec.category == "gpu_memcpy" else spec.api
        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        self._runtime(api, at, LAUNCH_CALL_US, self.correlation, external, cat)
        start = max(at + LAUNCH_LATENCY_US, self.gpu_free + KERNEL_GAP_US)
        self.gpu_free = self.gpu_event(spec, start, self.correlation, external)
        return at + LAUNCH_CALL_US

    def synchronize(self, at: float, name: str = "cudaDeviceSynchronize") -> float:
        """The CPU waits for the GPU: returns the CPU time it goes on at."""
        self.correlation += 1
        end = max(at + 1.0, self.gpu_free + 2.0)
        self._runtime(name, at, end - at, self.correlation, None)
        return end


def _eager_walk(node: _Node, cursor: float, emitter: _Emitter) -> float:
    event = node.event
    cat = node.cat
    start = cursor
    if cat == "cpu_op":
        name = event["name"]
        args = event.get("args") or {}
        specs = kernels_for(event["name"], args) if _launching(node) else []
        name = event["name"]
        if specs:
            cursor += LAUNCH_OP_US
            for spec in specs:
                cursor = emitter.launch(spec, cursor, args.get("External id")) + 0.5
            if name in _SYNCING:
                cursor = emitter.synchronize(cursor, "cudaStreamSynchronize")
        else:
            cursor += OP_US / 2
    elif cat == "python_function":
        cursor += (MODULE_FRAME_US if event["name"].startswith("nn.Module: ") else FRAME_US) / 2
    else:
        cursor += ANNOTATION_US / 2
    for child in node.children:
        cursor = _eager_walk(child, cursor + 0.2, emitter)
    if cat == "cpu_op":
        cursor += OP_US / 2
    elif cat == "python_function":
        cursor += (MODULE_FRAME_US if event["name"].startswith("nn.Module: ") else FRAME_US) / 2
    else:  # the recording synchronises at the end of each region
        cursor = emitter.synchronize(cursor)
        cursor += ANNOTATION_US / 2
    event["ts"] = round(start, 3)
    event["dur"] = round(cursor - start, 3)
    return cursor


# ---------------------------------------------------------------------------------------------
# torch.compile: Inductor's fused Triton kernels and extern GEMMs


_REDUCTION_OPS = frozenset({"mean", "sum", "amax", "max", "argmax", "_softmax", "softmax", "var", "var_mean",
                            "topk"})
# what Inductor leaves to ATen (extern kernels and fallbacks): GEMMs, attention, and ops it does not lower
_EXTERN = ("mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_cudnn_attention", "topk", "sort", "argsort",
           "histc", "nonzero")


@dataclass
class _Fused:
    ops: list[str]
    moved: float
    reduction: bool


def _compiled_items(root: _Node) -> list[tuple[str, Any]]:
    """The launches of one forward as Inductor runs them: ("extern", (op name, args, specs)) and
    ("triton", _Fused) items in program order. Elementwise runs between extern kernels fuse; a
    reduction ends a fused kernel (Inductor fuses a reduction with the pointwise work after it in
    the same kernel as a norm's mul)."""
    items: list[tuple[str, Any]] = []
    current: _Fused | None = None

    def visit(node: _Node) -> None:
        nonlocal current
        if node.cat == "cpu_op":
            if _launching(node):
                name = node.event["name"]
                base = name.split("::", 1)[-1]
                args = node.event.get("args") or {}
                specs = kernels_for(name, args)
                if not specs:
                    return
                if base in _EXTERN:
                    current = None
                    items.append(("extern", (name, args, specs)))
                    return
                moved = max(s.dur_us - ELEMENTWISE_FIXED_US for s in specs) * ELEMENTWISE_BANDWIDTH / 1e6
                if current is None or (current.reduction and base in _REDUCTION_OPS):
                    current = _Fused([], 0.0, False)
                    items.append(("triton", current))
                if base not in current.ops:
                    current.ops.append(base)
                current.moved = max(current.moved, moved)
                current.reduction = current.reduction or base in _REDUCTION_OPS
                return
        for child in node.children:
            visit(child)

    visit(root)
    return items


def _triton_name(fused: _Fused, index: int) -> str:
    kind = "red" if fused.reduction else "poi"
    ops = "_".join(sorted({("_to_copy" if o == "copy_" else o.rstrip("_")) for o in fused.ops}))
    return f"triton_{kind}_fused_{ops}_{index}"


def _compiled_forward(forward: _Node, emitter: _Emitter, cursor: float, graphs: bool, ext_ids: list[int]) -> float:
    """Replace one model forward's CPU tree by a compiled region and launch its kernels."""
    items = _compiled_items(forward)
    pid, tid = emitter.pid, emitter.tid
    region = {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": pid, "tid": tid,
              "args": {"External id": ext_ids[0], "Record function id": 0}}
    ext_ids[0] += 1
    emitter.out.append(region)
    start = cursor
    cursor += 20.0  # guards, the wrapper's argument checks
    specs: list[tuple[KernelSpec, Any]] = []
    triton_index = 0
    for kind, item in items:
        if kind == "extern":
            name, args, kernel_specs = item
            specs += [(s, (name, args)) for s in kernel_specs]
        else:
            kname = _triton_name(item, triton_index)
            triton_index += 1
            specs.append((KernelSpec(kname, elementwise_us(item.moved * 1.3), api="cuLaunchKernel"), (kname, None)))
    if graphs:
        emitter.correlation += 1
        corr = emitter.correlation
        emitter._runtime("cudaGraphLaunch", cursor, 12.0, corr, None)
        gpu = max(cursor + LAUNCH_LATENCY_US, emitter.gpu_free + KERNEL_GAP_US)
        for spec, _ in specs:
            gpu = emitter.gpu_event(spec, gpu, corr, None) + GRAPH_GAP_US
        emitter.gpu_free = gpu - GRAPH_GAP_US
        cursor += 14.0
    else:
        for spec, (name, args) in specs:
            ext = ext_ids[0]
            ext_ids[0] += 1
            op = {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": round(cursor, 3),
                  "args": {"External id": ext, "Record function id": 0}}
            if args is not None:
                op["args"].update({k: v for k, v in args.items() if k in ("Input Dims", "Input type", "Concrete Inputs",
                                                                         "Input Strides")})
            else:
                op["args"].update({"kernel_backend": "triton", "stream": 0})
            cursor += 2.0
            cursor = emitter.launch(spec, cursor, ext) + 0.5
            op["dur"] = round(cursor - float(op["ts"]), 3)
            emitter.out.append(op)
            cursor += 1.0
    cursor += 5.0
    region["ts"] = round(start, 3)
    region["dur"] = round(cursor - start, 3)
    return cursor


def _compiled_walk(node: _Node, cursor: float, emitter: _Emitter, graphs: bool, ext_ids: list[int]) -> float:
    """Re-time the tree; each outermost model forward becomes a compiled region."""
    event = node.event
    if node.cat == "python_function" and event["name"].startswith("nn.Module: "):
        return _compiled_forward(node, emitter, cursor, graphs, ext_ids)
    if node.cat == "cpu_op":  # outside the model (sampling, inputs): eager as recorded
        cursor = _eager_walk(node, cursor, emitter)
        _collect(node, emitter.out)
        return cursor
    start = cursor
    own = ANNOTATION_US if node.cat == "user_annotation" else FRAME_US if node.cat == "python_function" else OP_US
    cursor += own / 2
    for child in node.children:
        cursor = _compiled_walk(child, cursor + 0.2, emitter, graphs, ext_ids)
    if node.cat == "user_annotation":
        cursor = emitter.synchronize(cursor)
    cursor += own / 2
    event["ts"] = round(start, 3)
    event["dur"] = round(cursor - start, 3)
    emitter.out.append(event)
    return cursor


def _collect(node: _Node, out: list[dict[str, Any]]) -> None:
    out.append(node.event)
    for child in node.children:
        _collect(child, out)


# ---------------------------------------------------------------------------------------------
# Public entry points


def synthesise(cpu_events: Iterable[dict[str, Any]], mode: str = "eager", keep_python_frames: bool = True
               ) -> list[dict[str, Any]]:
    """The events of a GPU trace built on the recorded CPU events (see the module docstring).

    mode: eager, compiled (Inductor: Triton + extern GEMMs) or graphs (compiled, replayed from
    one CUDA graph per step). keep_python_frames=False drops every python_function event, as a
    profile without with_stack would have none."""
    if mode not in ("eager", "compiled", "graphs"):
        raise ValueError(f"mode {mode!r}: expected eager, compiled or graphs")
    events = [copy.deepcopy(e) for e in cpu_events]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function",
                                                                          "user_annotation")]
    if not timed:
        raise ValueError("no CPU events to build on")
    main_thread = max({(e["pid"], e["tid"]) for e in timed},
                      key=lambda key: sum(1 for e in timed if (e["pid"], e["tid"]) == key))
    timed = [e for e in timed if (e["pid"], e["tid"]) == main_thread]
    roots = _tree(timed)
    emitter = _Emitter(*main_thread)
    cursor = float(min(e["ts"] for e in timed))
    emitter.gpu_free = cursor
    out: list[dict[str, Any]]
    if mode == "eager":
        for root in roots:
            cursor = _eager_walk(root, cursor + 1.0, emitter)
        out = []
        for root in roots:
            _collect(root, out)
        out += emitter.out
    else:
        ext_ids = [10_000_000]
        for root in roots:
            cursor = _compiled_walk(root, cursor + 1.0, emitter, mode == "graphs", ext_ids)
        out = emitter.out
    if not keep_python_frames:
        out = [e for e in out if e.get("cat") != "python_function"]
    gpu_meta = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "python"}},
                {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "ts": 0, "args": {"labels": "GPU 0"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": STREAM, "ts": 0,
                 "args": {"name": f"stream {STREAM} "}}]
    return meta + gpu_meta + sorted(out, key=lambda e: float(e.get("ts", 0.0)))


def kineto_text(event: dict[str, Any]) -> str:
    """One event in the layout the profiler writes (braces alone on their lines, args one level deeper),
    so that a written trace is read the way a recorded one is."""
    if event.get("ph") != "X":
        return "  {\n    " + json.dumps(event)[1:-1] + "\n  }"
    head = ", ".join(f"{json.dumps(k)}: {json.dumps(event[k])}" for k in ("ph", "cat", "name", "pid", "tid")
                     if k in event)
    times = ", ".join(f"{json.dumps(k)}: {json.dumps(event[k])}" for k in ("ts", "dur") if k in event)
    rest = {k: v for k, v in event.items() if k not in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
    lines = [f"    {head},", f"    {times}" + ("," if "args" in event or rest else "")]
    if rest:
        lines.append("    " + json.dumps(rest)[1:-1] + ("," if "args" in event else ""))
    if "args" in event:
        body = json.dumps(event["args"])[1:-1]
        lines += ["    \"args\": {", f"      {body}", "    }"]
    return "  {\n" + "\n".join(lines) + "\n  }"


def write_trace_document(out: str | Path, top: dict[str, Any], events: Iterable[dict[str, Any]]) -> Path:
    """Write a trace (gzipped when the name ends in .gz) in the profiler's layout."""
    out = Path(out)
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wt", encoding="utf-8") as handle:  # type: ignore[operator]
        handle.write("{\n")
        for key, value in top.items():
            handle.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        handle.write('  "traceEvents": [\n')
        handle.write(",\n".join(kineto_text(e) for e in events))
        handle.write("\n  ]\n}\n")
    return out


def read_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        return json.load(handle)


def write_synthesised(cpu_trace: str | Path, out: str | Path, mode: str = "eager", keep_python_frames: bool = True,
                      note: str = "") -> Path:
    """Read a recorded CPU trace, synthesise its GPU side, write it (gzipped when `out` ends in .gz)."""
    doc = read_trace(cpu_trace)
    events = synthesise(doc["traceEvents"], mode, keep_python_frames)
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    top["deviceProperties"] = DEVICE_PROPERTIES
    top["with_stack"] = 1 if keep_python_frames else 0
    top["synthesised"] = note or (f"GPU side synthesised by infersim.trace.synthesis (mode {mode}) from the CPU trace "
                                  f"{Path(cpu_trace).name}, recorded with torch {doc.get('torch_version', '?')} on a CPU")
    return write_trace_document(out, top, events)
