"""Targets, the best deployment of each variant with its binding constraint, and Pareto frontiers.

A *variant* is a design: the values of the grid axes that are not deployment choices (model and
hardware fields, ISL/OSL, numeric formats). Rows of one variant that differ in GPU count,
parallel layout, overlap, MoE communication or batch are alternative deployments of it; the best
deployment is the feasible one with the most decode tokens per GPU per second.

Feasible: simulated, the batch's KV cache fits, and every given target holds
(TPOT <= --target-tpot-ms, TTFT <= --target-ttft-ms, decode TGS >= --target-tgs). The TTFT is the
single-request TTFT (one prompt alone on an idle server, as the main report's), not the workload's
prefill step when that packs several prompts. Each test is a
threshold on one number, so tightening a target can only remove rows from the feasible set.

The binding constraint of a best deployment is what stops the same layout from running a larger
batch (the lever for more tokens per GPU): "KV capacity" when a larger batch does not fit,
"latency target (TPOT)" / "latency target (TTFT)" when the next larger batch misses that target;
otherwise (the largest batch tried is the best) what dominates its decode step: "compute",
"memory bandwidth", "communication" or "overhead" (launch and scheduler time).

Pareto frontier (per variant): x = per-request output speed 1/TPOT (tokens/s per user, higher is
better), y = USD per million output tokens (lower is better): the decode step's GPU-hours plus its
energy at the run's electricity price and PUE (Row.total_cost_per_mtok; the GPU-hours alone where
the hardware card has no power facts). A point is kept unless another point
is at least as good on both and better on one; among points equal on both, one representative
is kept (the one with the fewest GPUs). So every dropped point is weakly dominated by a kept one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infersim.base.errors import InferSimError
from infersim.sweep.evaluate import UNFIT, Row, SweepSpec


@dataclass(frozen=True)
class Targets:
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    tgs: float | None = None
    user_tps: float | None = None  # per-request output speed, tokens/s per user (at least): a TPOT bound

    def __post_init__(self) -> None:
        for name, value in (("--target-tpot-ms", self.tpot_ms), ("--target-ttft-ms", self.ttft_ms),
                            ("--target-tgs", self.tgs), ("--target-user-tps", self.user_tps)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise InferSimError(f"{name} must be a positive number (got {value})")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.tpot_ms, self.ttft_ms, self.tgs, self.user_tps))

    @property
    def needs_prefill(self) -> bool:
        return self.ttft_ms is not None

    def failures(self, row: Row) -> list[str]:
        """Which targets a simulated row misses ("TPOT", "TTFT", "TGS")."""
        out = []
        if (self.tpot_ms is not None and not row.tpot_s * 1e3 <= self.tpot_ms) or \
                (self.user_tps is not None and not row.user_tps >= self.user_tps):
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
        if self.user_tps is not None:
            parts.append(f">= {self.user_tps:g} tok/s/user")
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
    return (row.user_tps, row.total_cost_per_mtok)


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


# ---------------------------------------------------------------------------------------------
# The answer of a Pareto search: the cheapest point, per variant and overall


@dataclass(frozen=True)
class Choice:
    """The cheapest feasible point of one variant, or why it has none."""

    variant: tuple[Any, ...]
    row: Row | None
    reason: str = ""  # why no point is feasible ("" when row is given)


def _cheapest_key(row: Row) -> tuple[float, float, int]:
    # cheapest per million output tokens; then faster per request; then fewer GPUs
    return (row.total_cost_per_mtok, -row.user_tps, row.num_gpus)


def all_variants(spec: SweepSpec) -> list[tuple[Any, ...]]:
    """Every variant the grid names, in grid order (a variant none of whose layouts fits has no row)."""
    import itertools

    return list(itertools.product(*(spec.axes[i].values for i in variant_axes(spec))))


def _short_problem(status: str) -> str:
    """A validator's message without its field path and its parenthesised detail."""
    head, sep, rest = status.partition(": ")
    text = rest if sep and " " not in head else status
    return text.split(" (", 1)[0]


def no_point_reason(group: Sequence[Row], targets: Targets, searched: dict[str, int] | None = None,
                    interrupted: bool = False) -> str:
    """Why a variant has no feasible point, with the counts (most frequent first): its rows, and
    `searched` (why its searched layouts gave no row)."""
    counts: dict[str, int] = {}
    for reason, n in (searched or {}).items():
        key = "layouts where no batch fits in memory" if reason == UNFIT else \
            f"layouts rejected: {_short_problem(reason)}"
        counts[key] = counts.get(key, 0) + n
    if not group and not counts:
        return "not simulated before the interrupt" if interrupted else "no searched layout and batch fits in memory"
    for row in group:
        if not row.ok:
            reason = f"rejected: {_short_problem(row.status)}"
        elif not row.fits:
            reason = "do not fit in memory"
        else:
            reason = f"miss {targets.describe()}"
        counts[reason] = counts.get(reason, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return "; ".join(f"{n:,} {reason}" for reason, n in ordered[:3])


def cheapest_per_variant(spec: SweepSpec, rows: Sequence[Row], targets: Targets,
                         by_point: dict[int, dict[str, int]] | None = None, interrupted: bool = False) -> list[Choice]:
    """Each variant's cheapest feasible point (per million output tokens), or why it has none
    (`by_point`: why each grid point's searched layouts gave no row, SweepResult.by_point)."""
    groups = _group(spec, rows)
    idx = variant_axes(spec)
    searched: dict[tuple[Any, ...], dict[str, int]] = {}
    for point, reasons in (by_point or {}).items():
        mine = searched.setdefault(tuple(spec.values(point)[i] for i in idx), {})
        for reason, n in reasons.items():
            mine[reason] = mine.get(reason, 0) + n
    out = []
    for variant in all_variants(spec):
        group = groups.get(variant, [])
        ok = [r for r in group if feasible(r, targets) and not math.isnan(r.total_cost_per_mtok)]
        if ok:
            out.append(Choice(variant, min(ok, key=_cheapest_key)))
        else:
            out.append(Choice(variant, None, no_point_reason(group, targets, searched.get(variant), interrupted)))
    return out


def cheapest_overall(choices: Sequence[Choice]) -> Choice | None:
    found = [c for c in choices if c.row is not None]
    return min(found, key=lambda c: _cheapest_key(c.row)) if found else None  # type: ignore[arg-type]
