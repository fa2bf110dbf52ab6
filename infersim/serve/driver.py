"""Runs a workload's stages on a pool of instances: arrivals, sessions and routing in time order.

Stage by stage (infersim.serve.workload_spec): the stage's requests are sent on its timer (a
closed-loop stage sends `concurrency` at its start and one more as each ends), a user's next round
or a session's next turn is sent when the last one ends (infersim.serve.datasets), and the stage
ends when every request it sent has ended; the next starts `interval_s` later. Instances keep their
state, the prefix cache included, from stage to stage.

The instances are co-simulated: the instance whose next step starts first runs, up to the next start
of any other instance or the next send; sends are delivered in time order, when every instance has
run its steps that start before them. A send reaches an instance during a step that started before
it, which engines see at the next step, so the interleaving is exact, and a router sees each
instance's requests as they stand at the send: round-robin (by send), least-loaded (fewest requests
in the instance), or cache-aware (the instance holding most of the prompt's tokens in its prefix
cache, as SGLang's router routes, unless the loads are out of balance: then least-loaded, as its
balance thresholds say; CACHE_AWARE_* below).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import count

from infersim.serve.datasets import Traffic
from infersim.serve.outcomes import Outcomes
from infersim.serve.scheduler import Instance, RequestState
from infersim.serve.workload import Request
from infersim.serve.workload_spec import StageSpec, WorkloadSpec

# sgl-project/sglang sgl-router (cache_aware policy): route by prefix match unless the loads are out of
# balance: max - min > balance_abs_threshold and max > min x balance_rel_threshold; a match below
# cache_threshold of the prompt goes to the least-loaded instance
CACHE_AWARE_ABS = 32
CACHE_AWARE_REL = 1.0001
CACHE_AWARE_MATCH = 0.5


@dataclass(frozen=True)
class StageRun:
    """When a stage ran: its start (of its counted window, past a lead-in) and the end of its last
    request (its tail's included)."""

    index: int
    spec: StageSpec
    start_s: float
    end_s: float


def _next_start(inst: Instance) -> float:
    if not inst.idle():
        return inst.now
    return max(inst.now, inst.pending[0].ready_s) if inst.pending else math.inf


class Driver:
    def __init__(self, instances: list[Instance], traffic: Traffic, outcomes: Outcomes, router: str,
                 max_waiting: int) -> None:
        self.instances = instances
        self.traffic = traffic
        self.outcomes = outcomes
        self.router = router
        self.events: list[tuple[float, int, Request]] = []
        self.order = count()
        self.sent = 0
        self.closed_source: Iterator[Request] | None = None
        for inst in instances:
            inst.drop_sink = self._dropped

    def run(self, spec: WorkloadSpec) -> list[StageRun]:
        runs = []
        start = 0.0
        for index, stage in enumerate(spec.stages):
            for inst in self.instances:
                inst.stats.itl_sink = self.outcomes.itl_sink(index)
                inst.max_waiting = 0 if stage.concurrency is not None else inst.max_waiting
            end = self._stage(index, stage, start)
            # a windowed stage's counted requests start arriving after its lead-in
            runs.append(StageRun(index, stage, start + stage.lead_s, end))
            start = end + spec.interval_s
        return runs

    def _stage(self, index: int, stage: StageSpec, start: float) -> float:
        source = self.traffic.stage_requests(index, stage, start)
        self.closed_source = None
        if stage.concurrency is not None:
            self.closed_source = source
            for _ in range(stage.concurrency):
                req = next(source, None)
                if req is None:
                    break
                self._push(replace(req, arrival_s=start))
            source = iter(())
        self._loop(source)
        return max([inst.now for inst in self.instances] + [start])

    def _push(self, req: Request) -> None:
        """A send decided while an instance runs (a finish releases it): no instance may start a step
        at or after it before it is delivered."""
        heapq.heappush(self.events, (req.arrival_s, next(self.order), req))
        for inst in self.instances:
            inst.limit = min(inst.limit, req.arrival_s)

    def _loop(self, source: Iterator[Request]) -> None:
        ahead = next(source, None)
        instances = self.instances
        while True:
            t_source = ahead.arrival_s if ahead is not None else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            starts = [_next_start(inst) for inst in instances]
            first = min(range(len(instances)), key=lambda j: (starts[j], j))
            t_send = min(t_source, t_event)
            if t_send == math.inf and starts[first] == math.inf:
                return
            if t_send <= starts[first]:
                if t_event <= t_source:
                    self._send(heapq.heappop(self.events)[2])
                else:
                    assert ahead is not None
                    self._send(ahead)
                    ahead = next(source, None)
                continue
            others = min((starts[j] for j in range(len(instances)) if j != first), default=math.inf)
            runner = instances[first]
            runner.limit = math.inf
            runner.run(until=max(min(others, t_send), starts[first] + 1e-12), on_finish=self._finished)
            runner.limit = math.inf

    def _send(self, req: Request) -> None:
        if not self.traffic.offer(req):
            return  # held until its user's last round ends
        state = RequestState(req)
        self._route(state).add(state)
        self.sent += 1

    def _route(self, state: RequestState) -> Instance:
        instances = self.instances
        if len(instances) == 1:
            return instances[0]
        if self.router == "round-robin":
            return instances[self.sent % len(instances)]
        least = min(instances, key=lambda i: (i.load, i.index))
        if self.router != "cache-aware" or not state.req.segments:
            return least
        loads = [i.load for i in instances]
        if max(loads) - min(loads) > CACHE_AWARE_ABS and max(loads) > min(loads) * CACHE_AWARE_REL:
            return least
        matched = [(i.cache.matched_tokens(state.req.segments, state.req.input_tokens) if i.cache else 0, -i.load,
                    -i.index) for i in instances]
        best = max(range(len(instances)), key=lambda j: matched[j])
        if matched[best][0] < CACHE_AWARE_MATCH * state.req.input_tokens:
            return least
        return instances[best]

    def _finished(self, r: RequestState) -> None:
        for nxt in self.traffic.done(r.req, r.finish_s):
            self._push(nxt)
        if self.closed_source is not None:
            nxt_req = next(self.closed_source, None)
            if nxt_req is not None:
                self._push(replace(nxt_req, arrival_s=r.finish_s))

    def _dropped(self, req: Request) -> None:
        self.outcomes.drop(req)
        for nxt in self.traffic.rejected(req):
            self._push(nxt)

