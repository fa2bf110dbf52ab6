"""The GPU side a synthesised trace gives each CPU operator (tracegen.synthesis): the kernels a
CUDA build of PyTorch launches for it, named as that build names them, and how long an H100 would
take for each.

The cost model (microseconds; H100 SXM, bf16) is deliberately independent of the simulator's:
GEMM max(2 m_pad k n / 712 TFLOP/s, bytes / 2.85 TB/s) + 3 (m padded to 64 rows);
attention max(causal FLOPs / 544 TFLOP/s, bytes / 2.85 TB/s) + 4; grouped GEMM
max(FLOPs / 593 TFLOP/s, active experts' weight bytes / 2.68 TB/s) + 6 (active experts: those R routed
rows hit under uniform routing, E (1 - (1 - 1/E)^R), each padded to 64 rows); elementwise and reductions
bytes / 2.0 TB/s + 2: the bytes each kernel reads and writes (a torch.cat's TensorList, whose element
type the profiler does not record, at 2 bytes per element) at 60% of the 3.35 TB/s HBM3 peak, what
ATen's vectorised elementwise kernels stream at, over a 2 us floor (the shortest kernels an H100 runs,
launch and tail included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infersim.trace.operators import GEMM_OP, GROUPED_GEMM_OP, op_class


PEAK_BF16 = 989.4e12
GEMM_RATE = PEAK_BF16 * 0.72
ATTENTION_RATE = PEAK_BF16 * 0.55
GROUPED_RATE = PEAK_BF16 * 0.60
HBM = 3.35e12
GEMM_BANDWIDTH = HBM * 0.85
GROUPED_BANDWIDTH = HBM * 0.80
ELEMENTWISE_BANDWIDTH = 2.0e12
GEMM_FIXED_US, ATTENTION_FIXED_US, GROUPED_FIXED_US, ELEMENTWISE_FIXED_US = 3.0, 4.0, 6.0, 2.0
_ELEMENT_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "bool": 1,
                  "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1}

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
