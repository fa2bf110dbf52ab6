"""Kernel time: from a measured table when one covers the shape, otherwise the roofline.

Roofline fallback (docs/model.md, 'Kernel time: a measured table, or the roofline'):
    t = max(FLOPs_padded / (peak(dtype) * compute_efficiency), bytes / (HBM bandwidth * memory_efficiency))
        + kernel_launch_overhead
(elementwise kernels use elementwise_memory_efficiency instead of memory_efficiency)
        + kernel_launch_overhead
FLOPs_padded rounds each GEMM's (each expert's) row count up to the card's tensor-core tile
height `gemm_tile_m`, because a tile computes its full height however few rows are real.
Attention (softmax attention, the chunked linear-attention / SSM phases) uses
`attention_compute_efficiency`; the DSA indexer is an fp8 GEMM-like kernel and uses the GEMM
efficiency of its format. A shape made of several kernels (`kernels`) pays one launch overhead
each. Collectives are timed in `infersim.modules.comm`.

Weight-only quantized GEMMs (weights narrower than the tensor-core input format, e.g. int4/fp4
weights with bf16 activations) read their weights in the narrow format and run the MMAs at the
activation format's rate. The dequantization is fused into the GEMM main loop (Marlin/Machete
style) and overlaps with the MMAs: it costs about 4 CUDA-core operations per weight element per
M tile (gemm_tile_m rows), i.e. 4/(2 x tile) of the tensor-core work at a tensor-to-CUDA-core
rate of ~16x (A100 312/19.5, H100 989/67), never more than the MMAs themselves, so it adds no
time in this roofline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from infersim.cards.hardware import HardwareCard
from infersim.modules.comm import comm_cost
from infersim.shapes.comm_shapes import CollectiveShape, TokenExchangeShape
from infersim.shapes.kernels import (
    AnyShape,
    AttentionShape,
    Bound,
    Cost,
    GemmShape,
    GroupedGemmShape,
    IndexerShape,
    KernelTables,
    LinearAttentionShape,
    MemoryBoundShape,
    Source,
    minimum_bytes,
)


IMBALANCE_FROM_TABLE = "expert-load imbalance from the table's routing"  # marks such costs for the report


def _padded_rows(rows: float, tile: int) -> float:
    return max(1, math.ceil(rows / tile - 1e-9)) * tile if rows > 0 else 0.0  # a tile taller than the rows is one tile


def _compute_flops_and_rate(shape: AnyShape, hw: HardwareCard, flops: float) -> tuple[float, float]:
    """(FLOPs the tensor cores actually execute, achievable FLOP/s) for the roofline. `flops` is the
    shape's own count (shape.flops, a property worked out from its fields, which the callers need
    too: they read it once): a GEMM executes its rows padded to whole tiles, any other kernel `flops`."""
    if isinstance(shape, GemmShape):
        rows = _padded_rows(shape.m, hw.derates.gemm_tile_m)
        return 2.0 * rows * shape.k * shape.n, hw.peak_flops(shape.dtype) * hw.compute_efficiency(shape.dtype)
    if isinstance(shape, GroupedGemmShape):
        active = max(shape.active_experts, 1e-9)
        per_expert = shape.routed_tokens / active
        rows = active * _padded_rows(per_expert, hw.derates.gemm_tile_m)
        return 2.0 * rows * shape.k * shape.n, hw.peak_flops(shape.dtype) * hw.compute_efficiency(shape.dtype)
    if isinstance(shape, (AttentionShape, LinearAttentionShape)):
        return flops, hw.peak_flops(shape.dtype) * hw.derates.attention_compute_efficiency
    if isinstance(shape, IndexerShape):
        return flops, hw.peak_flops(shape.dtype) * hw.compute_efficiency(shape.dtype)
    # elementwise kernels run on CUDA cores; their FLOPs never bound them at these intensities
    return flops, hw.peak_flops("bf16") * hw.compute_efficiency("bf16")


def table_tokens_for(shape: GroupedGemmShape, routing_skew: float) -> float:
    """The mean tokens per GPU at which a grouped-GEMM table timed on the most loaded rank of
    power-law routing (exponent `routing_skew`, over the whole batch: aiconfigurator's collector)
    shows the kernel this deployment's most loaded rank runs. That rank carries T_busy =
    shape.tokens_per_gpu (the deployment's own load factor applied); the table's rank carries
    f(T) x T at mean load T, f the imbalance of its routing (infersim.modules.load_balance,
    statistical with that exponent as the long-run popularity). Solved by fixed-point iteration
    T = T_busy / f(T) (f falls slowly with T). A deployment routed as the table was timed gets
    its mean load back; an even or rebalanced one (EPLB) a larger T, the table's kernel at the
    busiest rank's tokens without the table's skew."""
    return _table_tokens(shape.num_experts, shape.topk, shape.ep, shape.tokens_per_gpu, routing_skew)


@functools.lru_cache(maxsize=4096)
def _table_tokens(experts: int, topk: int, ep: int, busy: float, routing_skew: float) -> float:
    from infersim.modules.load_balance import moe_balance

    def factor(tokens: float) -> float:
        return moe_balance("statistical", experts, topk, ep, tokens, 1.0, routing_skew=routing_skew,
                           dataset_skew=routing_skew).token_factor

    tokens = busy / factor(busy)
    for _ in range(50):  # f falls slowly with T: the iteration contracts
        step = busy / factor(tokens)
        if abs(step - tokens) <= 1e-12 * tokens:
            break
        tokens = step
    return tokens


def roofline_rates(shape: AnyShape, hw: HardwareCard) -> tuple[float, float, float]:
    """(FLOPs the tensor cores execute, achievable FLOP/s, achievable bytes/s) of a table-timed kernel
    on this card's roofline (what infersim.tables.beyond_range weighs regimes with)."""
    return (*_compute_flops_and_rate(shape, hw, shape.flops), hw.peak.hbm_bandwidth * hw.derates.memory_efficiency)


def _memory_efficiency(shape: AnyShape, hw: HardwareCard, elementwise: float | None = None) -> float:
    """Elementwise kernels (norms, rotary, activation, casts) stream less well than GEMMs and
    attention: short rows, two passes, launch tails. `elementwise` overrides the card's share for
    them (a table set's own rule, see kernel_cost)."""
    if isinstance(shape, MemoryBoundShape):
        return elementwise if elementwise is not None else hw.derates.elementwise_memory_efficiency
    return hw.derates.memory_efficiency


def roofline_cost(shape: AnyShape, hw: HardwareCard, detail: str = "", elementwise: float | None = None,
                  per_kernel: float | None = None) -> Cost:
    """The roofline: the slower of compute and memory, plus a fixed time per kernel (the card's
    kernel_launch_overhead, or `per_kernel` seconds where a table set's elementwise rule brings its
    own); `elementwise` replaces the card's elementwise share of HBM bandwidth the same way."""
    return _roofline_cost(shape, hw, shape.flops, shape.bytes, detail, elementwise, per_kernel)


def _roofline_cost(shape: AnyShape, hw: HardwareCard, flops: float, moved: float, detail: str = "",
                   elementwise: float | None = None, per_kernel: float | None = None) -> Cost:
    """roofline_cost of a shape whose FLOPs and bytes (shape.flops, shape.bytes) the caller has read."""
    flops_done, rate = _compute_flops_and_rate(shape, hw, flops)
    compute_s = flops_done / rate
    memory_s = moved / (hw.peak.hbm_bandwidth * _memory_efficiency(shape, hw, elementwise))
    kernels = shape.kernels if isinstance(shape, (MemoryBoundShape, LinearAttentionShape)) else 1
    launch_s = (hw.derates.kernel_launch_overhead if per_kernel is None else per_kernel) * kernels
    busy = max(compute_s, memory_s)
    if launch_s > busy:
        bound = Bound.OVERHEAD
    else:
        bound = Bound.COMPUTE if compute_s >= memory_s else Bound.MEMORY
    return Cost(flops, moved, busy + launch_s, bound, Source.ROOFLINE, detail)


def _intensity_bound(shape: AnyShape, hw: HardwareCard, flops: float, moved: float) -> Bound:
    """Compute- or memory-bound by arithmetic intensity against the card's ridge point (`flops`,
    `moved`: the shape's FLOPs and bytes)."""
    flops_done, rate = _compute_flops_and_rate(shape, hw, flops)
    bandwidth = hw.peak.hbm_bandwidth * hw.derates.memory_efficiency
    return Bound.COMPUTE if flops_done / rate >= moved / bandwidth else Bound.MEMORY


#: the calibrated time scale (KernelTimeScale's field) of each shape type's kernel family
_SCALE_FAMILY: dict[type, str] = {
    CollectiveShape: "collectives", TokenExchangeShape: "collectives",
    AttentionShape: "attention", LinearAttentionShape: "attention",
    MemoryBoundShape: "memory",
    GemmShape: "gemm", GroupedGemmShape: "gemm", IndexerShape: "gemm",
}


def _time_scale(shape: AnyShape, hw: HardwareCard) -> float:
    """The card's measured-over-predicted time of the shape's kernel family (1 unless calibrated)."""
    return getattr(hw.derates.kernel_time_scale, _SCALE_FAMILY[type(shape)])


#: the kernels priced by FLOPs and bytes against a table or the roofline (not collectives, token
#: exchanges or memory-bound elementwise kernels)
ComputeShape = GemmShape | GroupedGemmShape | AttentionShape | IndexerShape | LinearAttentionShape


def kernel_cost(shape: AnyShape, hw: HardwareCard, tables: KernelTables) -> Cost:
    """Time of one kernel of `shape`, with its source: table, roofline at a table's edge, or roofline;
    times the card's calibrated time scale of its kernel family."""
    if isinstance(shape, MemoryBoundShape):
        cost = _elementwise_cost(shape, hw, tables)
    elif isinstance(shape, (CollectiveShape, TokenExchangeShape)):
        cost = _communication_cost(shape, hw, tables)
    else:
        cost = _compute_kernel_cost(shape, hw, tables)
    scale = _time_scale(shape, hw)
    if scale == 1.0:
        return cost
    return replace(cost, seconds=cost.seconds * scale, detail=f"{cost.detail} x {scale:.3g} (calibrated)".lstrip())


def _communication_cost(shape: CollectiveShape | TokenExchangeShape, hw: HardwareCard, tables: KernelTables) -> Cost:
    """A collective's measured table's answer, else the communication model (infersim.modules.comm)."""
    if isinstance(shape, CollectiveShape):
        hit = tables.lookup(shape, 1.0)  # collectives have no FLOPs: the peak is not used
        if hit is not None:
            source = Source.ROOFLINE if hit.method == "edge" else Source.TABLE
            return Cost(0.0, shape.bytes, hit.seconds, Bound.COMM, source,
                        f"{hit.method} from {hit.table}" + (f" ({hit.note})" if hit.note else ""))
    return comm_cost(shape, hw)


def _compute_kernel_cost(shape: ComputeShape, hw: HardwareCard, tables: KernelTables) -> Cost:
    """A GEMM, grouped GEMM or attention kernel: its table's answer (held to this card's HBM bound),
    or the roofline where no table answers."""
    dtype = shape.dtype
    flops, moved = shape.flops, shape.bytes  # properties worked out from the shape's fields: read once
    # a grouped GEMM whose table already holds the expert-load imbalance
    skewed = shape if isinstance(shape, GroupedGemmShape) and tables.moe_includes_imbalance else None
    looked_up: ComputeShape = shape
    if skewed is not None:
        # timed on the most loaded rank of the table's own skewed routing: look up the mean load
        # at which that rank carries what this deployment's most loaded rank does
        balanced = skewed.balanced()
        hit = tables.lookup(balanced, hw.peak_flops(dtype))
        if hit is not None and hit.moe_routing_skew:
            balanced = replace(balanced, tokens_per_gpu=table_tokens_for(skewed, hit.moe_routing_skew))
            hit = tables.lookup(balanced, hw.peak_flops(dtype))
        looked_up = balanced
    else:
        hit = tables.lookup(shape, hw.peak_flops(dtype))
    if hit is not None and hit.method == "extrapolated":
        from infersim.tables.beyond_range import beyond_range

        hit = beyond_range(looked_up, hit, lambda s: roofline_rates(s, hw), hw.peak_flops(dtype))
    if hit is None:
        return _roofline_cost(shape, hw, flops, moved)
    if hit.method == "edge":
        # the edge efficiency scales compute; outside the table the kernel can still not
        # stream its bytes faster than HBM allows
        memory_s = moved / (hw.peak.hbm_bandwidth * hw.derates.memory_efficiency)
        return Cost(flops, moved, max(hit.seconds, memory_s) + hw.derates.kernel_launch_overhead,
                    _intensity_bound(shape, hw, flops, moved), Source.ROOFLINE,
                    f"outside table {hit.table}: {hit.note or f'roofline at edge efficiency {hit.efficiency:.3f}'}")
    # the least bytes the kernel moves: its bytes (read above), but for a grouped GEMM's one active expert
    floor = (minimum_bytes(shape) if isinstance(shape, GroupedGemmShape) else moved) / hw.peak.hbm_bandwidth
    if hit.seconds < floor:  # a table from a faster GPU, scaled by FLOP/s: never beat this card's HBM
        return Cost(flops, moved, floor, Bound.MEMORY, Source.TABLE,
                    f"{hit.method} from {hit.table}, raised to the HBM bound of {hw.name} "
                    f"({hit.seconds * 1e6:.3g} us would beat its bandwidth)")
    if hit.method == "extrapolated":
        memory_s = moved / (hw.peak.hbm_bandwidth * hw.derates.memory_efficiency)
        return Cost(flops, moved, max(hit.seconds, memory_s), _intensity_bound(shape, hw, flops, moved),
                    Source.TABLE, f"outside table {hit.table}: {hit.note}")
    return Cost(flops, moved, hit.seconds, _intensity_bound(shape, hw, flops, moved), Source.TABLE,
                f"{hit.method} from {hit.table}"
                + (_imbalance_note(skewed, looked_up) if skewed is not None and hit.moe_routing_skew else ""))


def _imbalance_note(shape: GroupedGemmShape, looked_up: ComputeShape) -> str:
    """How a table's own expert-load imbalance was taken out: the load it was looked up at."""
    tokens = looked_up.tokens_per_gpu if isinstance(looked_up, GroupedGemmShape) else shape.tokens_per_gpu
    return (f" ({IMBALANCE_FROM_TABLE} taken out: looked up at {tokens:,.0f} tokens "
            f"per GPU, whose most loaded rank under it carries this layout's {shape.tokens_per_gpu:,.0f})")


def _elementwise_cost(shape: MemoryBoundShape, hw: HardwareCard, tables: KernelTables) -> Cost:
    """A memory-bound kernel: a measured elementwise table's answer, else the roofline at the table
    set's or the card's share of HBM bandwidth."""
    # one eager kernel (shape.op): a measured elementwise table answers it by (op, dtype) and bytes
    if shape.op:
        hit = tables.lookup(shape, 1.0)  # no FLOPs: the peak is not used
        if hit is not None:
            detail = f"{hit.method} from {hit.table}" + (f" ({hit.note})" if hit.note else "")
            if hit.method == "extrapolated":
                detail = f"outside table {hit.table}: {hit.note}"
            return Cost(shape.flops, shape.bytes, hit.seconds, Bound.MEMORY, Source.TABLE, detail)
    # other elementwise kernels: no table times them, but a table set may bring the rule its own
    # predictions price them with (aiconfigurator's share of HBM bandwidth and fixed time per
    # memory-bound op), which then replaces the card's generic share and launch overhead so that the
    # composition around its measured kernels is the one it was checked with
    rule = tables.elementwise_memory_efficiency
    if rule is not None:
        return roofline_cost(shape, hw, f"roofline at {elementwise_rule_text(tables)} (the kernel tables' "
                                        f"elementwise rule)", elementwise=rule, per_kernel=tables.elementwise_latency)
    return roofline_cost(shape, hw)


def elementwise_rule_text(tables: KernelTables) -> str:
    """A table set's elementwise rule in words ("0.80 of HBM bandwidth + 3 us per kernel"); only for
    tables that bring one (elementwise_memory_efficiency not None)."""
    latency = tables.elementwise_latency
    each = "" if latency is None else f" + {latency * 1e6:g} us per kernel"
    return f"{tables.elementwise_memory_efficiency:.2f} of HBM bandwidth{each}"
