"""An in-process sweep hides the objects alive before it from the garbage collector while it runs
(gc.freeze) and gives them back after, leaving a caller's own freeze alone; results do not depend
on it."""

from __future__ import annotations

import gc

from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep
from infersim.sweep import runner


def _spec() -> SweepSpec:
    return SweepSpec(load_base("qwen3-30b.yaml"), tuple(parse_grid(["workload.decode_batch_per_gpu=1..64:8"])))


def test_objects_are_frozen_during_the_sweep_and_given_back_after():
    seen = []
    original = runner.Evaluator.run

    def run(self, start, stop):
        seen.append(gc.get_freeze_count())
        return original(self, start, stop)

    gc.unfreeze()
    runner.Evaluator.run = run
    try:
        result = run_sweep(_spec(), workers=1, progress=False)
    finally:
        runner.Evaluator.run = original
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0
    assert result.simulated == 8


def test_a_callers_freeze_is_left_alone_and_rows_are_the_same():
    plain = run_sweep(_spec(), workers=1, progress=False).rows
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        rows = run_sweep(_spec(), workers=1, progress=False).rows
        # neither unfrozen (0) nor frozen again (more); a frozen object that dies leaves the permanent
        # generation, so the count may fall by the objects the sweep let go of (a cache entry replaced)
        assert 0 < gc.get_freeze_count() <= frozen
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
    assert rows == plain
