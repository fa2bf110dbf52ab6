"""A kernel-table directory on disk (infersim.tables.format): its CSV tables and `provenance.yaml`
written row by row in the format's columns, and read back checked: every cell by the number rule,
every row's `efficiency` against its latency and the provenance's peak, every CSV named in the
provenance, one line naming file, line and column for anything wrong.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints
from collections.abc import Callable, Iterator, Sequence

from infersim.cards.schema import MAX_MAGNITUDE, MIN_MAGNITUDE, build, check_number, load_yaml
from infersim.base.errors import MISSING, ConfigError, InferSimError
from infersim.tables.format import (
    EFFICIENCY_TOLERANCE,
    FORMAT_VERSION,
    MAX_EFFICIENCY,
    NO_EFFICIENCY,
    OPTIONAL_COLUMNS,
    PROVENANCE_FILE,
    PROVENANCE_HEADER,
    ROW_TYPES,
    WEIGHT_FORMATS,
    ZERO_WHEN_EMPTY,
    Provenance,
    Row,
    TableDirectory,
    efficiency_of,
    row_columns,
)


# ---------------------------------------------------------------------------------------------
# Writing


def plain(value: Any) -> Any:
    """`value` as the plain type YAML and CSV writers accept: str subclasses (torch's TorchVersion)
    become str, int and float subclasses (numpy and torch scalars) int and float, mappings and
    sequences recursively so. Everything written to a table directory goes through here: one
    unrepresentable value (torch.__version__ is a TorchVersion, which yaml.safe_dump refuses) must
    not lose a measured run."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return "".join(ch for ch in value)  # an exact str whatever the subclass's __str__ does
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars that are not int or float subclasses
    if callable(item):
        try:
            return plain(item())
        except Exception:  # noqa: BLE001 - not a one-element value: written as its text below
            pass
    return "".join(ch for ch in str(value))


def _format_number(value: Any) -> str:
    value = plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.10g}"  # keeps measured latencies as published (ms precision and beyond)
    if value is None:
        return ""
    return str(value)


def measured_columns(family: str) -> list[str]:
    """The CSV header `mfu bench` writes: the family's columns without the optional ones (its rows
    have no published mfu, one format for inputs and weights, no sliding window)."""
    return [c for c in row_columns(family) if c not in OPTIONAL_COLUMNS]


def row_cells(family: str, row: Row, columns: Sequence[str], peak_for: Callable[[str], float]) -> list[str]:
    """The CSV cells of one row under `columns` (efficiency derived from latency and the dtype's peak)."""
    values = dataclasses.asdict(row)
    if family not in NO_EFFICIENCY:
        values["efficiency"] = float(f"{efficiency_of(row, peak_for(row.dtype)):.6g}")  # type: ignore[union-attr]
    return [_format_number(values[c]) for c in columns]


def table_csv_text(family: str, rows: Sequence[Row], peak_for: Callable[[str], float]) -> str:
    import csv  # here and below: only reading or writing tables needs it, not a run from cached tables

    columns = row_columns(family)
    if "weight_dtype" in columns and all(getattr(row, "weight_dtype", None) is None for row in rows):
        columns.remove("weight_dtype")  # optional: tables of one format for inputs and weights read unchanged
    if "window" in columns and all(getattr(row, "window", 0) == 0 for row in rows):
        columns.remove("window")  # optional: full-attention tables read (and are written) unchanged
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(row_cells(family, row, columns, peak_for))
    return out.getvalue()


def provenance_yaml_text(provenance: Provenance) -> str:
    data = dataclasses.asdict(provenance)
    data["notes"] = list(provenance.notes)
    if provenance.elementwise_memory_efficiency is None:  # optional: kept out so older directories read unchanged
        del data["elementwise_memory_efficiency"], data["elementwise_source"]
    if provenance.elementwise_latency is None:
        del data["elementwise_latency"]
    if provenance.launch_cpu is None and provenance.step_cpu is None and not provenance.host_probes:
        del data["launch_cpu"], data["step_cpu"], data["host_source"], data["host_probes"]
    if provenance.complete:
        del data["complete"]  # the default: kept out so that finished directories read as before
    for info in data["tables"].values():
        info["notes"] = list(info["notes"])
        if info.get("moe_routing") == "balanced":
            del info["moe_routing"]  # the default: kept out so that older directories read unchanged
    header = (f"{PROVENANCE_HEADER}\n"
              "# `efficiency` in every CSV = kernel FLOPs / (latency * peak_flops[dtype]).\n")
    import yaml  # here: only writing tables needs PyYAML (~10 ms to import), reading goes through the cache

    return header + yaml.safe_dump(plain(data), sort_keys=False, width=110, allow_unicode=True)


#: table file names: plain CSV, or gzip-compressed CSV (the bundled tables, to keep the package small)
TABLE_SUFFIXES = (".csv", ".csv.gz")


def is_table_file(path: Path) -> bool:
    return path.name.endswith(TABLE_SUFFIXES)


def table_files_in(directory: Path) -> list[Path]:
    """The table files of a directory (CSV and gzip-compressed CSV), sorted by name."""
    return sorted(p for p in directory.iterdir() if p.is_file() and is_table_file(p))


def _write_table_text(path: Path, text: str) -> None:
    """A new table file (never over a file already there): gzip-compressed when its name ends in .gz
    (no timestamp inside, so that the same rows always make the same bytes), else plain UTF-8."""
    if path.name.endswith(".gz"):
        import gzip

        with path.open("xb") as f:
            f.write(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    else:
        with path.open("x", encoding="utf-8") as f:
            f.write(text)


def write_table_files(directory: Path, table_dir: TableDirectory) -> None:
    """Write provenance.yaml and every CSV into `directory`, a new empty one (the safe way to write
    a table directory, replacing only what InferSim wrote, is infersim.tables.output.write_table_dir);
    the provenance must list exactly the given tables."""
    prov = table_dir.provenance
    if set(prov.tables) != set(table_dir.tables):
        raise InferSimError(f"{directory}: provenance lists {sorted(prov.tables)} but tables are "
                            f"{sorted(table_dir.tables)}")
    for name, rows in table_dir.tables.items():
        family = prov.tables[name].family
        wrong = [r for r in rows if not isinstance(r, ROW_TYPES[family])]
        if wrong:
            raise InferSimError(f"{directory / name}: a {family} table got a {type(wrong[0]).__name__}")
        text = table_csv_text(family, rows, lambda d: prov.peak_for(d, str(directory / PROVENANCE_FILE)))
        _write_table_text(directory / name, text)
    with (directory / PROVENANCE_FILE).open("x", encoding="utf-8") as f:
        f.write(provenance_yaml_text(prov))


# ---------------------------------------------------------------------------------------------
# Reading


def read_provenance(directory: Path) -> Provenance:
    path = directory / PROVENANCE_FILE
    if not path.is_file():
        raise ConfigError(str(path), "", MISSING,
                          "kernel tables without provenance are refused: every table directory needs a "
                          "provenance.yaml saying where its numbers came from (see mfu_tables/FORMAT.md)")
    data = load_yaml(path)
    prov = build(Provenance, data, str(path))
    if prov.format_version != FORMAT_VERSION:
        raise ConfigError(str(path), "format_version", prov.format_version,
                          f"this InferSim reads table format {FORMAT_VERSION}")
    if not prov.tables:
        raise ConfigError(str(path), "tables", MISSING, "lists no table files")
    return prov


def _parse_cell(hint: Any, text: str, source: str, column: str) -> Any:
    """One CSV cell as the row field's type: int, float, bool, text, a Literal, or optional float."""
    text = text.strip()
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else ()
    if options:
        if text == "" and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
    try:
        if get_origin(hint) is Literal:
            if text not in get_args(hint):
                raise ValueError
            return text
        if hint is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if hint is int:  # the schema's number rule: finite, whole, at most 1e15; a kernel dimension is positive
            return check_number(text, source, column, whole=True, gt=0)
        if hint is float:
            return check_number(text, source, column)
        return text
    except ValueError:
        wanted = " or ".join(get_args(hint)) if get_origin(hint) is Literal else getattr(hint, "__name__", str(hint))
        raise ConfigError(source, column, text, f"expected {wanted}") from None


def _cell_parser(hint: Any) -> Callable[[str, str, str], Any]:
    """A parser for one cell of a column of type `hint`, for the row-by-row reader: the column
    reader of that type (_column_reader) on the one cell, and _parse_cell with the schema's number
    rule for a cell it does not take as it is, which gives the same values and names the cell."""
    try:
        read_column = _column_reader(hint)
    except _NotPlain:
        return lambda text, source, column: _parse_cell(hint, text, source, column)

    def parse(text: str, source: str, column: str) -> Any:
        try:
            return read_column((text,))[0]
        except _NotPlain:
            return _parse_cell(hint, text, source, column)
    return parse


def _parse_count(text: str, source: str, column: str) -> int:
    """A non-negative whole number where 0 means "none" (an attention row's window): empty is 0."""
    stripped = text.strip()
    if stripped == "":
        return 0
    if stripped.isascii() and stripped.isdigit() and len(stripped) < 16:
        return int(stripped)
    value = check_number(stripped, source, column, whole=True)
    if value < 0:
        raise ConfigError(source, column, text, "must be a non-negative whole number of tokens (0: no window)")
    return int(value)


def read_table_csv(path: Path, family: str, peak_for: Callable[[str], float],
                   lines: list[int] | None = None) -> tuple[Row, ...]:
    """Rows of one CSV; checks the header, that `efficiency` matches latency and peak and that it
    is not above MAX_EFFICIENCY. `lines`, when given, receives each row's line number."""
    import csv

    try:
        return _read_table_csv(path, family, peak_for, lines)
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", MISSING, f"not a text CSV file (invalid UTF-8 at byte {exc.start})") from None
    except csv.Error as exc:
        raise ConfigError(str(path), "", MISSING, f"not a readable CSV file ({exc})") from None
    except (OSError, EOFError) as exc:  # gzip: BadGzipFile is an OSError, a cut-off file an EOFError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(str(path), "", MISSING, f"cannot read table file: {reason}") from None


def _open_table_text(path: Path) -> Any:
    """A table file opened for reading as text: gunzipped when its name ends in .gz."""
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", newline="", encoding="utf-8")
    return path.open(newline="", encoding="utf-8")


def _checked_header(path: Path, family: str, reader: Any) -> list[str]:
    """The header row, refused unless it names every required column of `family` and no other."""
    expected = row_columns(family)
    header = next(reader, None)
    if header is None:
        raise ConfigError(str(path), "", MISSING, "empty table file")
    header = [h.strip() for h in header]
    required = [c for c in expected if c not in OPTIONAL_COLUMNS]
    missing = [c for c in required if c not in header]
    unknown = [c for c in header if c not in expected]
    if missing or unknown:
        raise ConfigError(str(path), "header", ",".join(header),
                          f"a {family} table has columns {','.join(expected)}"
                          + (f"; missing {','.join(missing)}" if missing else "")
                          + (f"; unknown {','.join(unknown)}" if unknown else ""))
    return header


def _read_table_csv(path: Path, family: str, peak_for: Callable[[str], float], lines: list[int] | None) -> tuple[Row, ...]:
    """Column by column when every cell and row passes (the bundled tables: about 2.7 million rows
    read once per install), else row by row, which finds the first wrong cell and names it."""
    import csv

    with _open_table_text(path) as handle:
        reader = csv.reader(handle)
        header = _checked_header(path, family, reader)
        read = _read_columns(reader, header, family, peak_for)
    if read is None:
        return _read_rows(path, family, peak_for, lines)
    rows, row_lines = read
    if lines is not None:
        lines.extend(row_lines)
    return rows


def _read_rows(path: Path, family: str, peak_for: Callable[[str], float], lines: list[int] | None) -> tuple[Row, ...]:
    row_type = ROW_TYPES[family]
    parsers = {name: _parse_count if name in ZERO_WHEN_EMPTY else _cell_parser(hint)
               for name, hint in get_type_hints(row_type).items()}
    parse_efficiency = _cell_parser(float)  # a column of the file, not a field of the row
    import csv

    with _open_table_text(path) as handle:
        reader = csv.reader(handle)
        header = _checked_header(path, family, reader)
        columns = [(name, header.index(name), parse) for name, parse in parsers.items() if name in header]
        efficiency_at = header.index("efficiency") if "efficiency" in header else -1
        rows: list[Row] = []
        for line_no, cells in enumerate(reader, start=2):
            if not cells or (not cells[0].strip() and all(not c.strip() for c in cells)):
                continue
            where = f"{path}:{line_no}"
            if len(cells) != len(header):
                raise ConfigError(where, "", cells, f"has {len(cells)} cells, the header {len(header)}")
            values = {name: parse(cells[at], where, name) for name, at, parse in columns}
            try:
                row = row_type(**values)
            except TypeError as exc:
                raise ConfigError(where, "", MISSING, str(exc)) from None
            if not row.latency_us > 0:
                raise ConfigError(where, "latency_us", row.latency_us, "must be positive")
            weight_format = getattr(row, "weight_dtype", None)
            if weight_format is not None and weight_format not in WEIGHT_FORMATS:
                raise ConfigError(where, "weight_dtype", weight_format,
                                  f"not a weight storage format (one of {', '.join(WEIGHT_FORMATS)}, or empty for "
                                  "the row's dtype)")
            if family in NO_EFFICIENCY:
                rows.append(row)
                if lines is not None:
                    lines.append(line_no)
                continue
            stored = parse_efficiency(cells[efficiency_at], where, "efficiency")
            recomputed = efficiency_of(row, peak_for(row.dtype))
            if _efficiency_disagrees(stored, recomputed):
                raise ConfigError(where, "efficiency", stored,
                                  f"does not match FLOPs/(latency*peak) = {recomputed:.6g} with the peak in "
                                  f"{PROVENANCE_FILE}; the table and its provenance disagree")
            if recomputed > MAX_EFFICIENCY:
                raise ConfigError(where, "latency_us", row.latency_us,
                                  f"implies efficiency {recomputed:.3g}: the kernel would run faster than the peak "
                                  f"FLOP/s in {PROVENANCE_FILE} (at most {MAX_EFFICIENCY:g} is accepted, for boost "
                                  "clocks and measurement noise)")
            rows.append(row)
            if lines is not None:
                lines.append(line_no)
    return tuple(rows)


class _NotPlain(Exception):
    """A column or row the column-wise reader does not take as it is: the file is read row by row."""


def _plain_records(records: list[list[str]], width: int, first_line: int) -> tuple[Sequence[int], list[list[str]]]:
    """Line numbers and cells of the data rows (blank rows skipped), each of `width` cells."""
    if set(map(len, records)) == {width}:
        return range(first_line, first_line + len(records)), records
    kept = [(n, cells) for n, cells in enumerate(records, start=first_line) if cells and any(c.strip() for c in cells)]
    if any(len(cells) != width for _, cells in kept):
        raise _NotPlain
    return [n for n, _ in kept], [cells for _, cells in kept]


def _positive_ints(texts: Sequence[str]) -> list[Any]:
    """A column of plain ASCII digits, each a positive number of at most 15 digits."""
    joined = "".join(texts)
    if not (joined.isascii() and joined.isdigit()) or min(map(len, texts)) == 0 or max(map(len, texts)) >= 16:
        raise _NotPlain
    values = list(map(int, texts))
    if min(values) <= 0:
        raise _NotPlain
    return values


def _floats(texts: Sequence[str]) -> list[Any]:
    """A column of numbers float() reads, each finite and 0 or of a magnitude the number rule accepts."""
    try:
        values = list(map(float, texts))
    except ValueError:
        raise _NotPlain from None
    if not math.isfinite(sum(values)):  # a sum is finite only when every term is (or it overflowed: slow path)
        raise _NotPlain
    sizes = list(map(abs, values))
    if max(sizes) > MAX_MAGNITUDE or (min(sizes) < MIN_MAGNITUDE and any(0 < x < MIN_MAGNITUDE for x in sizes)):
        raise _NotPlain
    return values


def _counts(texts: Sequence[str]) -> list[Any]:
    """A column of _parse_count cells that are empty (0) or plain ASCII digits."""
    words = list(map(str.strip, texts))
    given = [w for w in words if w]
    if not given:
        return [0] * len(words)
    joined = "".join(given)
    if not (joined.isascii() and joined.isdigit()) or max(map(len, given)) >= 16:
        raise _NotPlain
    return [int(w) if w else 0 for w in words]


_BOOL_WORDS = {"true": True, "false": False}


def _column_reader(hint: Any) -> Callable[[Sequence[str]], list[Any]]:
    """A reader of a whole column of cells of type `hint`, with the values _parse_cell gives, that
    raises _NotPlain for any column with a cell it does not take as it is (then _parse_cell reads it)."""
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else ()
    if hint is float:
        return _floats
    if hint is int:
        return _positive_ints
    if hint is str:
        return lambda texts: list(map(str.strip, texts))
    if hint is bool:
        def read_bools(texts: Sequence[str]) -> list[Any]:
            try:
                return list(map(_BOOL_WORDS.__getitem__, map(str.lower, map(str.strip, texts))))
            except KeyError:
                raise _NotPlain from None
        return read_bools
    if get_origin(hint) is Literal:
        allowed = frozenset(get_args(hint))

        def read_names(texts: Sequence[str]) -> list[Any]:
            words = list(map(str.strip, texts))
            if not allowed.issuperset(words):
                raise _NotPlain
            return words
        return read_names
    if options and type(None) in options and len(options) == 2:
        present = _column_reader(next(o for o in options if o is not type(None)))

        def read_optional(texts: Sequence[str]) -> list[Any]:
            present_texts = [t for t in texts if t.strip()]
            if not present_texts:
                return [None] * len(texts)
            given = iter(present(present_texts))
            return [next(given) if t.strip() else None for t in texts]
        return read_optional
    raise _NotPlain  # no row field has another type today; a new one is read row by row until it has a reader


#: rows converted at a time: enough that a column's conversion costs little per cell, few enough that
#: the cells are freed before the cycle collector's passes move them into its older generations
_CHUNK_ROWS = 512


def _read_columns(reader: Iterator[list[str]], header: list[str], family: str,
                  peak_for: Callable[[str], float]) -> tuple[tuple[Row, ...], tuple[int, ...]] | None:
    """The rows after the header and their line numbers, read in chunks column by column: each
    column converted in one pass and its range checked with min and max, rows built positionally.
    None when anything is not plain (a cell a fast path refuses, a row failing a check, a file that
    cannot be read to its end), for the row-by-row reader to name."""
    import csv

    row_type = ROW_TYPES[family]
    rows: list[Row] = []
    line_numbers: list[int] = []
    next_line = 2
    try:
        readers = _column_readers(row_type, header)
        while records := list(itertools.islice(reader, _CHUNK_ROWS)):
            numbers, cell_rows = _plain_records(records, len(header), next_line)
            next_line += len(records)
            if not cell_rows:
                continue
            columns = list(zip(*cell_rows))
            chunk = tuple(map(row_type, *[read(columns[at]) if at >= 0 else itertools.repeat(read)
                                          for at, read in readers]))
            _check_rows(chunk, header, columns, family, peak_for)
            rows.extend(chunk)
            line_numbers.extend(numbers)
    except (_NotPlain, ConfigError, TypeError, UnicodeDecodeError, csv.Error, OSError, EOFError):
        return None  # TypeError: a row type's own refusal
    return tuple(rows), tuple(line_numbers)


def _column_readers(row_type: type, header: list[str]) -> list[tuple[int, Any]]:
    """For each field of `row_type` in order: the header position of its column and the column's
    reader, or -1 and the field's default where the (optional) column is absent."""
    hints = get_type_hints(row_type)
    readers: list[tuple[int, Any]] = []
    for f in dataclasses.fields(row_type):
        if f.name in header:
            read = _counts if f.name in ZERO_WHEN_EMPTY else _column_reader(hints[f.name])
            readers.append((header.index(f.name), read))
        elif f.default is not dataclasses.MISSING:
            readers.append((-1, f.default))
        else:
            raise _NotPlain
    return readers


def _check_rows(rows: tuple[Any, ...], header: list[str], columns: list[tuple[str, ...]], family: str,
                peak_for: Callable[[str], float]) -> None:
    """The row reader's checks on whole columns: positive latency, weight formats, efficiency."""
    if not min(row.latency_us for row in rows) > 0:
        raise _NotPlain
    if "weight_dtype" in header and not set(WEIGHT_FORMATS).issuperset(
            row.weight_dtype for row in rows if row.weight_dtype is not None):
        raise _NotPlain
    if family in NO_EFFICIENCY:
        return
    stored = _floats(columns[header.index("efficiency")])
    peaks = {dtype: peak_for(dtype) for dtype in {row.dtype for row in rows}}
    recomputed = [efficiency_of(row, peaks[row.dtype]) for row in rows]
    if max(recomputed) > MAX_EFFICIENCY or any(map(_efficiency_disagrees, stored, recomputed)):
        raise _NotPlain


def _efficiency_disagrees(stored: float, recomputed: float) -> bool:
    return abs(stored - recomputed) > EFFICIENCY_TOLERANCE * max(recomputed, 1e-12) + 5e-7


def read_table_dir(directory: Path) -> TableDirectory:
    """Load a table directory: provenance first (refused without it), then every CSV it lists.

    A CSV in the directory that the provenance does not list is refused too: every number must
    be traceable.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InferSimError(f"kernel table directory not found: {directory}")
    prov = read_provenance(directory)
    prov_path = str(directory / PROVENANCE_FILE)
    unlisted = sorted(p.name for p in table_files_in(directory) if p.name not in prov.tables)
    if unlisted:
        raise ConfigError(prov_path, "tables", unlisted[0],
                          "this CSV is in the directory but not listed in the provenance; list it or remove it")
    tables: dict[str, tuple[Row, ...]] = {}
    row_lines: dict[str, tuple[int, ...]] = {}
    for name, info in prov.tables.items():
        path = directory / name
        if not path.is_file():
            raise ConfigError(prov_path, f"tables.{name}", name, "listed table file not found")
        lines: list[int] = []
        tables[name] = read_table_csv(path, info.family, lambda d: prov.peak_for(d, prov_path), lines)
        row_lines[name] = tuple(lines)
    return TableDirectory(provenance=prov, tables=tables, row_lines=row_lines)


def table_directories(root: Path) -> list[Path]:
    """Every directory under `root` (itself included) that holds a provenance.yaml."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob(PROVENANCE_FILE))
