"""What a serving run keeps of its requests: per load stage, latency samples and totals.

Every request ends one of three ways: it completes (with its output cut to fit, where the engine's
server does that to a request longer than its context: `shortened`, or than the KV pool its
scheduler holds a request to: `pool_shortened`); the server rejects it when it arrives (longer than
the context the server admits, max_model_len, or with a prompt its KV pool refuses); or it is still
waiting, not admitted, when the run stops taking requests into a full queue (`max_waiting`, the
overload guard).
A finished request leaves its TTFT, TPOT, E2E and queueing time in `Samples` (bounded memory; see
infersim.serve.quantiles), the steps' inter-token gaps go to the stage's `itl` samples, and its
times go to the run's timeline (the overload test). Nothing else of it is kept, unless per-request
records are asked for. A request sent in a stage's lead-in or tail (StageSpec.lead_s, tail_s) is
simulated like any other but kept out of every stage and of the whole run (`not_counted`); the
stage's `itl` samples hold the gaps of all its steps, lead-in and tail included.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from infersim.serve.overload import Timeline
from infersim.serve.quantiles import EXACT_LIMIT, Samples

NOT_COUNTED = -2  # the stage index of the requests sent outside every stage's counted window (whole(): -1)

if TYPE_CHECKING:
    from infersim.serve.scheduler import RequestState
    from infersim.serve.workload import Request


class StageOutcomes:
    """Totals and samples of the requests of one load stage (the whole run for single-stage loads)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.ttft = Samples()
        self.tpot = Samples()  # requests of two or more output tokens
        self.e2e = Samples()
        self.queue = Samples()
        self.itl = Samples(weighted=True)  # per-step gaps, weighted by the tokens that saw them
        self.completed = 0
        self.rejected = 0  # refused on arrival: longer than the server admits
        self.dropped = 0  # left waiting: arrived at a full queue (overload guard)
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (either tier)
        self.host_cached_tokens = 0  # of which brought back from the host tier
        self.first_arrival = math.inf
        self.last_arrival = -math.inf
        self.last_finish = 0.0
        self.gap_sum = 0.0  # seconds between first and last token, over requests of 2+ output tokens
        self.gap_count = 0  # their output tokens after the first
        self.good = 0  # completed requests meeting the run's SLO
        # the four samples' value arrays, appended to directly while they are exact (None after)
        self.fast: tuple | None = (self.ttft.values, self.e2e.values, self.queue.values, self.tpot.values)

    @property
    def requests(self) -> int:
        """Requests sent in this stage."""
        return self.completed + self.rejected + self.dropped

    def arrived(self, arrival: float) -> None:
        self.first_arrival = min(self.first_arrival, arrival)
        self.last_arrival = max(self.last_arrival, arrival)

    def merge(self, other: StageOutcomes) -> None:
        self.fast = None
        for name in ("ttft", "tpot", "e2e", "queue", "itl"):
            getattr(self, name).merge(getattr(other, name))
        for name in ("completed", "rejected", "dropped", "input_tokens", "output_tokens", "cached_tokens",
                     "host_cached_tokens", "gap_sum", "gap_count", "good"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.first_arrival = min(self.first_arrival, other.first_arrival)
        self.last_arrival = max(self.last_arrival, other.last_arrival)
        self.last_finish = max(self.last_finish, other.last_finish)


class Outcomes:
    """Per-stage outcomes of a run, its timeline, and (when asked) the requests' final states."""

    def __init__(self, keep_records: bool = False, slo_ttft_s: float | None = None,
                 slo_tpot_s: float | None = None) -> None:
        self.slo_ttft_s = slo_ttft_s  # the run's SLO, held against each request as it completes (goodput)
        self.slo_tpot_s = slo_tpot_s
        self.stages: dict[int, StageOutcomes] = {}
        self.timeline = Timeline()
        self.records: list[RequestState] | None = [] if keep_records else None
        self._last: StageOutcomes | None = None
        # requests sent in a stage's lead-in or tail (StageSpec.lead_s, tail_s): simulated, in no stage
        self.not_counted = StageOutcomes(NOT_COUNTED)
        # the model's context length: completed requests longer (prompt + output) are counted in beyond_context
        self.context_tokens: float = math.inf
        self.beyond_context = 0
        self.admits = ""  # the longest request the server takes, for what it rejects ("" when no limit)
        # requests the server admitted with their output cut to fit its context, and the output tokens cut
        # (every simulated request, counted or not: infersim.serve.admission)
        self.shortened = 0
        self.shortened_tokens = 0
        # of the rejected, those refused for the engine's KV pool, not its context (context_limit.kv_pool);
        # the requests whose output the pool cut further than the context, and the tokens the pool cut
        self.pool_rejected = 0
        self.pool_shortened = 0
        self.pool_shortened_tokens = 0

    def stage(self, index: int) -> StageOutcomes:
        last = self._last
        if last is not None and last.stage == index:
            return last
        found = self.stages.get(index)
        if found is None:
            found = self.stages[index] = StageOutcomes(index)
        self._last = found
        return found

    def __len__(self) -> int:
        return sum(s.completed for s in self.stages.values())

    def add(self, r: RequestState) -> None:
        """A completed request (on every request's path: kept lean)."""
        req = r.req
        s = self._last
        if not req.counted:
            s = self.not_counted
        elif s is None or s.stage != req.stage:
            s = self.stage(req.stage)
        arrival = req.arrival_s
        finish = r.finish_s
        ttft = r.first_token_s - arrival
        e2e = finish - arrival
        out = req.output_tokens
        s.completed += 1
        queued = r.scheduled_s - arrival
        if queued < 0.0:
            queued = 0.0
        tpot = (e2e - ttft) / (out - 1) if out > 1 else None
        fast = s.fast
        if fast is not None and len(fast[0]) < EXACT_LIMIT:  # the samples' own arrays, while exact
            fast[0].append(ttft)
            fast[1].append(e2e)
            fast[2].append(queued)
            if tpot is not None:
                fast[3].append(tpot)
        else:
            self._add_folded(s, ttft, e2e, queued, tpot)
        if tpot is not None:
            s.gap_sum += e2e - ttft
            s.gap_count += out - 1
        if self.slo_ttft_s is None and self.slo_tpot_s is None or self._meets(ttft, tpot):
            s.good += 1
        s.input_tokens += req.input_tokens
        s.output_tokens += out
        if req.input_tokens + out > self.context_tokens:
            self.beyond_context += 1
        if r.cached:
            s.cached_tokens += r.cached
            s.host_cached_tokens += r.host_cached
        if arrival < s.first_arrival:
            s.first_arrival = arrival
        if arrival > s.last_arrival:
            s.last_arrival = arrival
        if finish > s.last_finish:
            s.last_finish = finish
        self.timeline.request(arrival, r.scheduled_s)
        if self.records is not None and req.counted:
            self.records.append(r)

    @staticmethod
    def _add_folded(s: StageOutcomes, ttft: float, e2e: float, queued: float, tpot: float | None) -> None:
        s.fast = None
        s.ttft.add(ttft)
        s.e2e.add(e2e)
        s.queue.add(queued)
        if tpot is not None:
            s.tpot.add(tpot)

    def _meets(self, ttft: float, tpot: float | None) -> bool:
        if self.slo_ttft_s is not None and ttft > self.slo_ttft_s:
            return False
        return self.slo_tpot_s is None or tpot is None or tpot <= self.slo_tpot_s

    def reject(self, req: Request, for_pool: bool = False) -> None:
        """A request the server refuses on arrival (`for_pool`: for its KV pool, not its context)."""
        self.pool_rejected += for_pool
        s = self.stage(req.stage) if req.counted else self.not_counted
        s.rejected += 1
        s.arrived(req.arrival_s)
        self.timeline.request(req.arrival_s, req.arrival_s)

    def shorten(self, cut: int, for_pool: bool = False) -> None:
        """A request the server admits with `cut` fewer output tokens than it asked for (`for_pool`:
        than its context leaves it, for its KV pool)."""
        if for_pool:
            self.pool_shortened += 1
            self.pool_shortened_tokens += cut
        else:
            self.shortened += 1
            self.shortened_tokens += cut

    def drop(self, req: Request) -> None:
        """A request that arrived at a full queue and was never admitted."""
        s = self.stage(req.stage) if req.counted else self.not_counted
        s.dropped += 1
        s.arrived(req.arrival_s)
        self.timeline.arrival(req.arrival_s)

    def itl_sink(self, stage: int) -> Samples:
        return self.stage(stage).itl

    def served(self) -> StageOutcomes:
        """Every simulated request, counted or not: what the run's time integrals and energy cover."""
        whole = self.whole()
        if not self.not_counted.requests:
            return whole
        merged = StageOutcomes(-1)
        merged.merge(whole)
        merged.merge(self.not_counted)
        return merged

    def whole(self) -> StageOutcomes:
        """The whole run: the one stage, or every stage merged."""
        stages = [self.stages[k] for k in sorted(self.stages)]
        if len(stages) == 1:
            return stages[0]
        merged = StageOutcomes(-1)
        for s in stages:
            merged.merge(s)
        return merged
