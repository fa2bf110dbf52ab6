"""Trace replay for the serving simulator: a JSONL or CSV file of (arrival time, input tokens, output
tokens[, prefix id, prefix tokens]) read row by row into typed arrays (about 40 bytes a row, never a
dict per row), replayed in arrival order: every row, or the first `num_requests` by arrival time (a
cut is announced with the number of rows dropped). Column names follow the public traces (Azure LLM
inference: TIMESTAMP, ContextTokens, GeneratedTokens; vllm bench: input_len, output_len; ...).

A trace can also lend only its lengths (`lengths_from_trace`, `TraceLengths`: (input, output) pairs
of its rows drawn with replacement, jointly, so their correlation is kept) to generated arrivals.
Every cell passes the number rule of `infersim.cards.schema.check_number`; arrival times are relative
to the first row and span at most infersim.serve.workload.MAX_SPAN_S.
"""

from __future__ import annotations

import csv
import random
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infersim.cards.schema import MAX_COUNT, MAX_MAGNITUDE, MIN_MAGNITUDE, check_number
from infersim.base.plaindata import loads_json
from infersim.base.errors import ConfigError, InferSimError, echo
from infersim.base.texttable import counted
from infersim.serve.workload import MAX_REQUESTS, MAX_SPAN_S, Request, span_error

COLUMN_NAMES = {
    "arrival_s": ("arrival_s", "arrival", "timestamp", "TIMESTAMP", "time"),
    "input_tokens": ("input_tokens", "input_len", "prompt_tokens", "ContextTokens", "isl"),
    "output_tokens": ("output_tokens", "output_len", "completion_tokens", "GeneratedTokens", "osl"),
    "prefix_id": ("prefix_id",),
    "prefix_tokens": ("prefix_tokens",),
}
#: every name a trace's fields go by: a column or key outside them is not read (said under NOTES)
_KNOWN_NAMES = frozenset(name for names in COLUMN_NAMES.values() for name in names)
#: every name of the fields that have several: a JSONL row holding more than three of them gives one of
#: those three fields under two names, and only such a row is searched for which
_ALIASED_NAMES = frozenset(name for names in COLUMN_NAMES.values() if len(names) > 1 for name in names)


def _columns(header: list[str], p: Path) -> dict[str, str | None]:
    """The column of each field in a CSV trace's header. A column read named twice, or two names of
    one field (arrival_s and timestamp), is refused: which of them holds the field is not guessed."""
    where: dict[str, int] = {}
    for position, name in enumerate(header, 1):
        if name in where and any(name in names for names in COLUMN_NAMES.values()):
            raise InferSimError(f"trace {p}: the header names column {name!r} twice (columns {where[name]} and "
                                f"{position}); keep one")
        where.setdefault(name, position)
    columns: dict[str, str | None] = {}
    for field_, names in COLUMN_NAMES.items():
        given = [name for name in names if name in where]
        if len(given) > 1:
            raise InferSimError(f"trace {p}: columns {given[0]!r} and {given[1]!r} (columns {where[given[0]]} and "
                                f"{where[given[1]]}) both name {field_}; keep one")
        columns[field_] = given[0] if given else None
    if columns["prefix_tokens"] is not None and columns["prefix_id"] is None:
        raise InferSimError(f"trace {p}: column prefix_tokens (column {where['prefix_tokens']}) without a prefix_id "
                            "column: which rows share those tokens is not said; add prefix_id (rows naming the same "
                            "one share their first prefix_tokens tokens) or drop prefix_tokens")
    return columns


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
                if stamp.tzinfo is None:  # the same arrivals on every machine, whatever its time zone
                    stamp = stamp.replace(tzinfo=timezone.utc)
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


#: a trace's prefix ids: name -> (index, the first row naming it, its prefix_tokens there)
PrefixIds = dict[str, tuple[int, int, int]]


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
    unread: dict[str, None] = field(default_factory=dict)  # columns (JSONL keys) not read, in order of appearance

    def unread_note(self) -> str | None:
        """The columns the trace holds that are not read, named, else None."""
        if not self.unread:
            return None
        names = ", ".join(repr(name) for name in self.unread)
        accepted = "; ".join(f"{field_}: {', '.join(names_)}" for field_, names_ in COLUMN_NAMES.items())
        return (f"trace {self.path}: not read: {'column' if len(self.unread) == 1 else 'columns'} {names} (a trace's "
                f"fields and the names they are read under: {accepted})")

    def __len__(self) -> int:
        return len(self.arrival)

    def index(self, k: int) -> int:
        """The row replayed k-th."""
        return self.order[k] if self.order is not None else k

    def sort(self) -> None:
        arrival = self.arrival
        if any(arrival[i] > arrival[i + 1] for i in range(len(arrival) - 1)):
            self.order = array("q", sorted(range(len(arrival)), key=arrival.__getitem__))  # stable: ties by row

    def order_note(self) -> str | None:
        """Rows the replay takes out of file order (arrival times not ascending), counted, else None."""
        if self.order is None:
            return None
        moved = sum(1 for k, i in enumerate(self.order) if k != i)
        return (f"trace {self.path}: arrival times are not in file order: replayed by arrival time, {moved:,} of "
                f"{len(self):,} rows moved from their place in the file")


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
    prefix_ids: PrefixIds = {}
    jsonl = p.suffix in (".jsonl", ".json")
    reached = [0]  # the last row read, for the messages of errors the readers raise
    try:
        with p.open(encoding="utf-8", newline="" if not jsonl else None) as fh:
            (_read_jsonl if jsonl else _read_csv)(rows, p, fh, prefix_ids, reached)
    except UnicodeDecodeError as exc:
        raise InferSimError(f"trace {p}: not a UTF-8 text file (byte {exc.object[exc.start:exc.start + 1]!r} "
                            f"after row {reached[0]}): a JSONL or CSV trace is text") from None
    except csv.Error as exc:
        raise InferSimError(f"trace {p}: row {reached[0] + 1}: not a CSV row ({exc})") from None
    except OSError as exc:
        raise InferSimError(f"trace {p}: cannot read: {exc.strerror or exc}") from None
    if not len(rows):
        raise InferSimError(f"trace {p}: no rows")
    rows.prefix_names = list(prefix_ids)
    rows.sort()
    return rows


def _read_jsonl(rows: TraceRows, p: Path, fh: Any, prefix_ids: PrefixIds, reached: list[int]) -> None:
    for number, record in _rows_jsonl(p, fh):
        reached[0] = number
        if len(record) > 3:  # three keys that give the row's three fields leave none unread
            rows.unread.update(dict.fromkeys(key for key in record if key not in _KNOWN_NAMES))
        if "prefix_id" in record or "prefix_tokens" in record or not _fast_row(rows, *_json_cells(record)):
            _add_row(rows, p, number, record.get, None, prefix_ids)


def _read_csv(rows: TraceRows, p: Path, fh: Any, prefix_ids: PrefixIds, reached: list[int]) -> None:
    reader = csv.reader(fh)  # read once, front to back: a pipe works too
    header = [h.strip() for h in next(reader, None) or ()]
    columns = _columns(header, p)
    for required in ("arrival_s", "input_tokens", "output_tokens"):
        if header and columns[required] is None:
            raise InferSimError(f"trace {p}: no column for {required} (accepted names: "
                                f"{', '.join(COLUMN_NAMES[required])})")
    positions = {name: i for i, name in enumerate(header)}
    rows.unread.update(dict.fromkeys(name or f"(column {i + 1}, no name)" for i, name in enumerate(header)
                                     if name not in _KNOWN_NAMES))
    width = len(header)
    at, it, ot = (positions.get(columns[f] or "", 0) for f in ("arrival_s", "input_tokens", "output_tokens"))
    plain = columns["prefix_id"] is None
    for number, cells in enumerate(reader, 1):
        reached[0] = number
        if not cells:
            continue
        if len(cells) > width:
            _refuse_extra_cells(p, number, cells, width)
        if plain and len(cells) == width and _fast_row(rows, cells[at], cells[it], cells[ot]):
            continue
        _add_row(rows, p, number, _csv_getter(positions, cells), columns, prefix_ids)


def _refuse_extra_cells(p: Path, number: int, cells: list[str], width: int) -> None:
    """A row with more cells than the header names: which column holds what is not guessed (empty cells
    past the header, a trailing comma, hold nothing and pass)."""
    extra = [i for i in range(width, len(cells)) if cells[i].strip()]
    if extra:
        raise InferSimError(f"trace {p}: row {number}: {len(cells)} cells where the header names {width} columns "
                            f"(cell {extra[0] + 1}: {echo(cells[extra[0]])}); which column each cell holds is not "
                            "guessed: name every column in the header")


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


def _refuse_two_names(p: Path, number: int, record: dict[str, Any]) -> None:
    """A JSONL row that gives one field under two of its names (arrival_s and timestamp) is refused,
    as a CSV header that does: which of them holds the field is not guessed."""
    for field_, names in COLUMN_NAMES.items():
        given = [name for name in names if name in record]
        if len(given) > 1:
            raise InferSimError(f"trace {p}: row {number}: keys {given[0]!r} and {given[1]!r} both name {field_}; "
                                "keep one")


def _rows_jsonl(p: Path, fh: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(fh, 1):
        if not line.strip():
            continue
        record = loads_json(line, f"trace {p}: row {number}")
        if not isinstance(record, dict):
            raise InferSimError(f"trace {p}: row {number}: expected a JSON object, got {echo(record)}")
        # a row holding three of these names or fewer that gives a field twice lacks another: refused for that
        if len(record) > 3 and len(_ALIASED_NAMES.intersection(record)) > 3:
            _refuse_two_names(p, number, record)
        yield number, record


def _add_row(rows: TraceRows, p: Path, number: int, get: Callable[[str], Any],
             columns: dict[str, str | None] | None, prefix_ids: PrefixIds) -> None:
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
    if pid in (None, ""):
        _refuse_lone_prefix_tokens(p, number, name_of("prefix_tokens"), get)
    else:
        pid = str(pid)
        ptok_column = name_of("prefix_tokens")
        if ptok_column is None or get(ptok_column) in (None, ""):
            raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: needed with a prefix_id")
        prefix_tokens = _tokens(*cell("prefix_tokens"), minimum=0)
        if prefix_tokens > isl:
            raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: {prefix_tokens} is more than "
                                f"the row's {isl} input tokens")
        prefix, first_row, first_tokens = prefix_ids.setdefault(pid, (len(prefix_ids), number, prefix_tokens))
        if first_tokens != prefix_tokens:
            raise InferSimError(f"trace {p}: prefix_id {echo(pid)} has prefix_tokens {first_tokens} in row {first_row} "
                                f"and {prefix_tokens} in row {number}: rows naming a prefix_id share its first "
                                "prefix_tokens tokens, one count; give them one value, or different prefix_ids")
    rows.arrival.append(arrival)
    rows.isl.append(isl)
    rows.osl.append(osl)
    rows.prefix.append(prefix)
    rows.prefix_tokens.append(prefix_tokens)


def _refuse_lone_prefix_tokens(p: Path, number: int, column: str | None, get: Callable[[str], Any]) -> None:
    """prefix_tokens in a row without a prefix_id names no tokens that other rows share: refused."""
    value = get(column) if column else None
    if value is None or (isinstance(value, str) and not value.strip()) or (value == 0 and not isinstance(value, bool)):
        return
    if isinstance(value, str) and value.strip() == "0":
        return
    raise InferSimError(f"trace {p}: row {number}, column prefix_tokens: {echo(value)} without a prefix_id: which rows "
                        "share those tokens is not said; give the row a prefix_id (rows naming the same one share "
                        "their first prefix_tokens tokens) or drop prefix_tokens")


@dataclass(frozen=True)
class TraceReplay:
    """The rows of a trace a run replays: the first `count` by arrival time, times relative to the
    first and multiplied by `time_scale`."""

    rows: TraceRows
    count: int
    time_scale: float = 1.0
    asked: int | None = None  # num_requests, when given

    def __iter__(self) -> Iterator[Request]:
        rows, scale = self.rows, self.time_scale
        start = rows.arrival[rows.index(0)]
        names = rows.prefix_names
        for k in range(self.count):
            i = rows.index(k)
            prefix = rows.prefix[i]
            yield Request(k, (rows.arrival[i] - start) * scale, rows.isl[i], rows.osl[i],
                          names[prefix] if prefix >= 0 else "", rows.prefix_tokens[i])

    def notes(self) -> list[str]:
        """What the replay did to the trace: rows reordered by arrival time, times shifted to start at 0,
        rows past num_requests left out, columns not read."""
        return [note for note in (self.rows.order_note(), self._shift_note(), self._cut_note(), self.rows.unread_note())
                if note]

    def _shift_note(self) -> str | None:
        first = self.rows.arrival[self.rows.index(0)]
        if first >= 0:
            return None
        return (f"trace {self.rows.path}: arrivals from {first:,.6g} s, before 0: replayed relative to the first, every "
                f"arrival shifted by +{-first:,.6g} s")

    def _cut_note(self) -> str | None:
        dropped = len(self.rows) - self.count
        if self.asked is not None and self.asked > self.count:
            return (f"trace {self.rows.path}: {counted(len(self.rows), 'row')}, fewer than num_requests "
                    f"{self.asked:,}: all {self.count:,} replayed")
        if not dropped:
            return None
        return (f"trace {self.rows.path}: replaying the first {self.count:,} of its {len(self.rows):,} rows by arrival "
                f"time (num_requests); {counted(dropped, 'row')} dropped")

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
        raise span_error(f"trace {rows.path} (rows {rows.index(0) + 1:,} to {rows.index(count - 1) + 1:,})", span)
    return TraceReplay(rows, count, scale, None if num_requests is None else int(num_requests))


def load_trace(path: str | Path, num_requests: int | None = None, time_scale: float = 1.0) -> list[Request]:
    """The requests of a trace (see trace_replay), as a list."""
    return list(trace_replay(path, num_requests, time_scale))


@dataclass(frozen=True)
class TraceLengths:
    """(input, output) pairs drawn with replacement from a trace's rows, jointly."""

    rows: TraceRows
    seed: int

    def notes(self) -> list[str]:
        note = self.rows.unread_note()
        return [note] if note else []

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
