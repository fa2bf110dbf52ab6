"""Pictures from the JSON the commands emit, so a saved result can be drawn later.

    python -m infersim plot RESULT.json [--out FILE] [--kind KIND]
    python -m infersim --config X.yaml --plot breakdown.png
    python -m infersim roofline --config X.yaml --out roofline.png

Each figure is one function taking the parsed JSON and returning a `Drawing` (the matplotlib
figure and a record of the numbers drawn, which the tests check against the JSON); writing files
and printing belong to the CLI (`infersim.plot.cli`). matplotlib is imported only inside the figure
functions (`infersim.plot.backend.pyplot`), so the simulator never needs it.

Result kinds, recognised from their keys (`--kind` forces a figure):

| data (command)                         | recognised by            | figures (first = default) |
|----------------------------------------|--------------------------|---------------------------|
| main run (`infersim --format json`)    | `prefill` and `decode`   | breakdown, roofline       |
| sweep (`sweep`/`pareto --out .json/.csv`) | `rows` (or a .csv file) | sweep, breakdown          |
| compare (`compare --format json`)      | `lanes`, or `results` + `bench_result` | compare     |
| validate                               | `points` or `cases`      | validate                  |
| serving (`serve --format json`)        | `rate_sweep`, `requests`, `output_throughput` or `mean_ttft_ms` | serve |
"""

from __future__ import annotations

import csv
import io
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infersim.base.errors import ConfigError, InferSimError
from infersim.base.plaindata import JsonError, loads_json
from infersim.plot.backend import Drawing

#: figures that can be drawn from each kind of result; the first is drawn unless --kind says otherwise
FIGURES_FOR = {
    "run": ("breakdown", "roofline"),
    "sweep": ("sweep", "breakdown"),
    "compare": ("compare",),
    "validate": ("validate",),
    "serve": ("serve",),
}
FIGURE_KINDS = ("breakdown", "roofline", "compare", "validate", "sweep", "serve")


def load_result(path: str) -> dict[str, Any]:
    """A saved result: JSON (a file, or '-' for stdin), or a sweep's CSV (rows under 'rows')."""
    if path == "-":
        text, name = sys.stdin.read(), "stdin"
    else:
        file = Path(path)
        if not file.is_file():
            raise InferSimError(f"{path}: no such file")
        try:
            text, name = file.read_text(encoding="utf-8"), path
        except UnicodeDecodeError:
            raise InferSimError(f"{path}: not a text file (a result is the JSON a command printed with "
                                "--format json, or a sweep's CSV)") from None
        except OSError as exc:
            raise InferSimError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if path.lower().endswith(".csv"):
        return {"rows": _sweep_csv_rows(text, name), "source_file": name}
    try:
        data = loads_json(text, name)  # a key given twice, nesting too deep, a number too long: one message
    except JsonError as exc:
        hint = "" if exc.too_deep or ": not JSON" not in str(exc) else \
            "; save results with --format json (or a sweep's --out FILE.json)"
        raise InferSimError(f"{exc}{hint}") from None
    if not isinstance(data, dict):
        raise InferSimError(f"{name}: expected a JSON object at the top level")
    check_numbers(data, name)
    return data


#: the columns every row of a sweep's (or pareto's) CSV has: a CSV without them is another file
SWEEP_COLUMNS = ("status", "tpot_ms")


def _sweep_csv_rows(text: str, name: str) -> list[dict[str, str]]:
    """The rows of a sweep's CSV. Another CSV (a serve --requests-out file) is refused: drawn as a
    sweep it made a picture of 'configurations' that are requests."""
    try:
        reader = csv.reader(io.StringIO(text))
        header = next(reader, None)
        records = list(reader)
    except csv.Error as exc:
        raise InferSimError(f"{name}: not a CSV file ({exc})") from None
    if header is None:
        raise InferSimError(f"{name}: the CSV file is empty")
    missing = [c for c in SWEEP_COLUMNS if c not in header]
    if missing:
        looks = " (its columns are serve --requests-out records: draw serving from serve --format json, with " \
                "--include-requests for the TTFT/TPOT histograms)" if "arrival_s" in header else ""
        raise InferSimError(f"{name}: not a sweep's CSV: no column {', '.join(missing)}{looks}; plot reads a CSV only "
                            "as sweep or pareto --out FILE.csv writes it")
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise InferSimError(f"{name}: the header names column {twice[0]!r} twice: which is meant is not guessed")
    rows = []
    for number_, cells in enumerate(records, start=2):
        if not cells:
            continue  # a blank line, as csv.DictReader skips it
        if len(cells) != len(header):
            raise InferSimError(f"{name}: line {number_}: {len(cells)} cells under a header of {len(header)} columns")
        rows.append(dict(zip(header, cells)))
    if not rows:
        raise InferSimError(f"{name}: the CSV file has no rows")
    return rows


#: keys whose values the commands write as numbers (or null): a result whose such field holds text,
#: a boolean or a non-finite number is refused naming the field, before any figure reads it
_NUMERIC_KEY = re.compile(r"(_ms|_us|_gb|_gbps|_s|tgs|flops|bytes|throughput|throughput_per_gpu|_rate|rate|"
                          r"duration|measured|predicted|error|factor|fraction|utilization_mean|utilization_peak|"
                          r"attainment|goodput|num_gpus|completed|layers|time_us|batch_per_gpu)$")
_MAX_WALK = 1_000_000  # values looked at: a result is at most a few hundred thousand


def _named_batch(key: str, item: Any) -> bool:
    """A swept decode batch of 'max' (the largest that fits), as sweeps write it beside the number."""
    return key.endswith("decode_batch_per_gpu") and item == "max"


def check_numbers(data: Any, name: str) -> None:
    """Walk a result (breadth-first, at most _MAX_WALK values) and refuse a numeric field holding
    anything but a finite number or null: one message naming the field's path and value."""
    queue: list[tuple[str, Any]] = [("", data)]
    seen = 0
    while queue and seen < _MAX_WALK:
        path, value = queue.pop()
        seen += 1
        if isinstance(value, dict):
            for key, item in value.items():
                key = str(key)
                where = f"{path}.{key}" if path else key
                if isinstance(item, (dict, list)):
                    queue.append((where, item))
                elif _NUMERIC_KEY.search(key) and item is not None and not _named_batch(key, item) and (
                        isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item)):
                    raise ConfigError(name, where, item, "expected a finite number (as the commands write it)")
        elif isinstance(value, list):
            queue.extend((f"{path}[{i}]", item) for i, item in enumerate(value) if isinstance(item, (dict, list)))


def result_kind(data: Mapping[str, Any]) -> str | None:
    """Which command's output this is (a key of FIGURES_FOR), from its keys; None if unknown."""
    if isinstance(data.get("prefill"), Mapping) and isinstance(data.get("decode"), Mapping):
        return "run"
    if isinstance(data.get("rows"), list):
        return "sweep"
    if isinstance(data.get("lanes"), list) or (isinstance(data.get("results"), list) and "bench_result" in data):
        return "compare"
    if isinstance(data.get("points"), list) or isinstance(data.get("cases"), list):
        return "validate"
    if any(key in data for key in ("rate_sweep", "requests", "output_throughput", "mean_ttft_ms")):
        return "serve"
    return None


def choose_figure(data: Mapping[str, Any], kind: str | None, source: str = "the data") -> str:
    """The figure to draw: --kind if it fits the data, else the data's default figure."""
    found = result_kind(data)
    if kind is None:
        if found is None:
            raise InferSimError(f"{source}: cannot tell which command wrote it (no prefill/decode, rows, lanes, "
                                f"points or serving keys); pass --kind {{{','.join(FIGURE_KINDS)}}}")
        return FIGURES_FOR[found][0]
    if kind not in FIGURE_KINDS:
        raise InferSimError(f"--kind {kind}: expected one of {', '.join(FIGURE_KINDS)}")
    if found is not None and kind not in FIGURES_FOR[found]:
        raise InferSimError(f"--kind {kind}: {source} is {found} output, which draws as "
                            f"{' or '.join(FIGURES_FOR[found])}")
    return kind


def draw(data: Mapping[str, Any], figure_kind: str, stages: Sequence[str] = ("prefill", "decode"),
         metric: str = "tpot_ms", x: str | None = None, series: str | None = None,
         where: Sequence[str] = ()) -> Drawing:
    """Draw one figure of a result (figure_kind from `choose_figure`)."""
    if figure_kind == "breakdown":
        from infersim.plot.breakdown import draw_breakdown, draw_sweep_breakdown

        return draw_sweep_breakdown(data) if result_kind(data) == "sweep" else draw_breakdown(data)
    if figure_kind == "roofline":
        from infersim.plot.roofline import draw_roofline

        return draw_roofline(data, stages)
    if figure_kind == "compare":
        from infersim.plot.compare import draw_compare

        return draw_compare(data)
    if figure_kind == "validate":
        from infersim.plot.compare import draw_validate

        return draw_validate(data)
    if figure_kind == "sweep":
        from infersim.plot.sweep import draw_sweep

        return draw_sweep(data, metric, x, series, where)
    if figure_kind == "serve":
        from infersim.plot.serve import draw_serve

        return draw_serve(data)
    raise InferSimError(f"unknown figure kind {figure_kind!r}; expected one of {', '.join(FIGURE_KINDS)}")


__all__ = ["Drawing", "FIGURES_FOR", "FIGURE_KINDS", "choose_figure", "draw", "load_result", "result_kind"]
