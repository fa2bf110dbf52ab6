"""The launch queue of an engine without an overlap scheduler (cards.engine.launch_queue_seconds): one
host thread launches the kernels launch_cpu apart, the GPU runs them in launch order. Its closed form over
repeated layers against a kernel-by-kernel simulation, and hand-derived cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.cards.engine import LaunchRun, launch_queue_seconds

US = 1e-6


def simulated(runs: list[LaunchRun], launch_cpu: float) -> float:
    """Kernel by kernel: launch i at host time (i + 1) x launch_cpu, start at max(launch, previous end)."""
    host, gpu_free = 0.0, 0.0
    for run in runs:
        for _ in range(run.repeat):
            for kernels, seconds in run.operations:
                if kernels == 0:
                    gpu_free += seconds
                    continue
                for _ in range(kernels):
                    host += launch_cpu
                    gpu_free = max(gpu_free, host) + seconds / kernels
    return max(gpu_free, host)


def test_gpu_bound_kernels_queue_behind_the_first_launch() -> None:
    # three 10 us kernels launched 1 us apart: the GPU starts at 1 us and runs them back to back
    assert launch_queue_seconds([LaunchRun(((1, 10 * US),) * 3)], 1 * US) == pytest.approx(31 * US)


def test_host_bound_kernels_end_one_kernel_after_the_last_launch() -> None:
    # launched at 10, 20, 30 us, each 1 us long
    assert launch_queue_seconds([LaunchRun(((1, 1 * US),) * 3)], 10 * US) == pytest.approx(31 * US)


def test_alternating_host_and_gpu_bound_stretches_take_longer_than_either() -> None:
    # a layer: four 1 us kernels (host-bound at 10 us a launch), then a 50 us GEMM; three layers
    layer = LaunchRun(((4, 4 * US), (1, 50 * US)), repeat=3)
    host, gpu = 3 * 5 * 10 * US, 3 * 54 * US
    queued = launch_queue_seconds([layer], 10 * US)
    # layer 1: small kernels launched at 10..40 end at 41, the GEMM launched at 50 ends at 100; layer 2's
    # small kernels (launched 60..90) wait for it and run 100..104, its GEMM (launched at 100) 104..154;
    # layer 3's run 154..158 and its GEMM (launched at 150) 158..208
    assert queued == pytest.approx(208 * US) and queued > max(host, gpu)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 100.0)), min_size=1, max_size=6),
                          st.integers(1, 6)), min_size=1, max_size=4),
       st.floats(0.1, 30.0))
def test_closed_form_matches_the_kernel_by_kernel_queue(runs: list, launch_cpu: float) -> None:
    launches = [LaunchRun(tuple((k, g * US) for k, g in ops), repeat) for ops, repeat in runs]
    expected = simulated(launches, launch_cpu * US)
    assert launch_queue_seconds(launches, launch_cpu * US) == pytest.approx(expected, rel=1e-9, abs=1e-15)
