"""Serving workloads: who arrives when, with how many input and output tokens.

Kinds of arrival (all seeded and reproducible with `random.Random(seed)`):
  offline      every request at t = 0 (trtllm-bench throughput, MLPerf Offline)
  poisson      open loop at `rate` requests/s, exponential gaps; with `burstiness` != 1 the gaps are
               gamma-distributed with shape = burstiness and the same mean (vllm bench serve's
               --burstiness: < 1 burstier, > 1 more regular)
  concurrency  closed loop: `concurrency` clients, each sends its next request when the previous
               one completes (zero think time); arrival times are decided during the simulation
  trace        replay of a JSONL or CSV file of (arrival time, input tokens, output tokens[, prefix id,
               prefix tokens]): every row, or the first `num_requests` by arrival time (a cut is
               announced with the number of rows dropped); infersim.serve.trace_replay
Lengths: from a trace (`lengths_from_trace`: (input, output) pairs of a trace's rows drawn with
replacement, jointly, so their correlation is kept), or an int (fixed) or a mapping {dist: fixed|uniform|normal|lognormal, mean, std, min, max}; normal
and lognormal draws are rounded and clipped to [min, max] (min defaults to 1). For lognormal, mean
and std are those of the lengths themselves (not of their logarithm). When clipping, or a tail too
heavy for the number of draws, leaves the realised mean away from the asked one, the run says so.

Memory: requests are generated (or read from the trace's compact columns) one at a time as the
simulation reaches them, never held as a list; a trace is parsed row by row into typed arrays (about
40 bytes a row) rather than a dict per row.

Every number (distribution parameters, rates, trace cells) passes the number rule of
`infersim.cards.schema.check_number`. Arrival times are relative to the run's start (a trace's first
row) and must span at most MAX_SPAN_S: the simulator's clock is float64 seconds, which resolves a
microsecond only up to 2^53 us; past that, millisecond latencies would round away.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infersim.cards.schema import MAX_COUNT, check_number
from infersim.base.errors import ConfigError, InferSimError, echo
from infersim.base.texttable import counted

#: latest arrival (seconds after the run's start) the serving clock resolves to a microsecond:
#: float64 holds whole numbers exactly up to 2^53, so 2^53 us (285 years) of simulated time
MAX_SPAN_S = 2.0 ** 53 * 1e-6
#: most requests one serving run simulates: some 20,000-50,000 requests per CPU second, so about
#: ten CPU minutes at this bound (its memory does not grow with them: infersim.serve.quantiles)
MAX_REQUESTS = 10_000_000
DEFAULT_REQUESTS = 1000


@dataclass(slots=True)
class Request:
    """One request. Never changed once made (a changed copy is made with dataclasses.replace); not
    frozen, because a frozen dataclass pays a call per field to be built and a run builds one per
    request (3.5x the time, a sixth of the plain case's)."""

    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefix_id: str = ""  # requests sharing a prefix id share their first prefix_tokens prompt tokens
    prefix_tokens: int = 0
    # token identity of the prompt's leading parts, (key, length) each (infersim.serve.prefix_cache);
    # the prompt's tokens past them are the request's own
    segments: tuple[tuple[Hashable, int], ...] = ()
    output_key: Hashable = None  # identity of its output tokens where a later prompt holds them
    stage: int = 0  # load stage it belongs to
    counted: bool = True  # False: sent in a stage's lead-in or tail, simulated but kept out of its statistics
    session: int = -1  # conversation (user) it belongs to, -1: none


def request_count(value: Any, name: str = "num_requests") -> int:
    """A number of requests through the number rule, at most MAX_REQUESTS."""
    count = int(check_number(value, "serve", name, whole=True, gt=0))
    if count > MAX_REQUESTS:
        raise InferSimError(f"{name} {count:,}: at most {MAX_REQUESTS:,} requests per run (the run simulates some "
                            f"20,000-50,000 requests per CPU second); a longer stream has the same percentiles at "
                            f"steady state")
    return count


@dataclass(frozen=True)
class LengthDist:
    dist: str  # fixed, uniform, normal, lognormal, empirical
    mean: float
    std: float = 0.0
    low: int = 1
    high: int = 0  # 0 = no upper bound (MAX_COUNT)
    values: tuple[int, ...] = ()  # empirical: the lengths drawn from, uniformly with replacement
    source: str = ""  # empirical: where the values came from
    skew: float = 0.0  # skew_normal: the shape (mean + std x a standard skew-normal draw, as inference-perf)

    def raw(self, rng: random.Random) -> float:
        """One draw before rounding and clipping."""
        if self.dist == "fixed":
            return self.mean
        if self.dist == "uniform":
            return float(rng.randint(self.low, self.high))
        if self.dist == "empirical":
            return float(self.values[int(rng.random() * len(self.values))])
        if self.dist == "skew_normal":  # Azzalini's two-normal construction (inference-perf's)
            delta = self.skew / math.sqrt(1 + self.skew ** 2)
            u0, v = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
            u1 = delta * u0 + math.sqrt(1 - delta ** 2) * v
            return self.mean + self.std * (u1 if u0 >= 0 else -u1)
        if self.dist == "poisson":
            return float(poisson_draw(rng, self.mean))
        if self.dist == "normal":
            return rng.gauss(self.mean, self.std)
        # lognormal with the given mean and std of the lengths (the stream of rng.lognormvariate,
        # with the exponent held below float64's limit)
        sigma2 = math.log1p((self.std / self.mean) ** 2)
        exponent = rng.normalvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        return math.exp(min(exponent, 700.0))

    def clip(self, value: float) -> int:
        n = max(self.low, int(round(min(value, float(MAX_COUNT)))))
        return min(n, self.high or MAX_COUNT)

    def draw(self, rng: random.Random) -> int:
        return self.clip(self.raw(rng))

    def describe(self) -> str:
        if self.dist == "fixed":
            return f"{self.mean:,.0f}"
        if self.dist == "uniform":
            return f"uniform {self.low:,}..{self.high:,}"
        if self.dist == "empirical":
            return f"empirical ({counted(len(self.values), 'length')} of {self.source}, mean {self.mean:,.6g})"
        return f"{self.dist} mean {self.mean:,.6g}, std {self.std:,.6g}"


@dataclass
class LengthTally:
    """What the draws of one length distribution came to: their mean, and how many were clipped."""

    name: str
    dist: LengthDist
    count: int = 0
    total: int = 0
    raised: int = 0  # draws below min, raised to it
    cut: int = 0  # draws above max (or MAX_COUNT), cut to it

    def add(self, raw: float, value: int) -> None:
        self.count += 1
        self.total += value
        if raw < self.dist.low - 0.5:
            self.raised += 1
        elif value < raw - 0.5:
            self.cut += 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def note(self) -> str | None:
        """A sentence when the realised lengths are not the distribution asked for (clipped draws, or
        a tail too heavy for this many draws), else None."""
        d = self.dist
        if d.dist not in ("normal", "lognormal") or not self.count:
            return None
        off = abs(self.mean / d.mean - 1)
        clipped = self.raised + self.cut
        if clipped <= 0.01 * self.count and off <= 0.1:
            return None
        parts = []
        if self.raised:
            parts.append(f"{self.raised:,} of {counted(self.count, 'draw')} fell below min {d.low:,} and "
                         f"{'was' if self.raised == 1 else 'were'} raised to it")
        if self.cut:
            parts.append(f"{self.cut:,} of {counted(self.count, 'draw')} exceeded max {d.high or MAX_COUNT:,} and "
                         f"{'was' if self.cut == 1 else 'were'} cut to it")
        if not parts:
            parts.append("the tail is too heavy for this many draws")
        return (f"{self.name}: realised mean {self.mean:,.1f} tokens where the {d.dist} distribution's mean is "
                f"{d.mean:,.6g} (std {d.std:,.6g}): " + "; ".join(parts))


DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal", "empirical", "skew_normal", "poisson")
#: the keys each distribution reads (empirical: its own, checked by empirical_dist), and why a key it does
#: not read has no meaning for it: such a key is refused, not dropped
_SHAPED = ("mean", "std", "min", "max")
DIST_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "fixed": (("mean",), "a fixed length is its mean, every draw"),
    "uniform": (("min", "max"), "it draws whole numbers from min to max, each as likely"),
    "normal": (_SHAPED, ""),
    "lognormal": (_SHAPED, ""),
    "skew_normal": (_SHAPED + ("skew",), ""),
    "poisson": (("mean", "min", "max"), "its variance is its mean"),
}
MAX_EMPIRICAL = 10_000_000  # lengths an empirical distribution may list


def length_dist(spec: Any, name: str) -> LengthDist:
    """An int (fixed length) or {dist, mean, std, min, max}; `name` (isl / osl) goes into errors.
    Every parameter passes the number rule; lengths are whole numbers of tokens, at most 1e15."""
    if isinstance(spec, bool) or spec is None or isinstance(spec, (list, tuple)):
        raise InferSimError(f"{name}: expected a whole number of tokens or a distribution, got {echo(spec)}")
    if not isinstance(spec, Mapping):
        try:
            tokens = int(check_number(spec, name, "", whole=True, gt=0))
        except ConfigError as exc:
            raise InferSimError(f"{name}: a length must be a whole number of tokens >= 1 (value: {echo(spec)}: "
                                f"{exc.problem})") from None
        return LengthDist("fixed", float(tokens), 0.0, tokens, tokens)
    dist = spec.get("dist", "fixed")
    if dist == "empirical":
        return empirical_dist(spec, name)
    _check_dist_keys(spec, dist, name)

    def number(key: str, default: float | None, **bounds: Any) -> float:
        value = spec.get(key, default)
        if value is None:
            raise InferSimError(f"{name}: dist {dist} needs '{key}'")
        return float(check_number(value, name, key, **bounds))

    low = number("min", 1, whole=True, ge=1, le=MAX_COUNT)
    high = number("max", 0, whole=True, ge=0, le=MAX_COUNT)
    if high and high < low:
        raise InferSimError(f"{name}.max: must be a whole number >= min ({low:g}) (got {echo(spec.get('max'))})")
    if dist == "uniform":
        if not high:
            raise InferSimError(f"{name}: dist uniform needs 'min' and 'max'")
        return LengthDist(dist, (low + high) / 2, 0.0, int(low), int(high))
    mean = number("mean", None, le=MAX_COUNT)
    if mean < 1:
        raise InferSimError(f"{name}.mean: must be >= 1 token (got {mean:g})")
    std = number("std", 0.0 if dist in ("fixed", "poisson") else None)
    if std < 0:
        raise InferSimError(f"{name}.std: must be >= 0 (got {std:g})")
    if dist == "fixed" and mean != int(mean):
        raise InferSimError(f"{name}.mean: a fixed length must be a whole number (got {mean:g})")
    skew = number("skew", 0.0) if dist == "skew_normal" else 0.0
    return LengthDist(dist, mean, std, int(low), int(high), skew=skew)


def _check_dist_keys(spec: Mapping[str, Any], dist: Any, name: str) -> None:
    """The keys of a {dist, ...} length: known, of a known dist, and each read by that dist."""
    unknown = sorted(map(str, set(spec) - {"dist", "mean", "std", "min", "max"} - ({"skew"} if dist == "skew_normal"
                                                                               else set())))
    if unknown:
        raise InferSimError(f"{name}: unknown key(s) {unknown}; expected dist, mean, std, min, max "
                            "(skew for skew_normal; or dist: empirical with file or values)")
    if dist not in DISTRIBUTIONS:
        raise InferSimError(f"{name}.dist: {echo(dist)} is not one of {', '.join(DISTRIBUTIONS)}")
    used, why = DIST_KEYS[dist]
    unused = [str(key) for key in spec if key != "dist" and key not in used]
    if unused:
        raise InferSimError(f"{name}: dist {dist} reads {', '.join(used)}, not {', '.join(map(repr, unused))} ({why}); "
                            f"drop {'it' if len(unused) == 1 else 'them'}")


def poisson_draw(rng: random.Random, mean: float) -> int:
    """A Poisson draw: Knuth's product of uniforms over pieces of the mean of at most 30 (a sum of
    independent Poisson draws is Poisson with the summed mean)."""
    total = 0
    while mean > 0:
        piece = min(mean, 30.0)
        mean -= piece
        limit, product = math.exp(-piece), rng.random()
        while product > limit:
            total += 1
            product *= rng.random()
    return total


def empirical_dist(spec: Mapping[str, Any], name: str) -> LengthDist:
    """{dist: empirical, file: PATH} (whole numbers separated by spaces, commas or new lines, or a
    JSON list; lines starting with # are comments) or {dist: empirical, values: [...]}: lengths drawn
    uniformly with replacement from the listed ones (a measured length distribution)."""
    unknown = sorted(map(str, set(spec) - {"dist", "file", "values"}))
    if unknown or ("file" in spec) == ("values" in spec):
        raise InferSimError(f"{name}: dist empirical takes exactly one of 'file' or 'values'"
                            + (f" (unknown key(s) {unknown})" if unknown else ""))
    source = "the listed values"
    raw: Any = spec.get("values")
    if "file" in spec:
        source = str(spec["file"])
        raw = _read_lengths_file(source, name)
    if not isinstance(raw, (list, tuple)) or not raw or len(raw) > MAX_EMPIRICAL:
        raise InferSimError(f"{name}: dist empirical needs 1 to {MAX_EMPIRICAL:,} lengths (got {echo(raw)})")
    values = []
    for value in raw:
        try:
            values.append(int(check_number(value, name, "values", whole=True, gt=0, le=MAX_COUNT)))
        except ConfigError as exc:
            raise InferSimError(f"{name}: {source}: {echo(value)} is not a length in tokens ({exc.problem})") from None
    return LengthDist("empirical", sum(values) / len(values), 0.0, min(values), max(values), tuple(values), source)


def _read_lengths_file(path: str, name: str) -> list[Any]:
    import re

    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InferSimError(f"{name}: cannot read lengths file {path} ({exc})") from None
    if text.lstrip().startswith("["):
        from infersim.base.plaindata import loads_json

        return loads_json(text, f"{name}: lengths file {path}")  # too deep, a repeated key: one message
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [cell for cell in re.split(r"[\s,]+", " ".join(lines)) if cell]


def check_rate(rate: Any, name: str = "rate") -> float:
    """A request rate (requests/s) through the number rule."""
    if isinstance(rate, bool) or rate is None:
        raise InferSimError(f"{name}: a request rate must be a positive number of requests per second (got {rate!r})")
    try:
        return float(check_number(rate, "serve", name, gt=0))
    except ConfigError as exc:
        raise InferSimError(f"{name}: a request rate must be a positive number of requests per second (value: "
                            f"{echo(rate)}: {exc.problem})") from None


def span_error(what: str, span: float) -> InferSimError:
    return InferSimError(f"{what} spans {span:.3g} s of arrivals, beyond the {MAX_SPAN_S:.3g} s (285 years) the "
                         "serving clock resolves to a microsecond (float64 seconds): millisecond latencies would "
                         "round away")


# ---------------------------------------------------------------------------------------------
# Generated arrivals


def _lengths(isl: LengthDist, osl: LengthDist, rng: random.Random,
             tallies: tuple[LengthTally, LengthTally] | None) -> Iterator[tuple[int, int]]:
    if isl.dist == "fixed" and osl.dist == "fixed" and tallies is None:  # no draws: the same pair every time
        pair = (isl.clip(isl.mean), osl.clip(osl.mean))
        while True:
            yield pair
    while True:
        a_raw = isl.raw(rng)
        b_raw = osl.raw(rng)
        a, b = isl.clip(a_raw), osl.clip(b_raw)
        if tallies is not None:
            tallies[0].add(a_raw, a)
            tallies[1].add(b_raw, b)
        yield a, b


def iter_offline(isl: LengthDist, osl: LengthDist, count: int, seed: int,
                 tallies: tuple[LengthTally, LengthTally] | None = None) -> Iterator[Request]:
    pairs = _lengths(isl, osl, random.Random(seed), tallies)
    for i in range(count):
        a, b = next(pairs)
        yield Request(i, 0.0, a, b)


def offline_requests(isl: LengthDist, osl: LengthDist, count: int, seed: int) -> list[Request]:
    return list(iter_offline(isl, osl, count, seed))


def iter_poisson(isl: LengthDist, osl: LengthDist, count: int, rate: float, seed: int, burstiness: float = 1.0,
                 tallies: tuple[LengthTally, LengthTally] | None = None) -> Iterator[Request]:
    """Open-loop arrivals at `rate` requests/s; the first request arrives after one gap."""
    check_rate(rate)
    if count / rate > MAX_SPAN_S:
        raise span_error(f"{count:,} requests at {rate:g} req/s", count / rate)
    gaps = random.Random(seed)
    pairs = _lengths(isl, osl, random.Random(seed + 1), tallies)
    t = 0.0
    for i in range(count):
        t += gaps.expovariate(rate) if burstiness == 1.0 else gaps.gammavariate(burstiness, 1.0 / (rate * burstiness))
        if t > MAX_SPAN_S:
            raise span_error(f"a Poisson stream at {rate:g} req/s (request {i + 1:,})", t)
        a, b = next(pairs)
        yield Request(i, t, a, b)


def poisson_requests(isl: LengthDist, osl: LengthDist, count: int, rate: float, seed: int,
                     burstiness: float = 1.0) -> list[Request]:
    check_burstiness(burstiness)
    return list(iter_poisson(isl, osl, count, rate, seed, burstiness))


def check_burstiness(value: Any) -> float:
    try:
        return float(check_number(value, "serve", "burstiness", gt=0))
    except ConfigError as exc:
        raise InferSimError(f"burstiness must be > 0 (value: {echo(value)}: {exc.problem})") from None
