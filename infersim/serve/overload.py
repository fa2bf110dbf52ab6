"""Is an open-loop load beyond what the deployment serves? The test, and the timeline it reads.

A queue "grows without bound" when requests arrive faster than the engine admits them. The test,
per load stage with arrivals over [start, end]: over the stage's second half (mid, end], take the
requests that arrived (A) and those admitted into a running batch (S); the backlog grew by
G = A - S. The stage is overloaded when G > max(GROWTH_SHARE x A, NOISE_SIGMAS x sqrt(A)) (arrivals
outpaced admissions by more than 5%, beyond Poisson noise), or when any request found its
instance's queue full (the run's `max_waiting` bound; such a request is counted as left waiting,
never admitted). The second half is used so that the run's fill-up (the first requests' service
time, before any completes) does not count as growth. An overloaded stage's saturated capacity is
the rate it admitted requests at over that same half: the engine was busy throughout it, and with
its running batch bounded it admits as fast as it completes. Closed-loop and offline loads are never overloaded (their clients wait for the server).

The timeline counts arrivals and admissions in at most TIMELINE_BINS bins of one width
that doubles (neighbouring bins merge) whenever a time falls past the last bin, so it takes fixed
memory whatever the run's length; counts over a window are exact to one bin at each edge (bins
straddling an edge count in proportion to their overlap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infersim.base.texttable import counted

GROWTH_SHARE = 0.05
NOISE_SIGMAS = 3.0
#: a window's counts are sums of bin shares, so arrivals and admissions that match come out a few
#: float64 roundings apart (1e-13 of a request); a difference this small beside them is rounding
ROUNDING = 1e-9
TIMELINE_BINS = 2048
_FIRST_WIDTH = 1e-3  # seconds


class Timeline:
    """Counts of arrivals and admissions over time, in bounded memory."""

    def __init__(self) -> None:
        self.width = _FIRST_WIDTH
        self.inverse = 1.0 / _FIRST_WIDTH  # bins per second
        self.arrivals = [0] * TIMELINE_BINS
        self.admissions = [0] * TIMELINE_BINS

    def _coarsen(self) -> None:
        for name in ("arrivals", "admissions"):
            bins = getattr(self, name)
            merged = [bins[i] + bins[i + 1] for i in range(0, TIMELINE_BINS, 2)]
            setattr(self, name, merged + [0] * (TIMELINE_BINS - len(merged)))
        self.width *= 2
        self.inverse = 1.0 / self.width

    def _index(self, t: float) -> int:
        index = int(t * self.inverse)
        while index >= TIMELINE_BINS:
            self._coarsen()
            index = int(t * self.inverse)
        return max(index, 0)

    def request(self, arrival: float, admitted: float) -> None:
        """A request that arrived and was admitted at these times (on every request's path)."""
        last = int(admitted * self.inverse)  # the later of the two: coarsen once for both
        if last >= TIMELINE_BINS:
            last = self._index(admitted)
        self.arrivals[int(arrival * self.inverse)] += 1
        self.admissions[last] += 1

    def arrival(self, arrival: float) -> None:
        """A request that arrived and was never admitted."""
        self.arrivals[self._index(arrival)] += 1

    def count(self, name: str, start: float, end: float) -> float:
        """Events of `name` (arrivals, admissions) in (start, end]."""
        if end <= start:
            return 0.0
        bins, width = getattr(self, name), self.width
        total = 0.0
        first, last = max(0, int(start / width)), min(TIMELINE_BINS - 1, int(end / width))
        for i in range(first, last + 1):
            lo, hi = i * width, (i + 1) * width
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                total += bins[i] * overlap / width
        return total


@dataclass(frozen=True)
class StageLoad:
    """One stage's offered load against what the deployment served."""

    stage: int
    start_s: float
    end_s: float  # its arrival window
    offered_rps: float | None  # None: every request of the stage arrived at one instant (a burst has no rate)
    arrived_second_half: float
    admitted_second_half: float
    backlog_growth: float  # arrivals - admissions over the second half
    dropped: int
    overloaded: bool
    saturated_capacity_rps: float | None  # admission rate over the second half, when overloaded and measured

    @property
    def capacity_unmeasured(self) -> str | None:
        """Why an overloaded stage has no saturated capacity (None: it has one, or is not overloaded)."""
        if not self.overloaded or self.saturated_capacity_rps is not None:
            return None
        if self.end_s <= self.start_s:
            return "every request arrived at one instant, leaving no second half of the arrivals to time admissions over"
        return "no request was admitted over the second half of the arrivals, so no admission rate to take"


def assess_stage(timeline: Timeline, stage: int, start: float, end: float, requests: int, dropped: int,
                 offered_rps: float | None = None) -> StageLoad:
    """The overload test of the module docstring over one stage's arrival window [start, end]."""
    mid = (start + end) / 2
    arrived = timeline.count("arrivals", mid, end)
    admitted = timeline.count("admissions", mid, end)
    growth = arrived - admitted
    if abs(growth) <= ROUNDING * max(arrived, admitted, 1.0):
        growth = 0.0
    overloaded = dropped > 0 or (arrived > 0 and growth > max(GROWTH_SHARE * arrived, NOISE_SIGMAS * math.sqrt(arrived)))
    # no admission over the half measures no rate: the capacity is then unknown, not zero
    capacity = admitted / (end - mid) if overloaded and end > mid and admitted > 0 else None
    if offered_rps is None:
        offered_rps = requests / (end - start) if end > start else None
    return StageLoad(stage, start, end, offered_rps, arrived, admitted, growth, dropped, overloaded, capacity)


def warning_text(load: StageLoad, max_waiting: int) -> str:
    """One sentence for an overloaded stage."""
    what = f"stage {load.stage}" if load.stage >= 0 else "the load"
    served = (f"its engines served {load.saturated_capacity_rps:,.3f} req/s at saturation"
              if load.saturated_capacity_rps is not None else
              f"its engines could not keep up (saturated capacity not measured: {load.capacity_unmeasured})")
    offered = f"{load.offered_rps:,.3f} req/s" if load.offered_rps is not None else "its requests at one instant"
    # the timeline pro-rates the bins a half cuts, so its counts are fractional: written as whole requests
    growth, arrived = round(load.backlog_growth), counted(round(load.arrived_second_half), "request")
    # a bounded queue does not grow past max_waiting: what outgrows it is left waiting (counted below)
    behind = (f"{growth:,} of the {arrived} arriving {'was' if growth == 1 else 'were'} not admitted" if load.dropped
              else f"the queue grew by {growth:,} of {arrived}")
    text = f"overloaded: {what} offered {offered}; {served}; over the second half of its arrivals {behind}"
    if load.dropped:
        return text + (f"; {counted(load.dropped, 'request')} found the queue full (max_waiting {max_waiting:,} per "
                       f"instance) and {'was' if load.dropped == 1 else 'were'} left waiting, never admitted. The "
                       "latencies are those of a queue held at that bound, not predictions of a steady state")
    return text + ". Latencies of an overloaded run grow with its length: they are not predictions of a steady state"
