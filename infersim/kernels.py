"""Kernel shapes, their FLOPs and bytes, and the cost record every estimate returns.

A shape is a frozen description of one kernel launch on one GPU. Its `flops` and `bytes` are pure
functions of the shape. Turning a shape into seconds is `infersim.timing`'s job (measured table
or roofline); turning a collective into seconds is `infersim.comm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol, Union

from infersim.units import dtype_bytes


class Bound(str, Enum):
    """What limits a cost: the thing to make faster to make it faster."""

    COMPUTE = "compute"
    MEMORY = "memory"
    COMM = "comm"
    OVERHEAD = "overhead"


class Source(str, Enum):
    """Where a time came from."""

    TABLE = "table"  # a measured MFU table (exact grid point or interpolated)
    ROOFLINE = "roofline"  # max(compute, memory) with the card's derates, plus launch overhead
    CARD = "card"  # a constant in the hardware card (scheduler overhead, collective latency model)
    MIXED = "mixed"  # a sum of several sources


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class GroupedGemmShape:
    """One projection of the routed experts on one GPU, as a grouped GEMM over its local experts.

    tokens_per_gpu is the number of tokens whose routing is served by this GPU's EP group share
    (the "batch size per GPU" of published grouped-GEMM tables); each is copied to `topk` experts,
    spread evenly over the `num_experts` experts on `ep` GPUs. `intermediate` is the expert FFN
    width on this GPU (already divided by expert TP). `active_experts` is the expected number of
    distinct local experts that receive at least one token: only their weights are read.
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

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep

    @property
    def routed_tokens(self) -> float:
        return self.tokens_per_gpu * self.topk

    @property
    def tokens_per_expert(self) -> float:
        return self.routed_tokens / self.local_experts

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


@dataclass(frozen=True)
class AttentionShape:
    """Core attention softmax(QK^T)V for `batch` sequences on one GPU.

    kind "mha" covers MHA/GQA/MQA (num_kv_heads K and V heads of qk/v dims). kind "mla" is
    DeepSeek MLA decode with weight absorption: one shared latent KV head whose qk_head_dim is
    kv_lora_rank + rope_dim and whose values are the first v_head_dim (= kv_lora_rank) of it.
    MLA prefill without absorption is plain "mha" with num_kv_heads == num_heads.
    Queries are the last q_len of kv_len positions; `window` > 0 limits each query to that many
    most recent keys (sliding-window layers).
    """

    kind: Literal["mha", "mla"]
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

    @property
    def attended_pairs(self) -> float:
        """Query-key pairs actually computed per sequence and head."""
        q, kv = self.q_len, self.kv_len
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
        if self.kind == "mla":
            return self.qk_head_dim  # latent and rope part, shared by K and V
        return self.num_kv_heads * (self.qk_head_dim + self.v_head_dim)

    @property
    def kv_tokens_read(self) -> int:
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


@dataclass(frozen=True)
class MemoryBoundShape:
    """Elementwise and reduction kernels (norms, rotary, activation, router softmax, embedding
    gather, KV-cache writes): time is their traffic over HBM bandwidth."""

    what: str
    bytes_moved: float
    flops_done: float = 0.0
    kernels: int = 1

    @property
    def flops(self) -> float:
        return self.flops_done

    @property
    def bytes(self) -> float:
        return self.bytes_moved


CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
CommImplementation = Literal["nccl", "deepep-normal", "deepep-low-latency"]


@dataclass(frozen=True)
class CollectiveShape:
    """A collective over `ranks` GPUs, `ranks_per_node` of them in each node.

    bytes_per_rank is the payload each rank holds: the full buffer for all-reduce, the gathered
    output for all-gather, the input for reduce-scatter, what each rank sends in total for
    all-to-all (EP dispatch/combine) and p2p.
    """

    kind: CollectiveKind
    bytes_per_rank: float
    ranks: int
    ranks_per_node: int
    implementation: CommImplementation = "nccl"

    @property
    def nodes(self) -> int:
        return max(1, -(-self.ranks // self.ranks_per_node))

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return self.bytes_per_rank


def prob_group_hit(num_experts: int, experts_in_group: int, topk: int) -> float:
    """Probability that a token's topk distinct experts (uniform over num_experts) include at least
    one of the experts_in_group experts a GPU or node holds (hypergeometric complement)."""
    miss = 1.0
    for i in range(topk):
        miss *= max(0.0, (num_experts - experts_in_group - i) / (num_experts - i))
    return 1.0 - miss


@dataclass(frozen=True)
class TokenExchangeShape:
    """EP dispatch (tokens to their experts' GPUs) or combine (expert outputs back), per GPU.

    Each of `tokens` tokens goes once to every GPU holding at least one of its top-k experts
    (copies to the same GPU are merged). DeepEP normal mode also merges across a node: one RDMA
    copy per destination node, forwarded over NVLink inside it.
    """

    direction: Literal["dispatch", "combine"]
    tokens: float
    token_bytes: float  # hidden size x bytes per element
    num_experts: int
    topk: int
    ep: int
    ranks_per_node: int
    implementation: Literal["nccl", "deepep-normal", "deepep-low-latency"] = "nccl"

    @property
    def nodes(self) -> int:
        return max(1, -(-self.ep // self.ranks_per_node))

    @property
    def gpu_hit(self) -> float:
        return prob_group_hit(self.num_experts, self.num_experts // self.ep, self.topk)

    @property
    def node_hit(self) -> float:
        per_node = self.num_experts // self.ep * min(self.ranks_per_node, self.ep)
        return prob_group_hit(self.num_experts, per_node, self.topk)

    def traffic(self) -> tuple[float, float]:
        """(bytes this GPU sends over NVLink, bytes it sends over its NIC)."""
        local = min(self.ranks_per_node, self.ep)
        per_gpu = self.tokens * self.gpu_hit * self.token_bytes
        intra = per_gpu * (local - 1)
        if self.nodes == 1:
            return intra, 0.0
        if self.implementation == "deepep-normal":
            return intra, self.tokens * self.node_hit * self.token_bytes * (self.nodes - 1)
        if self.implementation == "deepep-low-latency":
            return 0.0, per_gpu * (self.ep - 1)  # IBGDA: every remote copy through the NIC
        return intra, per_gpu * (self.ep - local)

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return sum(self.traffic())


KernelShape = Union[GemmShape, GroupedGemmShape, AttentionShape, MemoryBoundShape]
CommShape = Union[CollectiveShape, TokenExchangeShape]
AnyShape = Union[KernelShape, CommShape]


# ---------------------------------------------------------------------------------------------
# Measured tables: what the simulator asks of them (implemented in infersim.mfu)


@dataclass(frozen=True)
class TableHit:
    """A kernel time read from a measured table.

    method: "exact" (a grid point), "interpolated" (inside the table's range), or "edge" (outside
    the range: `seconds` is then the roofline at the table's edge efficiency, and `note` says so).
    """

    seconds: float
    table: str
    method: Literal["exact", "interpolated", "edge"]
    efficiency: float
    note: str = ""


class KernelTables(Protocol):
    def lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
        """Time for `shape` from a table covering it, or None. peak_flops is the card's dense
        FLOP/s for the shape's dtype (to turn a table efficiency into time)."""
        ...

    def describe(self) -> str:
        """One line naming the tables in use (directory and provenance)."""
        ...


class NoTables:
    """The empty table set: every kernel falls back to the roofline."""

    def lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
        return None

    def describe(self) -> str:
        return "none (roofline fallback for every kernel)"
