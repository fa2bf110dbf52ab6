"""Targets, the best deployment of each variant with its binding constraint, and Pareto frontiers.

A *variant* is a design: the values of the grid axes that are not deployment choices (model and
hardware fields, ISL/OSL, numeric formats). Rows of one variant that differ in GPU count,
parallel layout, overlap, MoE communication or batch are alternative deployments of it; the best
deployment is the feasible one with the most decode tokens per GPU per second.

Feasible: simulated, the batch's KV cache fits, and every given target holds
(TPOT <= --target-tpot-ms, TTFT <= --target-ttft-ms, decode TGS >= --target-tgs). Each test is a
threshold on one number, so tightening a target can only remove rows from the feasible set.

The binding constraint of a best deployment is what stops the same layout from running a larger
batch (the lever for more tokens per GPU): "KV capacity" when a larger batch does not fit,
"latency target (TPOT)" / "latency target (TTFT)" when the next larger batch misses that target;
otherwise (the largest batch tried is the best) what dominates its decode step: "compute",
"memory bandwidth", "communication" or "overhead" (launch and scheduler time).

Pareto frontier (per variant): x = per-request output speed 1/TPOT (tokens/s per user, higher is
better), y = USD per million output tokens (lower is better). A point is kept unless another point
is at least as good on both and better on one; among points equal on both, one representative
is kept (the one with the fewest GPUs). So every dropped point is weakly dominated by a kept one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infersim.base.errors import InferSimError
from infersim.sweep.evaluate import Row, SweepSpec


@dataclass(frozen=True)
class Targets:
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    tgs: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("--target-tpot-ms", self.tpot_ms), ("--target-ttft-ms", self.ttft_ms),
                            ("--target-tgs", self.tgs)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise InferSimError(f"{name} must be a positive number (got {value})")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.tpot_ms, self.ttft_ms, self.tgs))

    @property
    def needs_prefill(self) -> bool:
        return self.ttft_ms is not None

    def failures(self, row: Row) -> list[str]:
        """Which targets a simulated row misses ("TPOT", "TTFT", "TGS")."""
        out = []
        if self.tpot_ms is not None and not row.tpot_s * 1e3 <= self.tpot_ms:
            out.append("TPOT")
        if self.ttft_ms is not None and not row.ttft_s * 1e3 <= self.ttft_ms:  # NaN TTFT fails
            out.append("TTFT")
        if self.tgs is not None and not row.tgs >= self.tgs:
            out.append("TGS")
        return out

    def describe(self) -> str:
        parts = []
        if self.tpot_ms is not None:
            parts.append(f"TPOT <= {self.tpot_ms:g} ms")
        if self.ttft_ms is not None:
            parts.append(f"TTFT <= {self.ttft_ms:g} ms")
        if self.tgs is not None:
            parts.append(f"TGS >= {self.tgs:g} tokens/GPU/s")
        return ", ".join(parts) or "none"


def feasible(row: Row, targets: Targets) -> bool:
    return row.ok and row.fits and not targets.failures(row)


def why_not(row: Row, targets: Targets) -> str:
    """'' for a feasible row, else the first reason it is not: rejected, does not fit, or the targets missed."""
    if not row.ok:
        return "rejected"
    if not row.fits:
        return "does not fit"
    return ", ".join(f"misses {name}" for name in targets.failures(row))


def variant_axes(spec: SweepSpec) -> list[int]:
    """Indices of the grid axes that define a variant (not deployment choices)."""
    return [i for i, a in enumerate(spec.axes) if not a.is_deployment]


def variant_key(spec: SweepSpec, row: Row, axes: Sequence[int] | None = None) -> tuple[Any, ...]:
    idx = variant_axes(spec) if axes is None else axes
    values = spec.values(row.point)
    return tuple(values[i] for i in idx)


@dataclass(frozen=True)
class Best:
    variant: tuple[Any, ...]  # values of the variant axes
    row: Row | None  # None: no deployment meets the targets
    binding: str  # the binding constraint, or why nothing is feasible
    candidates: int  # simulated deployments of this variant
    feasible: int


def _group(spec: SweepSpec, rows: Sequence[Row]) -> dict[tuple[Any, ...], list[Row]]:
    idx = variant_axes(spec)
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(variant_key(spec, row, idx), []).append(row)
    return groups


def _best_key(row: Row) -> tuple[float, float, int]:
    # most tokens per GPU; then faster per request; then fewer GPUs
    return (row.tgs, -row.tpot_s, -row.num_gpus)


def best_per_variant(spec: SweepSpec, rows: Sequence[Row], targets: Targets) -> list[Best]:
    out = []
    for variant, group in _group(spec, rows).items():
        simulated = [r for r in group if r.ok]
        ok = [r for r in simulated if feasible(r, targets)]
        if not ok:
            out.append(Best(variant, None, _none_reason(group, targets), len(simulated), 0))
            continue
        best = max(ok, key=_best_key)
        out.append(Best(variant, best, binding_constraint(spec, best, group, targets), len(simulated), len(ok)))
    return out


def layout_key(spec: SweepSpec, row: Row) -> tuple[Any, ...]:
    """The deployment of a row without its batch: rows sharing it differ only in batch size
    (the batch may come from the layout search or from a workload.decode_batch_per_gpu axis)."""
    values = spec.values(row.point)
    grid = tuple(v for a, v in zip(spec.axes, values) if a.path != "workload.decode_batch_per_gpu")
    return grid + (row.num_gpus, row.num_nodes, row.pp, row.attn_tp, row.ffn_tp, row.ffn_ep)


def binding_constraint(spec: SweepSpec, best: Row, group: Sequence[Row], targets: Targets) -> str:
    """What keeps `best` (a feasible row) from a larger batch on the same layout (see module doc)."""
    key = layout_key(spec, best)
    larger = sorted((r for r in group if r.ok and r.batch > best.batch and layout_key(spec, r) == key),
                    key=lambda r: r.batch)
    if larger:
        nxt = larger[0]
        if not nxt.fits:
            return "KV capacity"
        missed = targets.failures(nxt)
        for name in ("TPOT", "TTFT"):
            if name in missed:
                return f"latency target ({name})"
    elif best.batch >= best.max_batch:
        return "KV capacity"
    return best.bound


def _none_reason(group: Sequence[Row], targets: Targets) -> str:
    simulated = [r for r in group if r.ok]
    if not simulated:
        problems = sorted({r.status for r in group})
        return "rejected: " + "; ".join(problems[:2]) if problems else "nothing simulated"
    counts: dict[str, int] = {}
    for r in simulated:
        reason = why_not(r, targets)
        counts[reason] = counts.get(reason, 0) + 1
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "none feasible: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Pareto


def pareto_indices(points: Sequence[tuple[float, float]], tiebreak: Sequence[float] | None = None) -> list[int]:
    """Indices of the frontier of (x to maximise, y to minimise) points, by x descending.

    Points with a NaN coordinate are never on it. Among exactly equal points one is kept: the
    one with the smallest `tiebreak` (e.g. GPU count), then the first."""
    order = sorted((i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))),
                   key=lambda i: (-points[i][0], points[i][1], tiebreak[i] if tiebreak else 0, i))
    kept: list[int] = []
    best_y = math.inf
    for i in order:
        if points[i][1] < best_y:
            kept.append(i)
            best_y = points[i][1]
    return kept


def dominates(p: tuple[float, float], q: tuple[float, float]) -> bool:
    """p is at least as good as q on both axes and better on one (x up, y down)."""
    return p[0] >= q[0] and p[1] <= q[1] and (p[0] > q[0] or p[1] < q[1])


def point_of(row: Row) -> tuple[float, float]:
    return (row.user_tps, row.cost_per_mtok)


def energy_point(row: Row) -> tuple[float, float]:
    """(speed per request, J per output token): the frontier of `pareto --objective energy`."""
    return (row.user_tps, row.joules_per_token)


def frontiers(spec: SweepSpec, rows: Sequence[Row], targets: Targets,
              key: Callable[[Row], tuple[float, float]] = point_of) -> dict[tuple[Any, ...], list[Row]]:
    """The Pareto frontier of the feasible rows of each variant, fastest per request first."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for variant, group in _group(spec, rows).items():
        ok = [r for r in group if feasible(r, targets)]
        pts = [key(r) for r in ok]
        out[variant] = [ok[i] for i in pareto_indices(pts, [r.num_gpus for r in ok])]
    return out
