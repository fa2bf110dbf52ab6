"""What `mfu bench` times: one case per kernel launch, and the table row (and file) its latency becomes.

Pure data: no torch. A case knows its table family, its file (the layout of the imported tables, so
that `infersim mfu compare` pairs our files with theirs), the rows it becomes and a roofline guess
of how long its timing takes (for ordering and the time budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infersim.shapes.kernels import ELEMENT_BYTES, GroupedGemmShape, elementwise_bytes
from infersim.tables.format import AttentionRow, ElementwiseRow, GemmRow, GroupedGemmRow, Row

#: kernels with fewer FLOPs per byte than this are memory-bound on Hopper-class GPUs (bf16 ridge
#: ~ 989e12 / 3.35e12 ~ 300): their inputs are evicted from L2 before every timed run
MEMORY_BOUND_INTENSITY = 300.0


@dataclass(frozen=True)
class GemmCase:
    """C[m, n] = A[m, k] @ W[n, k]^T, as nn.Linear runs it (F.linear: cuBLAS on a transposed weight)."""

    dtype: str
    m: int
    k: int
    n: int

    family = "gemm"

    def rows(self, latency_us: float) -> tuple[Row, ...]:
        return (GemmRow(dtype=self.dtype, m=self.m, k=self.k, n=self.n, latency_us=latency_us),)

    def label(self) -> str:
        return f"gemm {self.dtype} m={self.m} k={self.k} n={self.n}"


@dataclass(frozen=True)
class GroupedGemmCase:
    """One projection of the routed experts as one grouped GEMM over the local experts, tokens x
    topk rows spread evenly (balanced routing). One kernel serves prefill and decode alike (torch's
    grouped GEMM has no separate decode kernel), so one timing becomes a row of each stage."""

    dtype: str
    projection: Literal["up", "down"]
    num_experts: int
    ep: int
    topk: int
    hidden: int
    intermediate: int
    gated: bool
    tokens_per_gpu: int

    family = "grouped_gemm"

    def row(self, stage: Literal["prefill", "decode"], latency_us: float) -> GroupedGemmRow:
        return GroupedGemmRow(dtype=self.dtype, stage=stage, projection=self.projection,
                              num_experts=self.num_experts, ep=self.ep, topk=self.topk, hidden=self.hidden,
                              intermediate=self.intermediate, gated=self.gated, tokens_per_gpu=self.tokens_per_gpu,
                              latency_us=latency_us)

    def rows(self, latency_us: float) -> tuple[Row, ...]:
        return (self.row("prefill", latency_us), self.row("decode", latency_us))

    @property
    def shape(self) -> GroupedGemmShape:
        """The simulator's shape of this launch (through the row: one definition of K, N, local experts)."""
        return self.row("prefill", 0.0).shape()

    @property
    def local_experts(self) -> int:
        return self.shape.local_experts

    def rows_per_expert(self) -> list[int]:
        """Routed rows per local expert: tokens x topk spread as evenly as possible."""
        routed = self.tokens_per_gpu * self.topk
        base, extra = divmod(routed, self.local_experts)
        return [base + (1 if i < extra else 0) for i in range(self.local_experts)]

    def label(self) -> str:
        return (f"grouped_gemm {self.dtype} {self.projection} E={self.num_experts} ep={self.ep} topk={self.topk} "
                f"h={self.hidden} i={self.intermediate} tokens={self.tokens_per_gpu}")


@dataclass(frozen=True)
class AttentionCase:
    """torch SDPA in the layouts HF transformers calls it with: queries (batch, heads, q_len, dim) as a
    transposed view of the projection's output, keys and values (batch, kv heads, kv_len, dim)
    contiguous (DynamicCache's concatenation), GQA through enable_gqa, no mask; prefill causal over
    one prompt, decode one query token over the whole cache."""

    kind: Literal["mha"]
    stage: Literal["prefill", "decode"]
    dtype: str
    kv_dtype: str
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    batch: int
    q_len: int
    kv_len: int

    family = "attention"

    def rows(self, latency_us: float) -> tuple[Row, ...]:
        return (AttentionRow(kind=self.kind, stage=self.stage, dtype=self.dtype, kv_dtype=self.kv_dtype,
                             num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, qk_head_dim=self.qk_head_dim,
                             v_head_dim=self.v_head_dim, causal=True, batch=self.batch, q_len=self.q_len,
                             kv_len=self.kv_len, latency_us=latency_us),)

    @property
    def layout(self) -> str:
        return f"{self.num_heads}-{self.num_kv_heads}-{self.qk_head_dim}-{self.v_head_dim}"

    def label(self) -> str:
        return f"attention {self.stage} {self.layout} batch={self.batch} q_len={self.q_len} kv_len={self.kv_len}"


@dataclass(frozen=True)
class ElementwiseCase:
    """One eager PyTorch kernel of infersim.shapes.kernels.ELEMENTWISE_OPS over `elements` elements of
    `dtype` (reductions: input elements, rows of `row` elements)."""

    op: str
    dtype: str
    elements: int
    row: int = 4096  # row length of reductions and softmax (a hidden size); the other ops ignore it

    family = "elementwise"

    @property
    def bytes(self) -> int:
        return int(elementwise_bytes(self.op, self.dtype, self.elements))

    def rows(self, latency_us: float) -> tuple[Row, ...]:
        return (ElementwiseRow(op=self.op, dtype=self.dtype, elements=self.elements, bytes=self.bytes,
                               latency_us=latency_us),)

    def label(self) -> str:
        return f"elementwise {self.op} {self.dtype} elements={self.elements}"


HOST_PROBES: dict[str, str] = {
    "launch": "host wall time per eager launch of a small elementwise op (torch.add on 1-element CUDA tensors) "
              "from Python, in a loop without synchronisation",
    "launch_linear": "the same for F.linear on a [1, 64] x [64, 64] bf16 input (cuBLAS, its heuristics included)",
    "view": "a CPU-only op (tensor.view): dispatch without a kernel",
    "module_call": "calling an nn.Module whose forward returns its input (nn.Module.__call__ overhead)",
    "sync": "torch.cuda.synchronize() on an idle GPU: one host-device round trip",
    "hf_decode_step": "HF transformers: a decode step (generate()) of a tiny-width Llama built from a config, "
                      "GPU-resident, host-bound by construction; per kernel the CUDA profiler counts, and per step "
                      "outside the model's forward",
}


@dataclass(frozen=True)
class HostCase:
    """A host-side probe: the CPU cost of launching work, not a kernel's GPU time."""

    probe: str

    family = "host"

    def label(self) -> str:
        return f"host {self.probe}"


BenchCase = GemmCase | GroupedGemmCase | AttentionCase | ElementwiseCase | HostCase
TimedCase = GemmCase | GroupedGemmCase | AttentionCase | ElementwiseCase


def case_shape(case: TimedCase):  # -> the simulator's KernelShape of the case
    return case.rows(1.0)[0].shape()


def is_memory_bound(case: TimedCase) -> bool:
    """Fewer FLOPs per byte than the ridge: its inputs are evicted from L2 before each timed run."""
    shape = case_shape(case)
    return shape.flops < MEMORY_BOUND_INTENSITY * shape.bytes


def table_file(case: TimedCase) -> str:
    """The CSV a case's rows go to: the file names of the imported tables (mfu_tables/aiconfigurator/...)
    where they hold the same kernel family, so `mfu compare` pairs them."""
    if isinstance(case, GemmCase):
        return f"gemm_{case.dtype}.csv"
    if isinstance(case, GroupedGemmCase):
        return f"grouped_gemm_{case.dtype}.csv"
    if isinstance(case, AttentionCase):
        return f"attention_{case.stage}.csv"
    return "elementwise.csv"


#: the parts a budgeted run measures one after the other, in order of value (`mfu bench --family-budgets`):
#: GEMMs first (every layer's projections), then attention, the routed experts, the eager elementwise kernels
#: and the host probes
BUDGET_GROUPS = ("gemm_bf16", "gemm_fp8", "attn_prefill", "attn_decode", "grouped_gemm", "elementwise", "host")


def budget_group(case: BenchCase) -> str:
    """The part of a budgeted run a case belongs to (BUDGET_GROUPS): its family, GEMMs split by dtype and
    attention by stage."""
    if isinstance(case, GemmCase):
        return f"gemm_{case.dtype}"
    if isinstance(case, AttentionCase):
        return f"attn_{case.stage}"
    return case.family


def estimated_seconds(case: BenchCase, flops_per_second: float = 5e14, bytes_per_second: float = 2.5e12,
                      runs: int = 25) -> float:
    """A guess of the wall time one case's timing takes: `runs` launches at a roofline (defaults: a
    Hopper GPU at ~half its bf16 peak and ~75% of its HBM bandwidth) plus ~20 ms of fixed work (inputs,
    trial launch, warm-up floor). For ordering the plan and keeping the time budget, not a result."""
    if isinstance(case, HostCase):
        return 0.5 if case.probe != "hf_decode_step" else 15.0
    shape = case_shape(case)
    kernel = max(shape.flops / flops_per_second, shape.bytes / bytes_per_second, 3e-6)
    return 2e-2 + runs * kernel


def input_bytes(case: TimedCase) -> float:
    """Device memory a case's inputs and outputs take, bytes (the planner drops what cannot fit)."""
    if isinstance(case, ElementwiseCase):
        return case.bytes * 1.5
    if isinstance(case, GroupedGemmCase):
        shape = case.shape
        elem = ELEMENT_BYTES[case.dtype]
        return shape.local_experts * shape.k * shape.n * elem + shape.routed_tokens * (shape.k * elem + shape.n * 2)
    return case_shape(case).bytes
