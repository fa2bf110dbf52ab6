"""What the CPU side of a trace says about the GPU kernels it launched.

Kineto links each kernel to its launch call (`cudaLaunchKernel`, `cuLaunchKernelEx`, ...) by
`correlation`; the launch lies, in time, inside the CPU operators (`cpu_op`: `aten::linear` >
`aten::matmul` > `aten::mm`) and, when the profile ran `with_stack=True`, inside the Python frames
of the `nn.Module`s (`nn.Module: LlamaAttention_3`) that called it. Both say what the kernel does
whatever its name: this module holds that vocabulary.

- `op_class(name)`: the class of a CPU operator (GEMM, attention, grouped GEMM, norm, top-k, ...)
  or None when the operator says nothing (views, allocations, custom ops we do not know). Of the
  operators enclosing a launch the outermost one with a class decides (`aten::linear` before the
  `aten::mm` inside it).
- `frame_kind(name)`: the role of an `nn.Module` frame (decoder layer, attention, MLP, MoE block,
  experts, router, norm, embedding, LM head container, ...) from its class name.
- `gemm_dims`, `attention_dims`, `grouped_dims`: M, N, K, batch and sequence lengths from an
  operator's recorded input shapes (`record_shapes=True`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# ---------------------------------------------------------------------------------------------
# CPU operator classes

GEMM_OP = "gemm"  # a dense GEMM (nn.Linear, torch.mm, ...): its module follows from where it runs
BATCHED_MATMUL_OP = "batched_matmul"  # matmul of two activations: eager attention inside an attention module
ATTENTION_OP = "attention"  # SDPA / FlashAttention: the attention core of one layer
GROUPED_GEMM_OP = "grouped_gemm"  # the routed experts' grouped GEMM
NORM_OP = "norm"  # a whole normalisation (rms_norm, layer_norm)
NORM_PART_OP = "norm_part"  # the reduction and rsqrt of a normalisation written out in Python (HF RMSNorm)
EMBEDDING_OP = "embedding"
TOPK_OP = "topk"  # routing top-k inside layers, sampling after them
SOFTMAX_OP = "softmax"
SAMPLING_OP = "sampling"  # argmax, multinomial, sort: token selection
CONCAT_OP = "concat"  # torch.cat: the KV cache growing in HF's DynamicCache, inside attention
COLLECTIVE_OP = "collective"
GATHER_OP = "gather_collective"
ELEMENTWISE_OP = "elementwise"  # every other ATen operator that launches work: adds, casts, copies, activations


_EXACT: dict[str, str] = {
    # dense GEMMs (cuBLAS through ATen, fp8 through _scaled_mm)
    "aten::linear": GEMM_OP, "aten::addmm": GEMM_OP, "aten::mm": GEMM_OP, "aten::matmul": GEMM_OP,
    "aten::_scaled_mm": GEMM_OP, "aten::addmv": GEMM_OP, "aten::mv": GEMM_OP, "aten::_addmm_activation": GEMM_OP,
    "aten::bmm": BATCHED_MATMUL_OP, "aten::baddbmm": BATCHED_MATMUL_OP, "aten::einsum": BATCHED_MATMUL_OP,
    # attention
    "aten::scaled_dot_product_attention": ATTENTION_OP,
    "aten::_scaled_dot_product_flash_attention": ATTENTION_OP,
    "aten::_scaled_dot_product_cudnn_attention": ATTENTION_OP,
    "aten::_scaled_dot_product_efficient_attention": ATTENTION_OP,
    "aten::_scaled_dot_product_attention_math": ATTENTION_OP,
    "aten::_scaled_dot_product_flash_attention_for_cpu": ATTENTION_OP,
    "aten::_flash_attention_forward": ATTENTION_OP, "aten::_efficient_attention_forward": ATTENTION_OP,
    "aten::_cudnn_attention_forward": ATTENTION_OP,
    # MoE
    "aten::_grouped_mm": GROUPED_GEMM_OP, "aten::grouped_mm": GROUPED_GEMM_OP,
    "aten::_scaled_grouped_mm": GROUPED_GEMM_OP, "transformers::grouped_mm_fallback": GROUPED_GEMM_OP,
    # norms
    "aten::rms_norm": NORM_OP, "aten::_fused_rms_norm": NORM_OP, "aten::layer_norm": NORM_OP,
    "aten::native_layer_norm": NORM_OP, "aten::group_norm": NORM_OP, "aten::native_group_norm": NORM_OP,
    "aten::rsqrt": NORM_PART_OP, "aten::mean": NORM_PART_OP, "aten::var": NORM_PART_OP, "aten::var_mean": NORM_PART_OP,
    "aten::norm": NORM_PART_OP, "aten::linalg_vector_norm": NORM_PART_OP,
    # embedding, routing, sampling
    "aten::embedding": EMBEDDING_OP, "aten::embedding_bag": EMBEDDING_OP, "aten::_embedding_bag": EMBEDDING_OP,
    "aten::topk": TOPK_OP,
    "aten::softmax": SOFTMAX_OP, "aten::_softmax": SOFTMAX_OP, "aten::log_softmax": SOFTMAX_OP,
    "aten::_log_softmax": SOFTMAX_OP,
    "aten::argmax": SAMPLING_OP, "aten::argmin": SAMPLING_OP, "aten::multinomial": SAMPLING_OP,
    "aten::sort": SAMPLING_OP, "aten::argsort": SAMPLING_OP,
    "aten::cat": CONCAT_OP, "aten::_cat": CONCAT_OP,
    # communication (c10d ops and the record_param_comms wrapper around NCCL calls)
    "c10d::allreduce_": COLLECTIVE_OP, "nccl:all_reduce": COLLECTIVE_OP, "c10d::all_reduce": COLLECTIVE_OP,
    "_c10d_functional::all_reduce": COLLECTIVE_OP, "_c10d_functional::all_reduce_": COLLECTIVE_OP,
    "c10d::allgather_": GATHER_OP, "c10d::_allgather_base_": GATHER_OP, "c10d::reduce_scatter_": GATHER_OP,
    "c10d::_reduce_scatter_base_": GATHER_OP, "nccl:all_gather": GATHER_OP, "nccl:_all_gather_base": GATHER_OP,
    "nccl:reduce_scatter": GATHER_OP, "nccl:_reduce_scatter_base": GATHER_OP,
    "_c10d_functional::all_gather_into_tensor": GATHER_OP, "_c10d_functional::reduce_scatter_tensor": GATHER_OP,
}
# ATen operators that never launch GPU work (views, metadata, allocation): not kept at all, which
# keeps a trace's millions of them out of memory
_NO_WORK = frozenset(
    "as_strided view reshape _reshape_alias transpose t slice select unsqueeze squeeze expand expand_as "
    "empty empty_strided empty_like new_empty new_empty_strided resolve_conj resolve_neg detach detach_ alias "
    "lift_fresh result_type narrow _unsafe_view size stride numel dim permute split split_with_sizes chunk "
    "unbind flatten unflatten view_as contiguous is_nonzero item _local_scalar_dense set_ record_stream "
    "is_same_size to lift_fresh_copy _has_compatible_shallow_copy_type broadcast_tensors movedim diagonal "
    "_reshape_copy unsafe_split unsafe_chunk swapaxes".split())
# keyword families for operators of custom libraries (flash_attn::, vllm::, sgl_kernel::, ...)
_ATTENTION_WORDS = re.compile(r"(?i)flash_?attn|flash_attention|attention_forward|sdpa|paged_attention|fmha")


@lru_cache(maxsize=4096)
def op_class(name: str) -> str | None:
    """The class of a CPU operator by name, or None when it says nothing about its kernels."""
    found = _EXACT.get(name)
    if found is not None:
        return found
    if name.startswith("aten::"):
        base = name[6:]
        if base in _NO_WORK or base.rstrip("_") in _NO_WORK:
            return None
        return ELEMENTWISE_OP
    if _ATTENTION_WORDS.search(name) and "::" in name and "backward" not in name.lower():
        return ATTENTION_OP
    return None


# ---------------------------------------------------------------------------------------------
# nn.Module frames (with_stack=True): "nn.Module: <ClassName>_<instance>"

MODULE_FRAME_PREFIX = "nn.Module: "

FRAME_LAYER = "layer"
FRAME_ATTENTION = "attention"
FRAME_MLP = "mlp"
FRAME_MOE = "moe"
FRAME_EXPERTS = "experts"
FRAME_SHARED = "shared_expert"
FRAME_ROUTER = "router"
FRAME_NORM = "norm"
FRAME_ROTARY = "rotary"
FRAME_EMBEDDING = "embedding"
FRAME_LINEAR = "linear"
FRAME_MODEL = "model"  # the whole model (...ForCausalLM, ...Model): a forward pass
FRAME_OTHER = "other"

_INSTANCE = re.compile(r"_\d+$")
_FRAME_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (FRAME_ROTARY, re.compile(r"(?i)rotary|rope")),
    (FRAME_EMBEDDING, re.compile(r"(?i)embed")),
    (FRAME_NORM, re.compile(r"(?i)norm")),
    (FRAME_SHARED, re.compile(r"(?i)shared_?expert|sharedmlp")),
    (FRAME_EXPERTS, re.compile(r"(?i)experts?$|expertlayer|moe_?experts")),
    (FRAME_ROUTER, re.compile(r"(?i)router|gate$|topk|gating")),
    (FRAME_MOE, re.compile(r"(?i)moe|sparse|mixture")),
    (FRAME_ATTENTION, re.compile(r"(?i)attention|attn|\bmla\b|selfattn")),
    (FRAME_MLP, re.compile(r"(?i)mlp|feedforward|feed_forward|ffn")),
    (FRAME_LAYER, re.compile(r"(?i)(decoderlayer|decoder_layer|transformerlayer|transformerblock|block|layer)$")),
    (FRAME_MODEL, re.compile(r"(?i)(forcausallm|forconditionalgeneration|lmheadmodel|model|transformer)$")),
    (FRAME_LINEAR, re.compile(r"(?i)linear$|conv1d$")),
)


def frame_class_name(frame: str) -> str:
    """`nn.Module: LlamaDecoderLayer_3` -> `LlamaDecoderLayer`."""
    name = frame[len(MODULE_FRAME_PREFIX):] if frame.startswith(MODULE_FRAME_PREFIX) else frame
    return _INSTANCE.sub("", name)


@lru_cache(maxsize=4096)
def frame_kind(frame: str) -> str:
    """The role of an nn.Module frame from its class name (FRAME_*)."""
    name = frame_class_name(frame)
    for kind, pattern in _FRAME_RULES:
        if pattern.search(name):
            return kind
    return FRAME_OTHER


# ---------------------------------------------------------------------------------------------
# Shapes from record_shapes

@dataclass(frozen=True)
class OpShapes:
    """An operator's recorded inputs: dims and element types per input, concrete scalar values."""

    dims: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    concrete: tuple[str, ...]


_TORCH_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
                 "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "double": "fp64", "signed char": "int8"}


def shapes_text(args: dict[str, Any]) -> str | None:
    """The compact text kept for an operator's shapes (None when the trace has none)."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return None
    return json.dumps([dims, args.get("Input type", []), args.get("Concrete Inputs", [])], separators=(",", ":"))


@lru_cache(maxsize=65536)
def parse_shapes(text: str) -> OpShapes | None:
    try:
        dims, types, concrete = json.loads(text)
        return OpShapes(tuple(tuple(int(d) for d in x) if isinstance(x, list) else () for x in dims),
                        tuple(str(t) for t in types), tuple(str(c) for c in concrete))
    except (ValueError, TypeError):
        return None


def dtype_of(shapes: OpShapes, index: int = 0) -> str | None:
    if index < len(shapes.types):
        return _TORCH_DTYPES.get(shapes.types[index])
    return None


@dataclass(frozen=True)
class GemmDims:
    m: int  # rows: tokens (all leading dims of the activation)
    k: int
    n: int
    dtype: str | None
    seq: int | None  # the activation's sequence dim where it is 3-D [batch, seq, hidden]
    batch: int | None


def _prod(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def gemm_dims(op_name: str, shapes: OpShapes) -> GemmDims | None:
    """M, K, N of a dense GEMM operator from its input dims; None when they do not say."""
    d = shapes.dims
    try:
        if op_name in ("aten::linear", "aten::_addmm_activation") or op_name.endswith("::linear"):
            x, w = d[0], d[1]  # x [..., K], weight [N, K]
            if len(w) != 2 or not x or x[-1] != w[1]:
                return None
            lead = x[:-1]
            return GemmDims(_prod(lead), w[1], w[0], dtype_of(shapes), lead[-1] if len(lead) >= 2 else None,
                            lead[0] if len(lead) >= 2 else None)
        if op_name in ("aten::mm", "aten::_scaled_mm"):
            a, b = d[0], d[1]
            if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
                return None
            return GemmDims(a[0], a[1], b[1], dtype_of(shapes), None, None)
        if op_name == "aten::addmm":
            a, b = d[1], d[2]
            if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
                return None
            return GemmDims(a[0], a[1], b[1], dtype_of(shapes, 1), None, None)
        if op_name == "aten::matmul":
            a, b = d[0], d[1]
            if len(b) != 2 or not a or a[-1] != b[0]:
                return None  # a batched matmul of two activations is not a weight GEMM
            lead = a[:-1]
            return GemmDims(_prod(lead), b[0], b[1], dtype_of(shapes), lead[-1] if len(lead) >= 2 else None,
                            lead[0] if len(lead) >= 2 else None)
    except IndexError:
        return None
    return None


@dataclass(frozen=True)
class AttentionDims:
    batch: int
    num_heads: int
    num_kv_heads: int
    q_len: int
    kv_len: int
    qk_head_dim: int
    v_head_dim: int
    causal: bool | None  # None: the op does not say
    dtype: str | None


def attention_dims(op_name: str, shapes: OpShapes) -> AttentionDims | None:
    """Batch, heads, query and key lengths of an attention operator from its input dims.

    SDPA takes [batch, heads, seq, head_dim]; the flash_attn and vLLM-style operators
    [batch, seq, heads, head_dim] (or a varlen [tokens, heads, dim], whose batch is not recorded)."""
    d = shapes.dims
    if len(d) < 3 or len(d[0]) != 4 or len(d[1]) != 4 or len(d[2]) != 4:
        return None
    q, k, v = d[0], d[1], d[2]
    if "scaled_dot_product" in op_name or op_name.startswith("aten::_cudnn") or op_name.startswith("aten::_efficient"):
        if op_name.startswith("aten::_efficient_attention_forward"):
            batch, q_len, heads, dim = q
            _, kv_len, kv_heads, _ = k
            v_dim = v[3]
        else:
            batch, heads, q_len, dim = q
            _, kv_heads, kv_len, _ = k
            v_dim = v[3]
        causal = None
        if op_name == "aten::scaled_dot_product_attention" and len(shapes.concrete) > 5:
            causal = shapes.concrete[5] == "True"
        elif "scaled_dot_product" in op_name and len(shapes.concrete) > 4:
            causal = shapes.concrete[4] == "True"
    else:
        batch, q_len, heads, dim = q
        _, kv_len, kv_heads, _ = k
        v_dim = v[3]
        causal = None
    return AttentionDims(batch, heads, kv_heads, q_len, kv_len, dim, v_dim, causal, dtype_of(shapes))


@dataclass(frozen=True)
class GroupedDims:
    tokens: int  # routed rows (tokens x top-k)
    experts: int
    k: int
    n: int
    dtype: str | None


def grouped_dims(shapes: OpShapes) -> GroupedDims | None:
    """A grouped GEMM's rows, experts, K and N: input [rows, K], weights [experts, K, N] (or
    [experts, N, K] transposed: the K that matches the input decides)."""
    d = shapes.dims
    if len(d) < 2 or len(d[0]) != 2 or len(d[1]) != 3:
        return None
    rows, k = d[0]
    experts, a, b = d[1]
    if a == k:
        n = b
    elif b == k:
        n = a
    else:
        return None
    return GroupedDims(rows, experts, k, n, dtype_of(shapes))


# ---------------------------------------------------------------------------------------------
# Elementwise kernels: the (op, dtype, elements) key of the measured elementwise tables


@dataclass(frozen=True)
class ElementwiseDims:
    """One eager elementwise kernel as the elementwise tables key it (infersim.shapes.kernels.ELEMENTWISE_OPS):
    the op, its input format and the elements its byte rule counts."""

    op: str
    dtype: str
    elements: int


# element types of recorded tensor inputs, as the elementwise tables name them (infersim.shapes.kernels.ELEMENT_BYTES)
_ELEMENT_TYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "long int": "int64", "int": "int32",
                  "bool": "bool", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}
# torch ScalarType codes (c10/core/ScalarType.h) of a cast's target (`aten::_to_copy`'s dtype argument)
_SCALAR_TYPE_CODES = {"3": "int32", "4": "int64", "5": "fp16", "6": "fp32", "11": "bool", "15": "bf16"}
# element size of PyTorch's CatArrayBatchedCopy<OpaqueType<N>> -> format; a TensorList's element type is
# not recorded, so a cat's format comes from its kernel. 2-byte elements are taken as bf16 (the activation
# format of the engines modelled; an fp16 model's cat would be keyed bf16 too)
_OPAQUE_SIZES = {"1": "bool", "2": "bf16", "4": "fp32", "8": "int64"}
_OPAQUE = re.compile(r"OpaqueType<(\d+)u?>")

_UNARY = {"pow": "pow", "pow_": "pow", "rsqrt": "rsqrt", "rsqrt_": "rsqrt", "neg": "neg", "neg_": "neg",
          "silu": "silu", "silu_": "silu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "mean": "mean", "sum": "sum",
          "softmax": "softmax", "_softmax": "softmax", "topk": "topk", "sort": "sort", "argsort": "sort",
          "masked_fill": "masked_fill", "masked_fill_": "masked_fill", "cumsum": "cumsum", "histc": "histc",
          "fill_": "fill", "zero_": "fill", "clone": "copy", "contiguous": "copy"}
# binary ops: (same-shape operands, a scalar or small broadcast operand)
_BINARY = {
    **{name: ("add", "add_scalar") for name in ("add", "add_", "sub", "sub_", "rsub")},
    **{name: ("mul", "mul_broadcast") for name in ("mul", "mul_", "div", "div_", "true_divide")},
    # comparisons, clamps and integer arithmetic of the MoE bookkeeping: one read and one write per element
    # against a scalar (the tables' add_scalar rule), two reads against a tensor
    **{name: ("add", "add_scalar") for name in ("floor_divide", "remainder", "fmod", "ge", "gt", "le", "lt", "eq",
                                                "ne", "clamp", "clamp_", "clamp_min", "clamp_max", "clamp_min_",
                                                "clamp_max_", "maximum", "minimum", "bitwise_and", "bitwise_or")},
}


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[int, str]]:
    """(elements, format) of each recorded tensor input (scalars and TensorLists give None)."""
    out: list[tuple[int, str] | None] = []
    for i, d in enumerate(dims):
        kind = _ELEMENT_TYPES.get(types[i]) if i < len(types) and isinstance(types[i], str) else None
        if kind is None or not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            out.append(None)
        else:
            out.append((_prod(tuple(d)), kind))
    return out  # type: ignore[return-value]


def _cast(source: str, target: str | None) -> str:
    if target == "fp32" and source != "fp32":
        return "to_fp32"
    if target == "bf16" and source != "bf16":
        return "to_bf16"
    return "copy"


def elementwise_dims(op_name: str, text: str, kernel_names: tuple[str, ...] = ()) -> ElementwiseDims | str:
    """The elementwise-table key of an ATen operator's kernel from its recorded inputs (shapes_text),
    or why there is none. `kernel_names`: the kernels it launched (a cat's element size is in its name)."""
    if not op_name.startswith("aten::"):
        return f"{op_name} is no ATen operator"
    base = op_name[6:]
    try:
        dims, types, concrete = json.loads(text)
    except (ValueError, TypeError):
        return f"{op_name}: shapes not readable"
    tensors = _tensors(dims, types)
    first = tensors[0] if tensors else None
    if base == "cat":
        return _cat_dims(dims, kernel_names)
    if first is None:
        return f"{op_name}: no recorded tensor input"
    elements, kind = first
    if base in ("_to_copy", "to"):
        target = _SCALAR_TYPE_CODES.get(str(concrete[1])) if len(concrete) > 1 else None
        return ElementwiseDims(_cast(kind, target), kind, elements)
    if base == "copy_":  # copy_(dst, src): a cast when the formats differ
        src = tensors[1] if len(tensors) > 1 and tensors[1] is not None else first
        return ElementwiseDims(_cast(src[1], kind), src[1], src[0])
    if base in _UNARY:
        return ElementwiseDims(_UNARY[base], kind, elements)
    if base in _BINARY:
        same, small = _BINARY[base]
        other = tensors[1] if len(tensors) > 1 else None
        if other is not None and other[0] == elements and elements > 1:
            return ElementwiseDims(same, kind, elements)
        large = max((t for t in tensors[:2] if t is not None), key=lambda t: t[0])
        return ElementwiseDims(small, large[1], large[0])
    return _indexing_dims(op_name, base, dims, concrete, tensors)


def _cat_dims(dims: Any, kernel_names: tuple[str, ...]) -> ElementwiseDims | str:
    """aten::cat: its inputs' elements summed; the element size read from its kernel's name (the
    profiler records a TensorList's shapes, not its element type)."""
    sizes = [_prod(tuple(t)) for t in (dims[0] if dims and isinstance(dims[0], list) else [])
             if isinstance(t, list) and all(isinstance(x, int) for x in t)]
    found = next((m.group(1) for n in kernel_names for m in [_OPAQUE.search(n)] if m), None)
    if not sizes or found not in _OPAQUE_SIZES:
        return "aten::cat: its inputs' element type is not recorded (a TensorList) nor in its kernel's name"
    return ElementwiseDims("cat", _OPAQUE_SIZES[found], sum(sizes))


def _indexing_dims(op_name: str, base: str, dims: Any, concrete: Any,
                   tensors: list[tuple[int, str] | None]) -> ElementwiseDims | str:
    """Gathers and scatters: the elements they move (the index's, values' or source's)."""
    elements, kind = tensors[0]
    if base in ("index_select", "gather"):
        index = tensors[2] if len(tensors) > 2 else None
        if index is None:
            return f"{op_name}: index not recorded"
        if base == "gather":
            return ElementwiseDims("gather", kind, index[0])
        try:
            dim = int(concrete[1])
            width = elements // max(1, dims[0][dim])
        except (ValueError, IndexError, TypeError):
            return f"{op_name}: dimension not recorded"
        return ElementwiseDims("gather", kind, index[0] * width)
    if base in ("index_put_", "index_put", "_index_put_impl_"):
        values = tensors[2] if len(tensors) > 2 else None
        return ElementwiseDims("scatter", kind, values[0]) if values else f"{op_name}: values not recorded"
    if base in ("scatter", "scatter_", "scatter_add_", "index_add_", "index_copy_"):
        source = tensors[3] if len(tensors) > 3 else None
        if source is None:
            return f"{op_name}: source not recorded"
        return ElementwiseDims("copy" if base == "index_copy_" else "scatter", kind, source[0])
    return f"no elementwise table op for {op_name}"
