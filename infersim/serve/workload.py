"""Serving workloads: who arrives when, with how many input and output tokens.

Kinds of arrival (all seeded and reproducible with `random.Random(seed)`):
  offline      every request at t = 0 (trtllm-bench throughput, MLPerf Offline)
  poisson      open loop at `rate` requests/s, exponential gaps; with `burstiness` != 1 the gaps are
               gamma-distributed with shape = burstiness and the same mean (vllm bench serve's
               --burstiness: < 1 burstier, > 1 more regular)
  concurrency  closed loop: `concurrency` clients, each sends its next request when the previous
               one completes (zero think time); arrival times are decided during the simulation
  trace        replay of a JSONL or CSV file of (arrival time, input tokens, output tokens[, prefix id,
               prefix tokens])
Lengths: from a trace (`lengths_from_trace`: (input, output) pairs of a trace's rows drawn with
replacement, jointly, so their correlation is kept), or an int (fixed) or a mapping {dist: fixed|uniform|normal|lognormal, mean, std, min, max}; normal
and lognormal draws are rounded and clipped to [min, max] (min defaults to 1). For lognormal, mean
and std are those of the lengths themselves (not of their logarithm).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from infersim.errors import InferSimError


@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefix_id: str = ""  # requests sharing a prefix id share their first prefix_tokens prompt tokens
    prefix_tokens: int = 0


@dataclass(frozen=True)
class LengthDist:
    dist: str  # fixed, uniform, normal, lognormal
    mean: float
    std: float = 0.0
    low: int = 1
    high: int = 0  # 0 = no upper bound

    def draw(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            value = self.mean
        elif self.dist == "uniform":
            return rng.randint(self.low, self.high)
        elif self.dist == "normal":
            value = rng.gauss(self.mean, self.std)
        else:  # lognormal with the given mean and std of the lengths
            sigma2 = math.log(1.0 + (self.std / self.mean) ** 2)
            value = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        n = max(self.low, int(round(value)))
        return min(n, self.high) if self.high else n


DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


def length_dist(spec: Any, name: str) -> LengthDist:
    """An int (fixed length) or {dist, mean, std, min, max}; `name` (isl / osl) goes into errors."""
    if isinstance(spec, bool):
        raise InferSimError(f"{name}: expected a whole number of tokens or a distribution, got {spec!r}")
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if spec != int(spec) or spec < 1:
            raise InferSimError(f"{name}: a length must be a whole number of tokens >= 1 (got {spec!r})")
        return LengthDist("fixed", float(spec), 0.0, int(spec), int(spec))
    if not isinstance(spec, Mapping):
        raise InferSimError(f"{name}: expected a whole number of tokens or a mapping "
                            f"{{dist: {'|'.join(DISTRIBUTIONS)}, mean, std, min, max}}, got {spec!r}")
    unknown = set(spec) - {"dist", "mean", "std", "min", "max"}
    if unknown:
        raise InferSimError(f"{name}: unknown key(s) {sorted(unknown)}; expected dist, mean, std, min, max")
    dist = spec.get("dist", "fixed")
    if dist not in DISTRIBUTIONS:
        raise InferSimError(f"{name}.dist: {dist!r} is not one of {', '.join(DISTRIBUTIONS)}")

    def number(key: str, default: float | None) -> float:
        value = spec.get(key, default)
        if value is None:
            raise InferSimError(f"{name}: dist {dist} needs '{key}'")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InferSimError(f"{name}.{key}: expected a number, got {value!r}")
        return float(value)

    low = number("min", 1)
    high = number("max", 0)
    if low < 1 or low != int(low):
        raise InferSimError(f"{name}.min: lengths are whole numbers >= 1 (got {spec.get('min')!r})")
    if high and (high < low or high != int(high)):
        raise InferSimError(f"{name}.max: must be a whole number >= min ({low:g}) (got {spec.get('max')!r})")
    if dist == "uniform":
        if not high:
            raise InferSimError(f"{name}: dist uniform needs 'min' and 'max'")
        return LengthDist(dist, (low + high) / 2, 0.0, int(low), int(high))
    mean = number("mean", None)
    if mean < 1:
        raise InferSimError(f"{name}.mean: must be >= 1 token (got {mean:g})")
    std = number("std", 0.0 if dist == "fixed" else None)
    if std < 0:
        raise InferSimError(f"{name}.std: must be >= 0 (got {std:g})")
    if dist == "fixed" and mean != int(mean):
        raise InferSimError(f"{name}.mean: a fixed length must be a whole number (got {mean:g})")
    return LengthDist(dist, mean, std, int(low), int(high))


def draw_lengths(isl: LengthDist, osl: LengthDist, count: int, rng: random.Random) -> list[tuple[int, int]]:
    return [(isl.draw(rng), osl.draw(rng)) for _ in range(count)]


def offline_requests(isl: LengthDist, osl: LengthDist, count: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(i, 0.0, a, b) for i, (a, b) in enumerate(draw_lengths(isl, osl, count, rng))]


def poisson_requests(isl: LengthDist, osl: LengthDist, count: int, rate: float, seed: int,
                     burstiness: float = 1.0) -> list[Request]:
    """Open-loop arrivals at `rate` requests/s; the first request arrives after one gap."""
    check_rate(rate)
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise InferSimError(f"burstiness must be > 0 (got {burstiness!r})")
    rng = random.Random(seed)
    lengths = draw_lengths(isl, osl, count, random.Random(seed + 1))
    t = 0.0
    out = []
    for i, (a, b) in enumerate(lengths):
        t += rng.expovariate(rate) if burstiness == 1.0 else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        out.append(Request(i, t, a, b))
    return out


def check_rate(rate: Any) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise InferSimError(f"request rate must be a positive number of requests per second (got {rate!r})")
    return float(rate)


# ---------------------------------------------------------------------------------------------
# Trace replay

COLUMN_NAMES = {
    "arrival_s": ("arrival_s", "arrival", "timestamp", "TIMESTAMP", "time"),
    "input_tokens": ("input_tokens", "input_len", "prompt_tokens", "ContextTokens", "isl"),
    "output_tokens": ("output_tokens", "output_len", "completion_tokens", "GeneratedTokens", "osl"),
    "prefix_id": ("prefix_id",),
    "prefix_tokens": ("prefix_tokens",),
}


def _column(header: Iterable[str], field: str) -> str | None:
    names = set(header)
    for candidate in COLUMN_NAMES[field]:
        if candidate in names:
            return candidate
    return None


def _timestamp(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise InferSimError(f"{where}: {value!r} is not a time")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            try:  # Azure trace: "2023-11-16 18:15:46.6805900" (7 fractional digits)
                head, _, frac = text.partition(".")
                stamp = datetime.fromisoformat(head)
                seconds = stamp.timestamp() + (float("0." + frac) if frac else 0.0)
            except ValueError:
                raise InferSimError(f"{where}: {text!r} is neither seconds nor a date-time") from None
    if not math.isfinite(seconds):
        raise InferSimError(f"{where}: {value!r} is not a finite time")
    return seconds


def _tokens(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise InferSimError(f"{where}: {value!r} is not a token count")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InferSimError(f"{where}: {value!r} is not a whole number of tokens") from None
    if not math.isfinite(number) or number != int(number):
        raise InferSimError(f"{where}: {value!r} is not a whole number of tokens")
    if number < minimum:
        raise InferSimError(f"{where}: {int(number)} tokens (needs at least {minimum})")
    return int(number)


def load_trace(path: str | Path, num_requests: int | None = None, time_scale: float = 1.0) -> list[Request]:
    """Read a JSONL or CSV trace (by suffix: .jsonl/.json, else CSV). Arrival times are made
    relative to the first row and sorted; `time_scale` stretches them (0.5 = twice the rate).
    Errors name the file, the row (1 = first data row) and the column."""
    p = Path(path)
    if not p.is_file():
        raise InferSimError(f"trace {path}: no such file")
    rows: list[tuple[int, dict[str, Any]]] = []
    if p.suffix in (".jsonl", ".json"):
        with p.open() as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InferSimError(f"trace {p}: row {number}: not a JSON object ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise InferSimError(f"trace {p}: row {number}: expected a JSON object, got {record!r}")
                rows.append((number, record))
    else:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            for number, record in enumerate(reader, 1):
                rows.append((number, record))
    if not rows:
        raise InferSimError(f"trace {p}: no rows")
    header = set().union(*(r.keys() for _n, r in rows))
    columns = {field: _column(header, field) for field in COLUMN_NAMES}
    for field in ("arrival_s", "input_tokens", "output_tokens"):
        if columns[field] is None:
            raise InferSimError(f"trace {p}: no column for {field} (accepted names: {', '.join(COLUMN_NAMES[field])})")
    if not math.isfinite(time_scale) or time_scale <= 0:
        raise InferSimError(f"trace time scale must be > 0 (got {time_scale!r})")
    parsed = []
    for number, record in rows:
        def cell(field: str) -> tuple[Any, str]:
            name = columns[field]
            value = record.get(name)
            where = f"trace {p}: row {number}, column {name}"
            if value is None or (isinstance(value, str) and not value.strip()):
                raise InferSimError(f"{where}: empty")
            return value, where

        arrival = _timestamp(*cell("arrival_s"))
        isl = _tokens(*cell("input_tokens"))
        osl = _tokens(*cell("output_tokens"))
        prefix_id, prefix_tokens = "", 0
        if columns["prefix_id"] and record.get(columns["prefix_id"]) not in (None, ""):
            prefix_id = str(record[columns["prefix_id"]])
            if columns["prefix_tokens"] is None or record.get(columns["prefix_tokens"]) in (None, ""):
                raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: needed with a prefix_id")
            prefix_tokens = _tokens(*cell("prefix_tokens"), minimum=0)
            if prefix_tokens > isl:
                raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: {prefix_tokens} is more than "
                                    f"the row's {isl} input tokens")
        parsed.append((arrival, number, isl, osl, prefix_id, prefix_tokens))
    parsed.sort()
    if num_requests:
        parsed = parsed[:num_requests]
    start = parsed[0][0]
    return [Request(i, (a - start) * time_scale, isl, osl, pid, ptok)
            for i, (a, _n, isl, osl, pid, ptok) in enumerate(parsed)]


def lengths_from_trace(requests: list[Request], path: str | Path, seed: int) -> list[Request]:
    """`requests` with their (input, output) lengths drawn with replacement from the rows of a trace."""
    import dataclasses

    pairs = [(r.input_tokens, r.output_tokens) for r in load_trace(path)]
    rng = random.Random(seed + 2)
    return [dataclasses.replace(r, input_tokens=a, output_tokens=b)
            for r, (a, b) in zip(requests, (rng.choice(pairs) for _ in requests))]
