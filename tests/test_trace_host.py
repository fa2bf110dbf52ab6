"""The host's waits for the GPU inside a step (trace.host.HostWaits): merged per thread, clipped to a
window, so that a step's host work and its launch spacing leave them out."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from infersim.trace.host import HostWaits


def waits(*spans: tuple[int, float, float]) -> HostWaits:
    raw = SimpleNamespace(wait_thread=array("i", [t for t, _, _ in spans]),
                          wait_start_us=array("d", [a for _, a, _ in spans]),
                          wait_end_us=array("d", [b for _, _, b in spans]))
    return HostWaits(raw)  # type: ignore[arg-type]


def test_waits_are_clipped_to_the_window_and_merged() -> None:
    # thread 0 waits 10..20, 15..30 (one wait 10..30 merged) and 50..60; thread 1 waits 0..100
    w = waits((0, 10.0, 20.0), (0, 15.0, 30.0), (0, 50.0, 60.0), (1, 0.0, 100.0))
    assert w.within(0, 0.0, 100.0) == pytest.approx(20.0 + 10.0)
    assert w.within(0, 25.0, 55.0) == pytest.approx(5.0 + 5.0)  # the ends of both clipped
    assert w.within(0, 12.0, 18.0) == pytest.approx(6.0)  # inside one wait
    assert w.within(0, 31.0, 49.0) == 0.0  # between them
    assert w.within(1, 40.0, 45.0) == pytest.approx(5.0)
    assert w.within(2, 0.0, 100.0) == 0.0  # a thread that never waited


def test_the_last_wait_that_starts_in_a_window() -> None:
    w = waits((0, 10.0, 20.0), (0, 50.0, 60.0))
    assert w.last_end(0, 0.0, 55.0) == 60.0  # starts inside, may end after the window (a region's final sync)
    assert w.last_end(0, 0.0, 40.0) == 20.0
    assert w.last_end(0, 21.0, 40.0) is None
