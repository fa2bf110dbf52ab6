"""Kernel shapes, their FLOPs and bytes, and the cost record every estimate returns.

A shape is a frozen description of one kernel launch on one GPU. Its `flops` and `bytes` are pure
functions of the shape. Turning a shape into seconds is `infersim.costing.timing`'s job (measured table
or roofline). Communication shapes (collectives, EP token exchange) are infersim.shapes.comm_shapes';
turning them into seconds is `infersim.modules.comm`'s.

Shapes, the cost record and the table hit are slotted dataclasses (slots=True): a sweep builds
several for every configuration it prices, and a slotted frozen dataclass is cheaper to build and
to free than one with an instance dictionary.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from operator import attrgetter
from typing import Literal, Protocol

from infersim.base.records import cheap_init
from infersim.shapes.comm_shapes import CommShape
from infersim.base.units import dtype_bytes


class Bound(str, Enum):
    """What limits a cost: the thing to make faster to make it faster."""

    COMPUTE = "compute"
    MEMORY = "memory"
    COMM = "comm"
    OVERHEAD = "overhead"
    HOST_LINK = "host link"  # weights streamed from host memory (deployment.weight_offload)


class Source(str, Enum):
    """Where a time came from."""

    TABLE = "table"  # a measured MFU table (exact grid point or interpolated)
    ROOFLINE = "roofline"  # max(compute, memory) with the card's derates, plus launch overhead
    CARD = "card"  # a constant in a card (engine overhead, collective latency model)
    MIXED = "mixed"  # a sum of several sources


@cheap_init
@dataclass(frozen=True, slots=True)
class Cost:
    """FLOPs, bytes moved and time of one kernel (or a sum of kernels), with what bounds it."""

    flops: float
    bytes: float
    seconds: float
    bound: Bound
    source: Source
    detail: str = ""


# ---------------------------------------------------------------------------------------------
# Shapes


@cheap_init
@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] = A[m, k] @ W[k, n]: activations A (m tokens), weights W.

    dtype is the tensor-core input format (sets the FLOP/s peak); weight_dtype sets weight bytes.
    """

    m: int
    k: int
    n: int
    dtype: str = "bf16"
    weight_dtype: str = "bf16"
    out_dtype: str = "bf16"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def bytes(self) -> float:
        return (
            self.m * self.k * dtype_bytes(self.dtype)
            + self.k * self.n * dtype_bytes(self.weight_dtype)
            + self.m * self.n * dtype_bytes(self.out_dtype)
        )


@cheap_init
@dataclass(frozen=True, slots=True)
class GroupedGemmShape:
    """One projection of the routed experts on one GPU, as a grouped GEMM over its local experts.

    tokens_per_gpu is the number of tokens whose routing is served by this GPU's EP group share
    (the "batch size per GPU" of published grouped-GEMM tables); each is copied to `topk` experts,
    spread evenly over the `num_experts` experts on `ep` GPUs. `intermediate` is the expert FFN
    width on this GPU (already divided by expert TP). `active_experts` is the expected number of
    distinct local experts that receive at least one token: only their weights are read.

    Under uneven expert load (infersim.modules.load_balance) the shape is the most loaded GPU's:
    tokens_per_gpu is the mean tokens per GPU times `load_factor` (so a table measured under
    balanced routing is looked up at that GPU's token count) and active_experts is the expected
    distinct experts that GPU activates; `balanced()` is the same kernel at the mean load, for
    tables whose measurements already include the imbalance. `expert_slots` counts redundant
    expert replicas too (0 = num_experts).
    """

    stage: Literal["prefill", "decode"]
    projection: Literal["up", "down"]
    num_experts: int
    ep: int
    topk: int
    hidden: int
    intermediate: int
    tokens_per_gpu: float
    active_experts: float
    gated: bool = True
    dtype: str = "bf16"
    weight_dtype: str = "bf16"
    load_factor: float = 1.0  # routed tokens of the most loaded GPU / the mean GPU's (>= 1)
    balanced_active_experts: float = -1.0  # distinct experts a GPU of mean load activates (< 0: active_experts)
    expert_slots: int = 0  # experts + redundant replicas over the EP group (0 = num_experts)

    @property
    def local_experts(self) -> int:
        return (self.expert_slots or self.num_experts) // self.ep

    def balanced(self) -> GroupedGemmShape:
        """The kernel at the mean GPU's load (load factor 1): for measured tables that already
        contain expert-load imbalance (the load-balance factor must then not be applied again)."""
        if self.load_factor == 1.0 and self.balanced_active_experts < 0:
            return self
        active = self.balanced_active_experts if self.balanced_active_experts >= 0 else self.active_experts
        return replace(self, tokens_per_gpu=self.tokens_per_gpu / self.load_factor, active_experts=active,
                       load_factor=1.0, balanced_active_experts=-1.0)

    @property
    def routed_tokens(self) -> float:
        return self.tokens_per_gpu * self.topk

    @property
    def k(self) -> int:
        return self.hidden if self.projection == "up" else self.intermediate

    @property
    def n(self) -> int:
        if self.projection == "up":
            return self.intermediate * (2 if self.gated else 1)
        return self.hidden

    @property
    def flops(self) -> float:
        return 2.0 * self.routed_tokens * self.k * self.n

    @property
    def bytes(self) -> float:
        return (
            self.active_experts * self.k * self.n * dtype_bytes(self.weight_dtype)
            + self.routed_tokens * self.k * dtype_bytes(self.dtype)
            + self.routed_tokens * self.n * 2.0
        )


@cheap_init
@dataclass(frozen=True, slots=True)
class AttentionShape:
    """Core attention softmax(QK^T)V for `batch` sequences on one GPU.

    kind "mha" covers MHA/GQA/MQA (num_kv_heads K and V heads of qk/v dims). kind "mla" is
    DeepSeek MLA decode with weight absorption: one shared latent KV head whose qk_head_dim is
    kv_lora_rank + rope_dim and whose values are the first v_head_dim (= kv_lora_rank) of it.
    MLA prefill without absorption is plain "mha" with num_kv_heads == num_heads.
    kind "mla_sparse" is absorbed MLA over the `topk` tokens a DSA indexer chose for each query
    (DeepSeek-V3.2, prefill and decode): every query computes a full list of `topk` keys, padded
    when fewer tokens are visible (the published FlashMLA sparse timings are flat from kv_len 1024
    to 131072, decode and prefill alike), and reads the min(topk, kv_len) real ones.
    Queries are the last q_len of kv_len positions; `window` > 0 limits each query to that many
    most recent keys (sliding-window layers).
    """

    kind: Literal["mha", "mla", "mla_sparse"]
    stage: Literal["prefill", "decode"]
    batch: int
    q_len: int
    kv_len: int
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    rope_dim: int = 0
    causal: bool = True
    window: int = 0
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    topk: int = 0  # mla_sparse: tokens selected per query

    @property
    def attended_pairs(self) -> float:
        """Query-key pairs actually computed per sequence and head."""
        q, kv = self.q_len, self.kv_len
        if self.kind == "mla_sparse":
            return float(q * self.topk)
        if not self.causal:
            return float(q * (min(kv, self.window) if self.window else kv))
        # query i (1-based position p = kv - q + i) sees min(p, window) keys
        first, last = kv - q + 1, kv
        w = self.window if self.window else kv
        if last <= w:
            return (first + last) * (last - first + 1) / 2.0
        if first > w:
            return float(q * w)
        return (first + w) * (w - first + 1) / 2.0 + (last - w) * w

    @property
    def kv_elements_per_token(self) -> int:
        if self.kind in ("mla", "mla_sparse"):
            return self.qk_head_dim  # latent and rope part, shared by K and V
        return self.num_kv_heads * (self.qk_head_dim + self.v_head_dim)

    @property
    def kv_tokens_read(self) -> int:
        """Cached tokens one sequence's kernel reads from HBM."""
        if self.kind == "mla_sparse":
            gathered = self.q_len * min(self.topk, self.kv_len)  # each query gathers its own top-k
            # prefill: queries of a sequence share the cache, so at most every cached token once
            return min(gathered, self.kv_len) if self.stage == "prefill" else gathered
        return min(self.kv_len, self.window) if self.window else self.kv_len

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.num_heads * self.attended_pairs * (self.qk_head_dim + self.v_head_dim)

    @property
    def bytes(self) -> float:
        act = dtype_bytes(self.dtype)
        q_and_out = self.batch * self.q_len * self.num_heads * (self.qk_head_dim + self.v_head_dim) * act
        kv = self.batch * self.kv_tokens_read * self.kv_elements_per_token * dtype_bytes(self.kv_dtype)
        return q_and_out + kv


def causal_pairs(q_len: int, kv_len: int) -> float:
    """Query-key pairs when the last q_len of kv_len positions each see every earlier position."""
    first = kv_len - q_len + 1
    return (first + kv_len) * q_len / 2.0


@cheap_init
@dataclass(frozen=True, slots=True)
class IndexerShape:
    """DeepSeek sparse attention's lightning indexer for `batch` sequences on one GPU:
    logits[q, t] = sum_h w[q, h] * ReLU(q_h . k_t) over every cached token t a query sees
    (causal), in fp8 (DeepGEMM fp8 MQA logits). Keys are one head of head_dim per token, cached
    in fp8 with one fp32 scale; logits are written in fp32 for the top-k kernel.
    FLOPs count the dot products (2 x heads x head_dim per pair, as the published DSA tables do);
    the ReLU and the head-weighted sum (3 x heads per pair) run in the epilogue and are left out.
    """

    stage: Literal["prefill", "decode"]
    batch: int
    q_len: int
    kv_len: int
    num_heads: int
    head_dim: int
    dtype: str = "fp8"
    key_dtype: str = "fp8"
    key_scale_bytes: float = 4.0

    @property
    def pairs(self) -> float:
        return causal_pairs(self.q_len, self.kv_len)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.pairs * self.num_heads * self.head_dim

    @property
    def bytes(self) -> float:
        keys = self.kv_len * (self.head_dim * dtype_bytes(self.key_dtype) + self.key_scale_bytes)
        queries = self.q_len * self.num_heads * (self.head_dim * dtype_bytes(self.dtype) + 4.0)  # + fp32 head weights
        logits = self.pairs * 4.0
        return self.batch * (keys + queries + logits)


@cheap_init
@dataclass(frozen=True, slots=True)
class LinearAttentionShape:
    """One phase of a linear-attention / state-space mixer for `batch` sequences on one GPU.

    kind "gdn": Gated DeltaNet (Qwen3-Next, Qwen3.5), per value head a key_dim x value_dim state
    S <- g S + beta (v - S k) k^T, output S^T q; num_key_heads q/k heads are shared by the value
    heads (like GQA). kind "mamba2": Mamba-2 SSD, per head a value_dim (head dim P) x key_dim
    (state size N) state S <- exp(dt A) S + dt x B^T, output S C; num_key_heads is the number of
    B/C groups.

    Prefill runs the chunked algorithm (chunk length `chunk`, C = min(chunk, q_len)) as three
    phases, each its own kernels:
      intra_chunk  quadratic work inside each chunk (GDN: K K^T, the triangular solve and the
                   W/U transforms; Mamba-2: C B^T)
      state        the recurrence across chunks: chunk states and the final state
      output       outputs from the previous chunk's state plus the masked intra-chunk product
    Decode runs the recurrence token by token ("recurrent"): the whole state is read and written
    once per step whatever q_len is (q_len > 1 when verifying speculative tokens).
    FLOPs per token and head (dk = key_dim, dv = value_dim):
      gdn    intra 2C dk + C^2/3 + 2C (dk + dv); state 4 dk dv; output 2 dk dv + 2C (dk + dv); recurrent 7 dk dv
      mamba2 intra 2C dk per group; state 2 dk dv; output 2 dk dv + 2C dv; recurrent 5 dk dv
    Bytes are the tensors each phase reads and writes (activations in `dtype`, states in
    `state_dtype`, GDN's intra-chunk matrix A in fp32): see `bytes`.
    """

    kind: Literal["gdn", "mamba2"]
    stage: Literal["prefill", "decode"]
    phase: Literal["intra_chunk", "state", "output", "recurrent"]
    batch: int
    q_len: int
    num_heads: int
    num_key_heads: int
    key_dim: int
    value_dim: int
    chunk: int = 64
    dtype: str = "bf16"
    state_dtype: str = "fp32"

    @property
    def tokens(self) -> int:
        return self.batch * self.q_len

    @property
    def chunk_len(self) -> int:
        return min(self.chunk, self.q_len)

    @property
    def chunks(self) -> int:
        """Chunks over all sequences."""
        return self.batch * -(-self.q_len // self.chunk)

    @property
    def state_elements(self) -> int:
        """Recurrent state elements of one sequence."""
        return self.num_heads * self.key_dim * self.value_dim

    @property
    def kernels(self) -> int:
        if self.phase == "intra_chunk":
            return 3 if self.kind == "gdn" else 2  # kkt, solve_tril, recompute_w_u / cumsum, bmm
        if self.phase == "state" and self.kind == "mamba2":
            return 2  # chunk_state, state_passing
        return 1

    @property
    def flops(self) -> float:
        C, dk, dv, H, G = self.chunk_len, self.key_dim, self.value_dim, self.num_heads, self.num_key_heads
        if self.kind == "gdn":
            per_token = {
                "intra_chunk": H * (2 * C * dk + C * C / 3.0 + 2 * C * (dk + dv)),
                "state": H * 4 * dk * dv,
                "output": H * (2 * dk * dv + 2 * C * (dk + dv)),
                "recurrent": H * 7 * dk * dv,
            }[self.phase]
        else:
            per_token = {
                "intra_chunk": G * 2 * C * dk,
                "state": H * 2 * dk * dv,
                "output": H * (2 * dk * dv + 2 * C * dv),
                "recurrent": H * 5 * dk * dv,
            }[self.phase]
        return float(self.tokens * per_token)

    @property
    def bytes(self) -> float:
        act, sb = dtype_bytes(self.dtype), dtype_bytes(self.state_dtype)
        T, C, dk, dv, H, G = self.tokens, self.chunk_len, self.key_dim, self.value_dim, self.num_heads, self.num_key_heads
        states = self.batch * self.state_elements * sb * 2.0  # initial state read, final state written
        if self.kind == "gdn":
            qk = G * dk * act  # one of q or k, per token
            if self.phase == "intra_chunk":
                # read k, v, g, beta; A = (K K^T) in fp32 written and read, its inverse in bf16 written
                # and read; W and U written
                return T * (qk + H * dv * act + H * 8.0 + H * C * (8.0 + 2 * act) + H * (dk + dv) * act)
            if self.phase == "state":
                # read k, W, U; write V_new and one state per chunk (bf16)
                return T * (qk + H * (dk + dv) * act + H * dv * act) + self.chunks * self.state_elements * act + states
            if self.phase == "output":
                # read q, k, V_new and the chunk states; write o
                return T * (2 * qk + 2 * H * dv * act) + self.chunks * self.state_elements * act
            # recurrent: read q, k, v, g, beta and the state; write the state and o
            return T * (2 * qk + 2 * H * dv * act + H * 8.0) + states
        bc = G * dk * act  # one of B or C, per token
        if self.phase == "intra_chunk":
            return T * (2 * bc + H * 4.0 + G * C * 4.0)  # read B, C, dt; write C B^T (fp32)
        if self.phase == "state":
            # read B, x, dt; write chunk states, rewrite them passing the state across chunks
            return T * (bc + H * dv * act + H * 4.0) + 2.0 * self.chunks * self.state_elements * sb + states
        if self.phase == "output":
            # read C B^T, C, x, dt and the chunk states; write y
            return T * (G * C * 4.0 + bc + 2 * H * dv * act + H * 4.0) + self.chunks * self.state_elements * sb
        return T * (2 * bc + 2 * H * dv * act + H * 4.0) + states  # recurrent


@cheap_init
@dataclass(frozen=True, slots=True)
class MemoryBoundShape:
    """Elementwise and reduction kernels (norms, rotary, activation, router softmax, embedding
    gather, KV-cache writes): time is their traffic over HBM bandwidth.

    `op` names one eager PyTorch kernel (a key of ELEMENTWISE_OPS) when the shape is exactly that
    kernel, as the eager decompositions emit them (infersim.modules.eager); measured elementwise
    tables answer such shapes by (op, dtype), interpolating their time over `bytes_moved`. Fused
    kernels of several ops (SGLang's fused add + RMSNorm) leave it empty and are priced by the
    roofline."""

    what: str
    bytes_moved: float
    flops_done: float = 0.0
    kernels: int = 1
    op: str = ""  # one eager kernel of ELEMENTWISE_OPS, or "" (a fused kernel, or several)
    dtype: str = "bf16"  # the op's input format (the elementwise tables' key beside the op)

    @property
    def flops(self) -> float:
        return self.flops_done

    @property
    def bytes(self) -> float:
        return self.bytes_moved


#: bytes per element of the formats elementwise kernels read and write (index and mask tensors too)
ELEMENT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int64": 8.0, "int32": 4.0,
                                   "bool": 1.0}


@dataclass(frozen=True)
class ElementwiseOp:
    """One eager PyTorch kernel kind and its byte rule: it reads `reads` tensors of the output's
    element count in its input format and writes `writes` in its output format (`out_dtype`, or the
    input's). Broadcast operands (a per-row scale, a cos/sin table shared by the heads) are small
    beside the tensor they scale and are not counted. The measured elementwise tables and the
    simulator's shapes use this one rule, so a table's `bytes` axis and a shape's bytes agree."""

    description: str
    reads: int
    writes: int
    out_dtype: str = ""  # "": the input's format


#: the kernels eager PyTorch model code launches between its GEMMs and attention (the names the
#: eager decompositions in infersim.modules.eager emit and `mfu bench` times)
ELEMENTWISE_OPS: dict[str, ElementwiseOp] = {
    "to_fp32": ElementwiseOp("dtype cast to fp32 (tensor.to(torch.float32))", 1, 1, "fp32"),
    "to_bf16": ElementwiseOp("dtype cast to bf16 (tensor.to(torch.bfloat16))", 1, 1, "bf16"),
    "pow": ElementwiseOp("x.pow(2)", 1, 1),
    "mean": ElementwiseOp("x.mean(-1, keepdim=True): a row reduction (the rows' results are small)", 1, 0),
    "add_scalar": ElementwiseOp("x + scalar", 1, 1),
    "rsqrt": ElementwiseOp("torch.rsqrt(x)", 1, 1),
    "mul": ElementwiseOp("a * b, same shapes", 2, 1),
    "mul_broadcast": ElementwiseOp("a * b with b broadcast (a per-row scale, a weight vector, a cos/sin table)", 1, 1),
    "add": ElementwiseOp("a + b, same shapes (residual add, rotary sum)", 2, 1),
    "neg": ElementwiseOp("-x (rotate_half's negated half)", 1, 1),
    "silu": ElementwiseOp("F.silu(x)", 1, 1),
    "sigmoid": ElementwiseOp("torch.sigmoid(x)", 1, 1),
    "cat": ElementwiseOp("torch.cat: every input element read once and written once (DynamicCache's KV growth, "
                         "rotate_half)", 1, 1),
    "copy": ElementwiseOp("a strided tensor made contiguous, index_copy_ into a static cache, clone", 1, 1),
    "softmax": ElementwiseOp("softmax over the last dimension", 1, 1),
    "topk": ElementwiseOp("torch.topk over the last dimension (the k results are small)", 1, 0),
    "sort": ElementwiseOp("torch.sort of int64 keys: values and indices written", 1, 2),
    "gather": ElementwiseOp("x[index]: rows gathered by an index tensor", 1, 1),
    "scatter": ElementwiseOp("index_put_ / index_add_: rows written at an index", 1, 1),
    "masked_fill": ElementwiseOp("x.masked_fill(mask, value)", 1, 1),
    "sum": ElementwiseOp("a reduction over a middle dimension (top-k partial outputs summed)", 1, 0),
    "cumsum": ElementwiseOp("torch.cumsum", 1, 1),
    "histc": ElementwiseOp("torch.histc over expert ids (the bins are small)", 1, 0),
    "fill": ElementwiseOp("torch.zeros / fill_", 0, 1),
}


def elementwise_bytes(op: str, dtype: str, elements: float) -> float:
    """Bytes kernel `op` reads plus writes for `elements` output (reductions: input) elements in `dtype`."""
    rule = ELEMENTWISE_OPS[op]
    out = ELEMENT_BYTES[rule.out_dtype or dtype]
    return elements * (rule.reads * ELEMENT_BYTES[dtype] + rule.writes * out)


def elementwise_shape(op: str, dtype: str, elements: float, what: str = "") -> MemoryBoundShape:
    """One eager kernel `op` over `elements` elements of `dtype`, as a shape the tables can answer."""
    return MemoryBoundShape(what or ELEMENTWISE_OPS[op].description, elementwise_bytes(op, dtype, elements), op=op,
                            dtype=dtype)


KernelShape = GemmShape | GroupedGemmShape | AttentionShape | IndexerShape | LinearAttentionShape | MemoryBoundShape
AnyShape = KernelShape | CommShape


# ---------------------------------------------------------------------------------------------
# Measured tables: what the simulator asks of them (implemented in infersim.tables)


@cheap_init
@dataclass(frozen=True, slots=True)
class TableHit:
    """A kernel time read from a measured table.

    method: "exact" (a grid point), "interpolated" (inside the table's range), "extrapolated" (above
    the range of a work axis, extended at its last doubling's slope) or "edge" (outside the range
    otherwise: `seconds` is then the roofline at the table's edge efficiency). `note` says which
    coordinate left the range. An extrapolated hit also names its edge: the work axis it left,
    the row's last measured value on it and the table's time there, and the best FLOP efficiency
    its grid measured (infersim.tables.beyond_range's rule decides with the hardware card
    whether the extension stands).
    """

    seconds: float
    table: str
    method: Literal["exact", "interpolated", "extrapolated", "edge"]
    efficiency: float
    note: str = ""
    edge_axis: str = ""
    edge_value: float = 0.0
    edge_seconds: float = 0.0
    # the best FLOP efficiency the table measured this kernel at in its other rows (another EP size,
    # another batch); 0 where the grid has a single row
    best_efficiency: float = 0.0
    # grouped GEMMs timed on the most loaded rank under power-law routing: its exponent (0: balanced)
    moe_routing_skew: float = 0.0


class KernelTables(Protocol):
    #: True when the grouped-GEMM tables were timed under skewed routing (imbalance included)
    moe_includes_imbalance: bool
    #: the tables' own share of HBM bandwidth for elementwise kernels, or None (the card's)
    elementwise_memory_efficiency: float | None
    #: seconds the tables' own rule adds to each elementwise kernel, or None (the card's launch overhead)
    elementwise_latency: float | None

    def lookup(self, shape: AnyShape, peak_flops: float) -> TableHit | None:
        """Time for `shape` from a table covering it, or None. peak_flops is the card's dense
        FLOP/s for the shape's dtype (to turn a table efficiency into time)."""
        ...

    def describe(self) -> str:
        """One line naming the tables in use (directory and provenance)."""
        ...


class NoTables:
    """The empty table set: every kernel falls back to the roofline."""

    moe_includes_imbalance = False
    elementwise_memory_efficiency = None
    elementwise_latency = None

    def lookup(self, shape: AnyShape, peak_flops: float) -> TableHit | None:
        return None

    def describe(self) -> str:
        return "none (roofline fallback for every kernel)"


def minimum_bytes(shape: AnyShape) -> float:
    """Bytes a kernel of `shape` must move at the least: its modelled bytes, except that a
    grouped GEMM may find a single local expert active (the model's expected count can be more)."""
    if isinstance(shape, GroupedGemmShape) and shape.active_experts > 1.0:
        # the shape with one active expert, from its fields in order: dataclasses.replace costs
        # more than the bytes themselves, and indexing a table set asks this of every grouped-GEMM row
        values = list(_GROUPED_FIELDS(shape))
        values[_ACTIVE_EXPERTS] = 1.0
        return GroupedGemmShape(*values).bytes
    return shape.bytes


_GROUPED_FIELDS = attrgetter(*(f.name for f in fields(GroupedGemmShape)))  # a shape's field values, in order
_ACTIVE_EXPERTS = [f.name for f in fields(GroupedGemmShape)].index("active_experts")
