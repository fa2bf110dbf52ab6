"""A serving run's arrivals: generated (offline, Poisson; infersim.serve.workload) or replayed from a
trace (infersim.serve.trace_replay), produced lazily and identically by every call of
`Arrivals.requests()`: a first pass measures them (count, mean lengths, notes on lengths the
distributions could not deliver), the simulation takes the second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from typing import TYPE_CHECKING, Any

from infersim.run.config import RunConfig
from infersim.base.errors import InferSimError
from infersim.serve.trace_replay import TraceLengths, read_trace, trace_replay
from infersim.serve.workload import (
    DEFAULT_REQUESTS,
    LengthDist,
    LengthTally,
    Request,
    iter_offline,
    iter_poisson,
    length_dist,
)

if TYPE_CHECKING:
    from infersim.serve.options import ServeOptions


@dataclass
class Arrivals:
    """The requests of one run, generated afresh (identically) by every call of `requests()`: a
    first pass measures them (count, mean lengths, notes), the simulation takes the second."""

    requests: Callable[[], Iterator[Request]]
    count: int
    mean_isl: float
    mean_osl: float
    notes: list[str] = field(default_factory=list)


def generated_arrivals(make: Callable[[tuple[LengthTally, LengthTally] | None], Iterator[Request]],
                       isl: LengthDist, osl: LengthDist, isl_name: str, osl_name: str,
                       lengths: TraceLengths | None = None, count: int | None = None) -> Arrivals:
    """Arrivals from a seeded generator `make(tallies)`; one pass counts and measures them (none
    where both lengths are fixed: the means are the lengths)."""
    if isl.dist == "fixed" and osl.dist == "fixed" and lengths is None and count is not None:
        return Arrivals(lambda: make(None), count, float(isl.clip(isl.mean)), float(osl.clip(osl.mean)))
    tallies = (LengthTally(isl_name, isl), LengthTally(osl_name, osl))
    count = total_isl = total_osl = 0
    first: Iterable[Request] = make(tallies)
    if lengths is not None:
        first = lengths.apply(first)
    for r in first:
        count += 1
        total_isl += r.input_tokens
        total_osl += r.output_tokens
    notes = lengths.notes() if lengths is not None else [n for n in (t.note() for t in tallies) if n]

    def again() -> Iterator[Request]:
        stream = make(None)
        return lengths.apply(stream) if lengths is not None else stream

    return Arrivals(again, count, total_isl / count, total_osl / count, notes)


def build_requests(config: RunConfig, opts: ServeOptions) -> Arrivals:
    """The run's arrivals (generated lazily; see Arrivals)."""
    if opts.mode == "trace":
        replay = trace_replay(opts.trace, opts.num_requests, opts.trace_time_scale)
        mean_isl, mean_osl = replay.mean_lengths()
        return Arrivals(replay.__iter__, replay.count, mean_isl, mean_osl, replay.notes())
    isl = opts.isl or length_dist(config.workload.isl, "workload.isl")
    osl = opts.osl or length_dist(config.workload.osl, "workload.osl")
    count = opts.num_requests or DEFAULT_REQUESTS
    lengths = TraceLengths(read_trace(opts.lengths_trace), opts.seed) if opts.lengths_trace else None
    if opts.mode == "poisson":
        def make(tallies: Any) -> Iterator[Request]:
            return iter_poisson(isl, osl, count, opts.rate, opts.seed, opts.burstiness, tallies)
    else:  # offline; concurrency times are set during the run
        def make(tallies: Any) -> Iterator[Request]:
            return iter_offline(isl, osl, count, opts.seed, tallies)
    return generated_arrivals(make, isl, osl, "isl" if opts.isl else "workload.isl",
                              "osl" if opts.osl else "workload.osl", lengths, count)


def listed_arrivals(requests: Iterable[Request]) -> Arrivals:
    """Arrivals from a given list of requests (callers that build their own)."""
    kept = list(requests)
    if not kept:
        raise InferSimError("serve: no requests")
    return Arrivals(kept.__iter__, len(kept), sum(r.input_tokens for r in kept) / len(kept),
                    sum(r.output_tokens for r in kept) / len(kept))
