"""What a trace's GPU events may be, and what is said about those that cannot be.

A kernel's time is its duration, so an impossible duration is dropped, never measured: a duration
that is not a finite number, a negative one, or one longer than `MAX_EVENT_US` (no kernel of a
serving step runs for an hour; a value of 1e300 would otherwise print a 300-digit measurement).
Events repeated exactly (same GPU, stream, name, start and duration: a file concatenated with
itself, or merged twice) are counted once; repeats would double every module's time and teach
`mfu from-trace` kernels twice as slow. Kernels on one stream that start before the previous one
ended are counted and reported, not dropped: a CUDA graph's parallel branches are recorded on the
stream of their launch and do overlap. Every dropped event is counted by reason and said in the
notes of what is measured or learned.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

#: the longest duration taken as a GPU event (microseconds: one hour)
MAX_EVENT_US = 3.6e9
#: how far a kernel may start before the previous one on its stream ended without being reported (us)
OVERLAP_TOLERANCE_US = 1.0

NOT_FINITE = "timestamp or duration not a finite number"
NEGATIVE = "negative duration"
TOO_LONG = "duration longer than an hour"
DUPLICATE = "exact repeats of another kernel (same GPU, stream, name, start and duration)"
NOT_A_NUMBER = "timestamp or duration not a number (true or false)"
BEFORE_LAUNCH = "start more than a second before the CPU launched them"
#: how long before its launch (one CPU event of its correlation id) a kernel may seem to start: the
#: profiler puts GPU times on the CPU clock, so a kernel cannot start before it is launched; a
#: second is far beyond any clock offset and catches timestamps of another epoch (0 among Unix times)
LAUNCH_SKEW_US = 1e6
AFTER_LAUNCH = "start more than a minute after the CPU launched them"
#: how long after its launch a kernel may start: the launch queue holds about a thousand kernels,
#: so a minute's wait needs each queued kernel to run ~60 ms; a later start is a timestamp of
#: another clock or a corrupted event, and would stretch the step it falls in by that much
LAUNCH_DELAY_US = 60e6
OUTSIDE_LAUNCHES = ("no launch of their own, and a start more than a second before the trace's first launch or more "
                    "than a minute after its last")


@dataclass
class EventChecks:
    """Counts kept while a trace streams by."""

    dropped: Counter[str] = field(default_factory=Counter)
    args_not_object: int = 0
    names_not_text: int = 0

    def duration_problem(self, duration: float) -> str | None:
        """Why a duration (already a float) cannot be a GPU event's, or None."""
        if not math.isfinite(duration):
            return NOT_FINITE
        if duration < 0.0:
            return NEGATIVE
        if duration > MAX_EVENT_US:
            return TOO_LONG
        return None

    def notes(self, overlaps: int) -> tuple[str, ...]:
        out = [f"{count:,} GPU event{'s' if count > 1 else ''} dropped: {reason}"
               for reason, count in sorted(self.dropped.items())]
        if self.args_not_object:
            out.append(f"{self.args_not_object:,} events with `args` that is not an object: their stream and "
                       "correlation were not read")
        if self.names_not_text:
            out.append(f"{self.names_not_text:,} events with a name that is not text: read as the text of the value")
        if overlaps:
            out.append(f"{overlaps:,} kernels start more than {OVERLAP_TOLERANCE_US:g} us before the previous kernel on "
                       "their stream ended (concurrent CUDA-graph branches, or a damaged trace)")
        return tuple(out)


@dataclass(frozen=True)
class KernelColumns:
    lane: array
    stream: array
    start: array
    dur: array
    name: array


def repeats_and_overlaps(k: KernelColumns) -> tuple[list[int], int]:
    """(rows that repeat an earlier kernel exactly, kernels overlapping their stream's previous one).
    A stream whose kernels are in start order (as profilers write them) is checked in one pass; any
    other is sorted first."""
    streams: dict[tuple[int, int], array] = {}
    for row in range(len(k.start)):
        key = (k.lane[row], k.stream[row])
        rows = streams.get(key)
        if rows is None:
            rows = streams[key] = array("l")
        rows.append(row)
    repeats: list[int] = []
    overlaps = 0
    for rows in streams.values():
        ordered: list[int] | array = rows
        if any(k.start[rows[i]] > k.start[rows[i + 1]] for i in range(len(rows) - 1)):
            ordered = sorted(rows, key=lambda r: (k.start[r], k.dur[r], k.name[r], r))
        previous = -1
        end = -math.inf
        for row in ordered:
            if previous >= 0 and k.start[row] == k.start[previous] and k.dur[row] == k.dur[previous] \
                    and k.name[row] == k.name[previous]:
                repeats.append(row)
                continue
            if k.start[row] < end - OVERLAP_TOLERANCE_US:
                overlaps += 1
            end = max(end, k.start[row] + k.dur[row])
            previous = row
    repeats.sort()
    return repeats, overlaps


def off_launch(kernel_corr: array, kernel_start: array, launch_corr: array,
               launch_start: array) -> tuple[list[int], list[int], list[int]]:
    """(rows of kernels that start more than LAUNCH_SKEW_US before their launch, rows of kernels that
    start more than LAUNCH_DELAY_US after it, rows of kernels with no launch of their correlation id
    that start outside the trace's launches by as much: a profiled process's kernels run while it
    launches them, and one at another clock's time would stretch the step it joins by that much).
    Only correlation ids of one launch are checked against their launch (ids several launches share
    are matched to a launch later, by time). The launches are looked up by bisection in their ids
    (sorted, as Kineto numbers them, or sorted here into typed arrays): no dict per launch in a
    trace of millions."""
    if any(launch_corr[i] > launch_corr[i + 1] for i in range(len(launch_corr) - 1)):
        order = array("l", sorted(range(len(launch_corr)), key=launch_corr.__getitem__))
        ids = array("q", (launch_corr[i] for i in order))
        starts = array("d", (launch_start[i] for i in order))
    else:
        ids, starts = launch_corr, launch_start
    early: list[int] = []
    late: list[int] = []
    stray: list[int] = []
    if not ids:
        return early, late, stray  # a trace of GPU events alone: nothing to place them against
    first, last = min(launch_start), max(launch_start)
    for row, (corr, start) in enumerate(zip(kernel_corr, kernel_start)):
        lo = bisect_left(ids, corr)
        if lo == len(ids) or ids[lo] != corr:
            if start < first - LAUNCH_SKEW_US or start > last + LAUNCH_DELAY_US:
                stray.append(row)
        elif lo + 1 == len(ids) or ids[lo + 1] != corr:
            if start < starts[lo] - LAUNCH_SKEW_US:
                early.append(row)
            elif start > starts[lo] + LAUNCH_DELAY_US:
                late.append(row)
    return early, late, stray


def without_rows(columns: list[array], rows: list[int]) -> list[array]:
    """Each column with the given (sorted) rows left out."""
    if not rows:
        return columns
    drop = set(rows)
    keep = [r for r in range(len(columns[0])) if r not in drop]
    return [array(column.typecode, (column[r] for r in keep)) for column in columns]
