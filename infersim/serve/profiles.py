"""Load profiles: when the requests of each load stage are sent, as each benchmark client sends them.

Timers (`timer` of a profile), each over one stage of n requests from the stage's start:
  poisson          open loop, gaps gamma-distributed with shape `burstiness` (1: exponential) and
                   mean 1 / rate, not rescaled: InferSim's own --rate, and sglang.bench_serving
                   (get_request: exponential gaps at --request-rate)
  vllm             vllm bench serve (benchmarks/serve.py get_request): the same gamma gaps, then
                   rescaled so that the last request is sent at n / rate exactly; with a ramp-up
                   (--ramp-up-strategy linear|exponential from --ramp-up-start-rps to
                   --ramp-up-end-rps) request i's gap is drawn at the rate reached at i / (n - 1) of the
                   ramp (linear: start + (end - start) x progress; exponential: start x
                   (end / start)^progress) and nothing is rescaled
  constant         inference-perf's `constant` load (loadgen/load_timer.py ConstantLoadTimer): n =
                   int(rate x duration) exponential gaps rescaled to sum to the stage's duration
  ip-poisson       inference-perf's `poisson` load (PoissonLoadTimer): each second holds a Poisson
                   number of requests (mean: the rate) spread over it as a `constant` timer spreads
                   them over a stage, a second without any skipped; the stage sends
                   int(rate x duration) requests
Every timer is seeded; a rescaled one takes two passes over the same seeded draws (no list held).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from infersim.serve.workload import poisson_draw

TIMERS = ("poisson", "vllm", "constant", "ip-poisson")
RAMPS = ("linear", "exponential")


@dataclass(frozen=True)
class Ramp:
    strategy: str  # linear | exponential
    start_rps: float
    end_rps: float

    def rate(self, index: int, total: int) -> float:
        progress = index / max(total - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress


def _gap(rng: random.Random, rate: float, burstiness: float) -> float:
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def gamma_times(count: int, rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Send times of `count` requests at `rate` with gamma gaps (the first after one gap)."""
    rng = random.Random(seed)
    t = 0.0
    for _ in range(count):
        t += _gap(rng, rate, burstiness)
        yield t


def vllm_times(count: int, rate: float, burstiness: float, seed: int, ramp: Ramp | None = None) -> Iterator[float]:
    """vllm bench serve's send times (see module docstring)."""
    if ramp is not None:
        rng = random.Random(seed)
        t = 0.0
        for i in range(count):
            t += _gap(rng, ramp.rate(i, count), burstiness)
            yield t
        return
    last = next(iter(deque(gamma_times(count, rate, burstiness, seed), maxlen=1)), 0.0)
    scale = (count / rate) / last if last > 0 else 1.0
    for t in gamma_times(count, rate, burstiness, seed):
        yield t * scale


def constant_times(count: int, duration: float, rng: random.Random) -> Iterator[float]:
    """inference-perf's ConstantLoadTimer: `count` exponential gaps rescaled to sum to `duration`."""
    if count <= 0:
        return
    state = rng.getstate()
    total = sum(rng.expovariate(1.0) for _ in range(count))
    rng.setstate(state)
    scale = duration / total
    t = 0.0
    for _ in range(count):
        t += rng.expovariate(1.0) * scale
        yield t


def ip_poisson_times(count: int, rate: float, rng: random.Random) -> Iterator[float]:
    """inference-perf's PoissonLoadTimer (see module docstring), the first `count` send times."""
    second = 0.0
    sent = 0
    while sent < count:
        in_second = poisson_draw(rng, rate)
        if in_second:
            for t in constant_times(in_second, 1.0, rng):
                yield second + t
                sent += 1
                if sent >= count:
                    return
        second += 1.0


def stage_times(timer: str, count: int, rate: float, duration: float | None, burstiness: float, seed: int,
                ramp: Ramp | None = None) -> Iterator[float]:
    """Send times (from the stage's start) of one stage's `count` requests."""
    if timer == "constant":
        assert duration is not None
        return constant_times(count, duration, random.Random(seed))
    if timer == "ip-poisson":
        return ip_poisson_times(count, rate, random.Random(seed))
    if timer == "vllm":
        return vllm_times(count, rate, burstiness, seed, ramp)
    return gamma_times(count, rate, burstiness, seed)
