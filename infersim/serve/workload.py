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
               announced with the number of rows dropped)
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

import csv
import json
import math
import random
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from infersim.cards.schema import MAX_COUNT, MAX_MAGNITUDE, MIN_MAGNITUDE, check_number
from infersim.errors import ConfigError, InferSimError, echo

#: latest arrival (seconds after the run's start) the serving clock resolves to a microsecond:
#: float64 holds whole numbers exactly up to 2^53, so 2^53 us (285 years) of simulated time
MAX_SPAN_S = 2.0 ** 53 * 1e-6
#: most requests one serving run simulates: it keeps 32 bytes of latency samples per request for
#: exact percentiles (0.3 GB at this bound) and simulates some 50,000 requests per CPU second
MAX_REQUESTS = 10_000_000
DEFAULT_REQUESTS = 1000


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefix_id: str = ""  # requests sharing a prefix id share their first prefix_tokens prompt tokens
    prefix_tokens: int = 0


def request_count(value: Any, name: str = "num_requests") -> int:
    """A number of requests through the number rule, at most MAX_REQUESTS."""
    count = int(check_number(value, "serve", name, whole=True, gt=0))
    if count > MAX_REQUESTS:
        raise InferSimError(f"{name} {count:,}: at most {MAX_REQUESTS:,} requests per run (the run keeps 32 bytes of "
                            f"latency samples per request for exact percentiles and simulates some 50,000 requests per "
                            f"CPU second); a longer stream has the same percentiles at steady state")
    return count


@dataclass(frozen=True)
class LengthDist:
    dist: str  # fixed, uniform, normal, lognormal
    mean: float
    std: float = 0.0
    low: int = 1
    high: int = 0  # 0 = no upper bound (MAX_COUNT)

    def raw(self, rng: random.Random) -> float:
        """One draw before rounding and clipping."""
        if self.dist == "fixed":
            return self.mean
        if self.dist == "uniform":
            return float(rng.randint(self.low, self.high))
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
            parts.append(f"{self.raised:,} of {self.count:,} draws fell below min {d.low:,} and were raised to it")
        if self.cut:
            parts.append(f"{self.cut:,} of {self.count:,} draws exceeded max {d.high or MAX_COUNT:,} and were cut to it")
        if not parts:
            parts.append("the tail is too heavy for this many draws")
        return (f"{self.name}: realised mean {self.mean:,.1f} tokens where the {d.dist} distribution's mean is "
                f"{d.mean:,.6g} (std {d.std:,.6g}): " + "; ".join(parts))


DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


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
    unknown = sorted(map(str, set(spec) - {"dist", "mean", "std", "min", "max"}))
    if unknown:
        raise InferSimError(f"{name}: unknown key(s) {unknown}; expected dist, mean, std, min, max")
    dist = spec.get("dist", "fixed")
    if dist not in DISTRIBUTIONS:
        raise InferSimError(f"{name}.dist: {echo(dist)} is not one of {', '.join(DISTRIBUTIONS)}")

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
    std = number("std", 0.0 if dist == "fixed" else None)
    if std < 0:
        raise InferSimError(f"{name}.std: must be >= 0 (got {std:g})")
    if dist == "fixed" and mean != int(mean):
        raise InferSimError(f"{name}.mean: a fixed length must be a whole number (got {mean:g})")
    return LengthDist(dist, mean, std, int(low), int(high))


def check_rate(rate: Any, name: str = "rate") -> float:
    """A request rate (requests/s) through the number rule."""
    if isinstance(rate, bool) or rate is None:
        raise InferSimError(f"request rate must be a positive number of requests per second (got {rate!r})")
    try:
        return float(check_number(rate, "serve", name, gt=0))
    except ConfigError as exc:
        raise InferSimError(f"request rate must be a positive number of requests per second (value: {echo(rate)}: "
                            f"{exc.problem})") from None


def _span_error(what: str, span: float) -> InferSimError:
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


def draw_lengths(isl: LengthDist, osl: LengthDist, count: int, rng: random.Random) -> list[tuple[int, int]]:
    pairs = _lengths(isl, osl, rng, None)
    return [next(pairs) for _ in range(count)]


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
        raise _span_error(f"{count:,} requests at {rate:g} req/s", count / rate)
    gaps = random.Random(seed)
    pairs = _lengths(isl, osl, random.Random(seed + 1), tallies)
    t = 0.0
    for i in range(count):
        t += gaps.expovariate(rate) if burstiness == 1.0 else gaps.gammavariate(burstiness, 1.0 / (rate * burstiness))
        if t > MAX_SPAN_S:
            raise _span_error(f"a Poisson stream at {rate:g} req/s (request {i + 1:,})", t)
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


# ---------------------------------------------------------------------------------------------
# Trace replay

COLUMN_NAMES = {
    "arrival_s": ("arrival_s", "arrival", "timestamp", "TIMESTAMP", "time"),
    "input_tokens": ("input_tokens", "input_len", "prompt_tokens", "ContextTokens", "isl"),
    "output_tokens": ("output_tokens", "output_len", "completion_tokens", "GeneratedTokens", "osl"),
    "prefix_id": ("prefix_id",),
    "prefix_tokens": ("prefix_tokens",),
}


def _column(header: Iterable[str], field_: str) -> str | None:
    names = set(header)
    for candidate in COLUMN_NAMES[field_]:
        if candidate in names:
            return candidate
    return None


def _timestamp(value: Any, where: str) -> float:
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise InferSimError(f"{where}: {echo(value)} is not a time")
    if isinstance(value, (int, float)):
        seconds: Any = value
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            try:  # Azure trace: "2023-11-16 18:15:46.6805900" (7 fractional digits, nothing else)
                head, dot, frac = text.partition(".")
                if dot and not (frac.isdigit() and frac.isascii()):
                    raise ValueError
                stamp = datetime.fromisoformat(head)
                seconds = stamp.timestamp() + (float("0." + frac) if frac else 0.0)
            except (ValueError, OverflowError, OSError):
                raise InferSimError(f"{where}: {echo(text)} is neither seconds nor a date-time") from None
    try:
        return float(check_number(seconds, "", ""))
    except ConfigError as exc:
        raise InferSimError(f"{where}: {echo(value)} is not a time: {exc.problem}") from None


def _tokens(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise InferSimError(f"{where}: {echo(value)} is not a token count")
    try:
        number = check_number(value.strip() if isinstance(value, str) else value, "", "", whole=True)
    except ConfigError as exc:
        problem = "is not a whole number of tokens" if "expected" in exc.problem else exc.problem
        raise InferSimError(f"{where}: {echo(value)} {problem}") from None
    if number < minimum:
        raise InferSimError(f"{where}: {int(number)} tokens (needs at least {minimum})")
    return int(number)


@dataclass
class TraceRows:
    """A trace's rows as typed columns in file order (about 40 bytes a row), and the replay order."""

    path: str
    arrival: array = field(default_factory=lambda: array("d"))
    isl: array = field(default_factory=lambda: array("q"))
    osl: array = field(default_factory=lambda: array("q"))
    prefix: array = field(default_factory=lambda: array("q"))  # index into prefix_names, -1 = none
    prefix_tokens: array = field(default_factory=lambda: array("q"))
    prefix_names: list[str] = field(default_factory=list)
    order: array | None = None  # row indices by arrival time (None: the file is in order)

    def __len__(self) -> int:
        return len(self.arrival)

    def index(self, k: int) -> int:
        """The row replayed k-th."""
        return self.order[k] if self.order is not None else k

    def sort(self) -> None:
        arrival = self.arrival
        if any(arrival[i] > arrival[i + 1] for i in range(len(arrival) - 1)):
            self.order = array("q", sorted(range(len(arrival)), key=arrival.__getitem__))  # stable: ties by row


def _plain_count(cell: Any) -> int | None:
    """A token count written plainly (CSV digits or a JSON integer) in 1..MAX_COUNT, else None."""
    if type(cell) is str:
        if "_" in cell:  # int() reads '1_000'; the number rule does not
            return None
        try:
            cell = int(cell)
        except ValueError:
            return None
    elif type(cell) is not int:
        return None
    return cell if 0 < cell <= MAX_COUNT else None


def _plain_time(cell: Any) -> float | None:
    """A time written plainly (CSV text or a JSON number) within the rule's magnitudes, else None."""
    if type(cell) is str:
        if "_" in cell:
            return None
        try:
            cell = float(cell)
        except ValueError:
            return None
    elif type(cell) is int or type(cell) is float:
        cell = float(cell)
    else:
        return None
    if -MAX_MAGNITUDE <= cell <= MAX_MAGNITUDE and (cell == 0 or abs(cell) >= MIN_MAGNITUDE):
        return cell
    return None


def _fast_row(rows: TraceRows, arrival: Any, isl: Any, osl: Any) -> bool:
    """Append a row whose cells are plain numbers in range without the general checks; False where
    any cell needs them (they then say what is wrong)."""
    time_s, input_tokens, output_tokens = _plain_time(arrival), _plain_count(isl), _plain_count(osl)
    if time_s is None or input_tokens is None or output_tokens is None:
        return False
    rows.arrival.append(time_s)
    rows.isl.append(input_tokens)
    rows.osl.append(output_tokens)
    rows.prefix.append(-1)
    rows.prefix_tokens.append(0)
    return True


def read_trace(path: str | Path) -> TraceRows:
    """Parse a JSONL or CSV trace (by suffix: .jsonl/.json, else CSV) row by row into columns.
    Errors name the file, the row (1 = first data row) and the column."""
    p = Path(path)
    if p.is_dir():
        raise InferSimError(f"trace {path}: is a directory, not a JSONL or CSV trace")
    if not p.exists():
        raise InferSimError(f"trace {path}: no such file")
    rows = TraceRows(str(p))
    prefix_ids: dict[str, int] = {}
    jsonl = p.suffix in (".jsonl", ".json")
    number = 0
    try:
        with p.open(encoding="utf-8", newline="" if not jsonl else None) as fh:
            if jsonl:
                for number, record in _rows_jsonl(p, fh):
                    if "prefix_id" in record or not _fast_row(rows, *_json_cells(record)):
                        _add_row(rows, p, number, record.get, None, prefix_ids)
            else:
                reader = csv.reader(fh)  # read once, front to back: a pipe works too
                header = [h.strip() for h in next(reader, None) or ()]
                columns = {f: _column(header, f) for f in COLUMN_NAMES}
                for required in ("arrival_s", "input_tokens", "output_tokens"):
                    if header and columns[required] is None:
                        raise InferSimError(f"trace {p}: no column for {required} (accepted names: "
                                            f"{', '.join(COLUMN_NAMES[required])})")
                positions = {name: i for i, name in enumerate(header)}
                width = len(header)
                at, it, ot = (positions.get(columns[f] or "", 0) for f in ("arrival_s", "input_tokens", "output_tokens"))
                plain = columns["prefix_id"] is None
                for number, cells in enumerate(reader, 1):
                    if not cells:
                        continue
                    if plain and len(cells) >= width and _fast_row(rows, cells[at], cells[it], cells[ot]):
                        continue
                    _add_row(rows, p, number, _csv_getter(positions, cells), columns, prefix_ids)
    except UnicodeDecodeError as exc:
        raise InferSimError(f"trace {p}: not a UTF-8 text file (byte {exc.object[exc.start:exc.start + 1]!r} "
                            f"after row {number}): a JSONL or CSV trace is text") from None
    except csv.Error as exc:
        raise InferSimError(f"trace {p}: row {number + 1}: not a CSV row ({exc})") from None
    except OSError as exc:
        raise InferSimError(f"trace {p}: cannot read: {exc.strerror or exc}") from None
    if not len(rows):
        raise InferSimError(f"trace {p}: no rows")
    rows.prefix_names = list(prefix_ids)
    rows.sort()
    return rows


def _csv_getter(positions: dict[str, int], cells: list[str]) -> Callable[[str], Any]:
    def get(name: str) -> Any:
        i = positions.get(name)
        return cells[i] if i is not None and i < len(cells) else None
    return get


def _json_cells(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    def first(field_: str) -> Any:
        for name in COLUMN_NAMES[field_]:
            value = record.get(name)
            if value is not None:
                return value
        return None
    return first("arrival_s"), first("input_tokens"), first("output_tokens")


def _rows_jsonl(p: Path, fh: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InferSimError(f"trace {p}: row {number}: not a JSON object ({exc.msg})") from None
        except ValueError:  # an integer of more than 4,300 digits
            raise InferSimError(f"trace {p}: row {number}: holds a number too long to read (Python reads at most "
                                "4,300 digits)") from None
        if not isinstance(record, dict):
            raise InferSimError(f"trace {p}: row {number}: expected a JSON object, got {echo(record)}")
        yield number, record


def _add_row(rows: TraceRows, p: Path, number: int, get: Callable[[str], Any],
             columns: dict[str, str | None] | None, prefix_ids: dict[str, int]) -> None:
    def name_of(field_: str) -> str | None:
        if columns is not None:
            return columns[field_]
        return next((c for c in COLUMN_NAMES[field_] if get(c) is not None), None)

    def cell(field_: str) -> tuple[Any, str]:
        name = name_of(field_)
        if name is None:
            raise InferSimError(f"trace {p}: row {number}: no field for {field_} (accepted names: "
                                f"{', '.join(COLUMN_NAMES[field_])})")
        value = get(name)
        where = f"trace {p}: row {number}, column {name}"
        if value is None or (isinstance(value, str) and not value.strip()):
            raise InferSimError(f"{where}: empty")
        return value, where

    arrival = _timestamp(*cell("arrival_s"))
    isl = _tokens(*cell("input_tokens"))
    osl = _tokens(*cell("output_tokens"))
    prefix, prefix_tokens = -1, 0
    pid_column = name_of("prefix_id")
    pid = get(pid_column) if pid_column else None
    if pid not in (None, ""):
        pid = str(pid)
        ptok_column = name_of("prefix_tokens")
        if ptok_column is None or get(ptok_column) in (None, ""):
            raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: needed with a prefix_id")
        prefix_tokens = _tokens(*cell("prefix_tokens"), minimum=0)
        if prefix_tokens > isl:
            raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: {prefix_tokens} is more than "
                                f"the row's {isl} input tokens")
        prefix = prefix_ids.setdefault(pid, len(prefix_ids))
    rows.arrival.append(arrival)
    rows.isl.append(isl)
    rows.osl.append(osl)
    rows.prefix.append(prefix)
    rows.prefix_tokens.append(prefix_tokens)


@dataclass(frozen=True)
class TraceReplay:
    """The rows of a trace a run replays: the first `count` by arrival time, times relative to the
    first and multiplied by `time_scale`."""

    rows: TraceRows
    count: int
    time_scale: float = 1.0

    def __iter__(self) -> Iterator[Request]:
        rows, scale = self.rows, self.time_scale
        start = rows.arrival[rows.index(0)]
        names = rows.prefix_names
        for k in range(self.count):
            i = rows.index(k)
            prefix = rows.prefix[i]
            yield Request(k, (rows.arrival[i] - start) * scale, rows.isl[i], rows.osl[i],
                          names[prefix] if prefix >= 0 else "", rows.prefix_tokens[i])

    def note(self) -> str | None:
        dropped = len(self.rows) - self.count
        if not dropped:
            return None
        return (f"trace {self.rows.path}: replaying the first {self.count:,} of its {len(self.rows):,} rows by arrival "
                f"time (num_requests); {dropped:,} rows dropped")

    def mean_lengths(self) -> tuple[float, float]:
        rows = self.rows
        isl = sum(rows.isl[rows.index(k)] for k in range(self.count))
        osl = sum(rows.osl[rows.index(k)] for k in range(self.count))
        return isl / self.count, osl / self.count


def trace_replay(path: str | Path, num_requests: int | None = None, time_scale: float = 1.0) -> TraceReplay:
    """Read a trace for replay: all its rows, or the first `num_requests` by arrival time."""
    scale = float(check_number(time_scale, "serve", "trace_time_scale", gt=0))
    rows = read_trace(path)
    count = len(rows) if num_requests is None else min(int(num_requests), len(rows))
    if count > MAX_REQUESTS:
        raise InferSimError(f"trace {rows.path}: {count:,} rows to replay, at most {MAX_REQUESTS:,} per run: give "
                            f"num_requests (--num-requests) to replay the first ones")
    span = (rows.arrival[rows.index(count - 1)] - rows.arrival[rows.index(0)]) * scale
    if not span <= MAX_SPAN_S:
        raise _span_error(f"trace {rows.path} (rows {rows.index(0) + 1:,} to {rows.index(count - 1) + 1:,})", span)
    return TraceReplay(rows, count, scale)


def load_trace(path: str | Path, num_requests: int | None = None, time_scale: float = 1.0) -> list[Request]:
    """The requests of a trace (see trace_replay), as a list."""
    return list(trace_replay(path, num_requests, time_scale))


@dataclass(frozen=True)
class TraceLengths:
    """(input, output) pairs drawn with replacement from a trace's rows, jointly."""

    rows: TraceRows
    seed: int

    def apply(self, requests: Iterable[Request]) -> Iterator[Request]:
        rows = self.rows
        rng = random.Random(self.seed + 2)
        indices = range(len(rows))
        for r in requests:
            i = rows.index(rng.choice(indices))
            yield replace(r, input_tokens=rows.isl[i], output_tokens=rows.osl[i])


def lengths_from_trace(requests: list[Request], path: str | Path, seed: int) -> list[Request]:
    """`requests` with their (input, output) lengths drawn with replacement from the rows of a trace."""
    return list(TraceLengths(read_trace(path), seed).apply(requests))


# ---------------------------------------------------------------------------------------------
# A run's arrivals


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
    notes = [] if lengths is not None else [n for n in (t.note() for t in tallies) if n]

    def again() -> Iterator[Request]:
        stream = make(None)
        return lengths.apply(stream) if lengths is not None else stream

    return Arrivals(again, count, total_isl / count, total_osl / count, notes)
