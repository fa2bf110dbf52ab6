"""Targets, best deployments, binding constraints and Pareto frontiers: right by construction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.sweep import (
    Search,
    SweepSpec,
    Targets,
    best_per_variant,
    dominates,
    feasible,
    frontiers,
    load_base,
    parse_grid,
    pareto_indices,
    point_of,
    run_sweep,
)
from infersim.base.errors import InferSimError


@pytest.fixture(scope="module")
def base():
    return load_base("qwen3-30b.yaml")


@pytest.fixture(scope="module")
def searched(base):
    """A small layout search: 1-16 H20s, PP up to 2, batches 1..256 (+ the largest that fits), with TTFT."""
    spec = SweepSpec(base, search=Search(gpus=(1, 2, 4, 8, 16), batches=(1, 4, 16, 64, 256), max_pp=2),
                     prefill=True)
    return spec, run_sweep(spec, workers=1)


@pytest.fixture(scope="module")
def grid_rows(base):
    spec = SweepSpec(base, tuple(parse_grid(["model.num_key_value_heads=2,4", "deployment.ffn.ep=1,2,4",
                                             "workload.decode_batch_per_gpu=8..512"])), prefill=True)
    return spec, run_sweep(spec, workers=1).rows


def test_frontier_points_are_non_dominated_and_dropped_points_dominated(searched):
    spec, result = searched
    (front,) = frontiers(spec, result.rows, Targets()).values()
    points = [r for r in result.rows if feasible(r, Targets())]
    assert len(points) > 100 and 3 <= len(front) < len(points) / 5
    kept = {id(r) for r in front}
    for f in front:
        assert not any(dominates(point_of(p), point_of(f)) for p in points)
    for p in points:
        if id(p) not in kept:  # weakly dominated: some frontier point at least as good on both axes
            assert any(point_of(f)[0] >= point_of(p)[0] and point_of(f)[1] <= point_of(p)[1] for f in front)
    # fastest first, each slower point cheaper
    xs = [point_of(f)[0] for f in front]
    ys = [point_of(f)[1] for f in front]
    assert xs == sorted(xs, reverse=True) and ys == sorted(ys, reverse=True)
    assert all(a > b for a, b in zip(ys, ys[1:]))
    # x = 1/TPOT, y = price * GPUs / (3600 * total tokens/s) * 1e6 + the decode step's energy per
    # million output tokens (the H20 card has power facts): J/token x 1e6 / 3.6e6 J/kWh x $0.0804/kWh x PUE 1
    for f in front:
        assert point_of(f)[0] == pytest.approx(1 / f.tpot_s)
        energy = f.joules_per_token * 1e6 / 3.6e6 * 0.0804
        assert energy > 0 and f.energy_usd_per_mtok == pytest.approx(energy)
        assert point_of(f)[1] == pytest.approx(1.18125 * f.num_gpus / (3600 * f.tgs * f.num_gpus) * 1e6 + energy)


def test_frontier_under_a_target_is_the_frontier_of_the_feasible_points(searched):
    spec, result = searched
    loose = frontiers(spec, result.rows, Targets())[()]
    tight = frontiers(spec, result.rows, Targets(tpot_ms=15.0))[()]
    assert tight and all(r.tpot_s <= 0.015 for r in tight)
    assert min(point_of(r)[1] for r in tight) >= min(point_of(r)[1] for r in loose)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=60))
def test_pareto_indices_on_random_points(raw):
    points = [(float(x), float(y)) for x, y in raw]
    kept = pareto_indices(points)
    assert len({points[i] for i in kept}) == len(kept)  # one representative per distinct point
    for i in kept:
        assert not any(dominates(q, points[i]) for q in points)
    for q in points:
        assert any(points[i][0] >= q[0] and points[i][1] <= q[1] for i in kept)


def test_pareto_ignores_nan_and_prefers_fewer_gpus_on_ties():
    assert pareto_indices([(1.0, math.nan), (1.0, 2.0)]) == [1]
    assert pareto_indices([(1.0, 2.0), (1.0, 2.0)], tiebreak=[8, 4]) == [1]


def _feasible_set(rows, targets):
    return {i for i, r in enumerate(rows) if feasible(r, targets)}


targets_strategy = st.builds(
    Targets,
    tpot_ms=st.none() | st.floats(5, 120),
    ttft_ms=st.none() | st.floats(200, 5000),
    tgs=st.none() | st.floats(50, 8000),
)


@settings(max_examples=150, deadline=None)
@given(targets_strategy, st.floats(0.3, 1.0), st.floats(0.3, 1.0), st.floats(1.0, 3.0))
def test_tightening_a_target_never_grows_the_feasible_set(grid_rows, targets, f_tpot, f_ttft, f_tgs):
    spec, rows = grid_rows
    tighter = Targets(
        tpot_ms=targets.tpot_ms * f_tpot if targets.tpot_ms else 60.0 * f_tpot,
        ttft_ms=targets.ttft_ms * f_ttft if targets.ttft_ms else None,
        tgs=targets.tgs * f_tgs if targets.tgs else None,
    )
    loose, tight = _feasible_set(rows, targets), _feasible_set(rows, tighter)
    assert tight <= loose
    best_loose = {b.variant: b.row for b in best_per_variant(spec, rows, targets)}
    for b in best_per_variant(spec, rows, tighter):
        if b.row is not None:
            assert best_loose[b.variant] is not None and best_loose[b.variant].tgs >= b.row.tgs


def test_best_deployment_and_binding_constraints(grid_rows):
    spec, rows = grid_rows
    # no target: the best of each KV-heads variant is its biggest batch that fits, stopped by KV capacity
    for best in best_per_variant(spec, rows, Targets()):
        group = [r for r in rows if spec.values(r.point)[0] == best.variant[0]]
        assert best.row.tgs == max(r.tgs for r in group if r.ok and r.fits)
        assert best.binding == "KV capacity"
        assert best.candidates == len(group) and best.feasible == sum(r.fits for r in group)
    # a TPOT target tight enough that a larger batch that fits misses it: the latency target binds
    target = Targets(tpot_ms=25.0)
    bests = best_per_variant(spec, rows, target)
    by_variant = {b.variant: b for b in bests}
    b = by_variant[(2,)]
    assert b.row.tpot_s <= 0.025 and b.binding == "latency target (TPOT)"
    assert b.row.tgs == max(r.tgs for r in rows if spec.values(r.point)[0] == 2 and feasible(r, target))
    # nothing meets an impossible target, and the reason says why
    none = best_per_variant(spec, rows, Targets(tpot_ms=1.0))
    assert all(x.row is None and x.binding.startswith("none feasible:") and "misses TPOT" in x.binding for x in none)


def test_binding_is_the_step_bound_when_the_largest_batch_is_best(base):
    spec = SweepSpec(base, tuple(parse_grid(["deployment.ffn.ep=4", "workload.decode_batch_per_gpu=1,2"])))
    rows = run_sweep(spec, workers=1).rows
    (best,) = best_per_variant(spec, rows, Targets())
    assert best.row.batch == 2 and best.binding == best.row.bound
    assert best.binding in {"compute", "memory bandwidth", "communication", "overhead"}


def test_ttft_target_without_prefill_is_never_met(base):
    spec = SweepSpec(base, tuple(parse_grid(["workload.decode_batch_per_gpu=8"])))
    (row,) = run_sweep(spec, workers=1).rows
    assert feasible(row, Targets()) and not feasible(row, Targets(ttft_ms=1e9))


def test_targets_must_be_positive():
    with pytest.raises(InferSimError, match="--target-tpot-ms must be a positive number"):
        Targets(tpot_ms=0)
    with pytest.raises(InferSimError, match="--target-tgs"):
        Targets(tgs=float("nan"))
