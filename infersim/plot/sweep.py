"""Sweep: a chosen metric against a chosen swept axis, one line per value of another axis.

Reads what `infersim sweep --out FILE` / `infersim pareto --out FILE` write
(infersim/sweep/output.py): a .json file (`grid` names the swept fields, `rows` holds one record
per configuration) or a .csv file (one row per configuration; the swept fields are the columns
before `status`). Rejected rows are left out.

- metric (`--metric`, default `tpot_ms`): any numeric column, e.g. tpot_ms, ttft_ms, tgs,
  user_tokens_per_s, total_tokens_per_s, total_cost_per_mtok_usd (the tables' $/Mtok: GPU-hours +
  energy), cost_per_mtok_usd (GPU-hours alone), max_batch_per_gpu.
- x (`--x`, default: the first swept field with more than one value): a swept field or any
  column (batch_per_gpu, num_gpus); a unique suffix is enough (`ep` for deployment.ffn.ep).
- series (`--series`, default: the next swept field with more than one value): one line per value.
  Swept fields that are neither x nor series also split lines (their values join the label);
  `--where FIELD=VALUE` keeps only the rows with that value, to draw one slice.
- Several rows at the same x on one line (a layout search gives many deployments per point) are
  reduced to the best of them: the lowest for times and costs (names ending in _ms or _usd), the
  highest otherwise; the drawn data and the title say so.
- Configurations that do not fit in memory (`fits` false) are no speed that can happen: lines join
  only those that fit, and an x where nothing of a line fits gets a hollow marker (the best of
  what does not fit there); the legend counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.plot.backend import Drawing, pyplot
from infersim.plot.common import number

METRIC_LABELS = {
    "tpot_ms": "TPOT (ms)",
    "ttft_ms": "single-request TTFT (ms)",
    "prefill_step_ms": "prefill step (ms)",
    "tgs": "decode throughput (tokens/GPU/s)",
    "prefill_tgs": "prefill throughput (tokens/GPU/s)",
    "user_tokens_per_s": "output speed per request (tokens/s)",
    "total_tokens_per_s": "total output throughput (tokens/s)",
    "cost_per_mtok_usd": "GPU-hours cost (USD per million output tokens)",
    "total_cost_per_mtok_usd": "cost (USD per million output tokens)",
    "cost_with_energy_per_mtok_usd": "GPU-hours + energy cost (USD per million output tokens)",
    "max_batch_per_gpu": "largest decode batch that fits (requests/GPU)",
    "kv_capacity_gb": "KV cache space per GPU (GB)",
    "weights_gb": "weights per GPU (GB)",
    "batch_per_gpu": "decode batch (requests/GPU)",
    "num_gpus": "GPUs",
}

FIELD_LABELS = {
    "workload.decode_batch_per_gpu": "decode batch (requests/GPU)",
    "workload.isl": "input length ISL (tokens)",
    "workload.osl": "output length OSL (tokens)",
    "workload.prefill_tokens_per_gpu": "prefill tokens per GPU per step",
    "deployment.num_gpus": "GPUs",
}


def axis_label(column: str) -> str:
    """A column with its unit where one is known; swept fields otherwise by their full name."""
    return METRIC_LABELS.get(column) or FIELD_LABELS.get(column) or column


#: the swept field whose value 'max' stands for a number (the largest batch that fits), which each row records
BATCH_FIELD = "workload.decode_batch_per_gpu"

#: a figure with more lines than this is unreadable; --where picks a slice instead
MAX_LINES = 12


def sweep_rows(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise InferSimError("sweep: no 'rows' in the data (is this `infersim sweep --out FILE.json` output?)")
    return rows


def sweep_axes(data: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The swept fields: the JSON's `grid`, or (CSV) the columns before `status`."""
    grid = data.get("grid")
    if isinstance(grid, Mapping):
        return list(grid)
    axes = []
    for key in rows[0]:
        if key == "status":
            return axes
        axes.append(key)
    return []


def resolve_column(name: str, columns: Sequence[str], option: str) -> str:
    """A column by its full name or a unique dotted suffix (`ep` -> deployment.ffn.ep)."""
    if name in columns:
        return name
    matches = [c for c in columns if c.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise InferSimError(f"{option} {name}: ambiguous, matches {', '.join(matches)}")
    raise InferSimError(f"{option} {name}: no such column; columns: {', '.join(columns)}")


def _key(value: Any) -> Any:
    """A cell as a comparable key: numbers as floats (CSV cells are text), everything else as text."""
    x = number(value)
    return x if x is not None else str(value)


def fits(row: Mapping[str, Any]) -> bool:
    """Whether a sweep row fits in memory (JSON: a boolean; CSV: its text; absent: it does)."""
    value = row.get("fits")
    return not (value is False or str(value).strip().lower() in ("false", "0", "no"))


def _varies(rows: Sequence[Mapping[str, Any]], column: str) -> bool:
    return len({_key(r.get(column)) for r in rows}) > 1


def lower_is_better(metric: str) -> bool:
    return metric.endswith(("_ms", "_usd"))


def parse_where(conditions: Sequence[str], columns: Sequence[str]) -> list[tuple[str, Any]]:
    out = []
    for text in conditions:
        if "=" not in text:
            raise InferSimError(f"--where {text}: expected FIELD=VALUE")
        field, value = text.split("=", 1)
        out.append((resolve_column(field.strip(), columns, "--where"), _key(value.strip())))
    return out


def sweep_lines(data: Mapping[str, Any], metric: str = "tpot_ms", x: str | None = None, series: str | None = None,
                where: Sequence[str] = ()) -> dict[str, Any]:
    """The lines to draw (pure): {metric, x, series, lines: [{label, x, y, reduced_from}], ...}."""
    rows = [r for r in sweep_rows(data) if str(r.get("status", "ok")) in ("ok", "")]
    if not rows:
        raise InferSimError("sweep: every row was rejected; nothing to draw")
    columns = list(rows[0].keys())
    metric = resolve_column(metric, columns, "--metric")
    for column, value in parse_where(where, columns):
        rows = [r for r in rows if _key(r.get(column)) == value]
    if not rows:
        raise InferSimError(f"sweep: no row matches --where {' '.join(where)}")
    axes = sweep_axes(data, rows)
    if x is None:
        varying = [a for a in axes if _varies(rows, a)] or [c for c in ("batch_per_gpu", "num_gpus")
                                                             if c in columns and _varies(rows, c)]
        if not varying:
            raise InferSimError("sweep: no swept field takes more than one value here; nothing to draw a line along")
        x = varying[0]
    else:
        x = resolve_column(x, columns, "--x")
    if series is None:
        others = [a for a in axes if a != x and _varies(rows, a)]
        series = others[0] if others else None
    else:
        series = resolve_column(series, columns, "--series")
    # swept fields that are neither x nor series still separate lines
    splitting = ([series] if series else []) + [a for a in axes if a not in (x, series) and _varies(rows, a)]
    groups: dict[tuple[Any, ...], dict[Any, list[float]]] = {}
    unfit: dict[tuple[Any, ...], dict[Any, list[float]]] = {}
    x_values: dict[Any, Any] = {}
    unfit_rows = 0
    resolved: set[float] = set()  # x positions a 'max' batch resolved to
    for r in rows:
        y = number(r.get(metric))
        if y is None:
            continue
        group = tuple(r.get(c) for c in splitting)
        xk = _key(r.get(x))
        if xk == "max" and x == BATCH_FIELD and number(r.get("batch_per_gpu")) is not None:
            # 'max' is the largest batch that fits: the number it resolved to, marked as such
            xk = float(r["batch_per_gpu"])
            resolved.add(xk)
        x_values.setdefault(xk, xk if xk in resolved else r.get(x))
        groups.setdefault(group, {})
        if fits(r):
            groups[group].setdefault(xk, []).append(y)
        else:
            unfit_rows += 1
            unfit.setdefault(group, {}).setdefault(xk, []).append(y)
    if not groups:
        raise InferSimError(f"sweep: no row has a value for {metric}")
    if len(groups) > MAX_LINES:
        raise InferSimError(f"sweep: {len(groups)} lines would be drawn (by {', '.join(splitting)}); "
                            f"pick a slice with --where FIELD=VALUE or another --series")
    numeric_x = all(isinstance(k, float) for k in x_values)
    pick = min if lower_is_better(metric) else max
    def ordered(keys: Any) -> list[Any]:
        return sorted(keys, key=lambda k: (0, k) if isinstance(k, float) else (1, k)) if numeric_x else \
            [k for k in x_values if k in keys]

    lines = []
    for group, points in groups.items():
        keys = ordered(points)
        # one splitting field: the legend title names it, entries give the value only
        label = (str(group[0]) if len(splitting) == 1 else
                 ", ".join(f"{c.rsplit('.', 1)[-1]}={v}" for c, v in zip(splitting, group))) or metric
        alone = ordered(k for k in unfit.get(group, {}) if k not in points)  # x where nothing of the line fits
        lines.append({"label": label, "x": [k if numeric_x else str(x_values[k]) for k in keys],
                      "y": [pick(points[k]) for k in keys], "reduced_from": [len(points[k]) for k in keys],
                      "unfit_x": [k if numeric_x else str(x_values[k]) for k in alone],
                      "unfit_y": [pick(unfit[group][k]) for k in alone]})
    return {"kind": "sweep", "metric": metric, "x_field": x, "series_field": series, "splitting": splitting,
            "numeric_x": numeric_x, "categories": None if numeric_x else [str(v) for v in x_values.values()],
            "max_x": sorted(resolved),
            "best_of": "lowest" if lower_is_better(metric) else "highest",
            "reduced": any(n > 1 for line in lines for n in line["reduced_from"]), "lines": lines,
            "unfit_rows": unfit_rows, "rows": len(rows)}


def draw_sweep(data: Mapping[str, Any], metric: str = "tpot_ms", x: str | None = None, series: str | None = None,
               where: Sequence[str] = ()) -> Drawing:
    drawn = sweep_lines(data, metric, x, series, where)
    plt = pyplot("the sweep picture")
    figure, ax = plt.subplots(figsize=(8, 5.2))
    categories = drawn["categories"]

    def positions(values: list[Any]) -> list[Any]:
        return values if drawn["numeric_x"] else [categories.index(v) for v in values]

    for line in drawn["lines"]:
        (drawn_line,) = ax.plot(positions(line["x"]), line["y"], marker="o", markersize=4, linewidth=1.5,
                                label=line["label"])
        if line["unfit_x"]:
            ax.plot(positions(line["unfit_x"]), line["unfit_y"], linestyle="none", marker="o", markersize=7,
                    color=drawn_line.get_color(), markerfacecolor="none", markeredgewidth=1.2, alpha=0.7)
    if drawn["max_x"]:
        for line in drawn["lines"]:
            at = [(x, y) for x, y in zip(line["x"], line["y"]) if x in drawn["max_x"]]
            ax.plot([x for x, _ in at], [y for _, y in at], linestyle="none", marker="D", markersize=7,
                    markerfacecolor="none", markeredgecolor="black", markeredgewidth=1.0, zorder=4)
        ax.plot([], [], linestyle="none", marker="D", markersize=7, markerfacecolor="none", markeredgecolor="black",
                label="max: the largest batch that fits, at its value")
    if drawn["unfit_rows"]:
        # a legend entry for the hollow markers, in neutral grey (each marker keeps its line's colour)
        ax.plot([], [], linestyle="none", marker="o", markersize=7, color="0.4", markerfacecolor="none",
                label=f"does not fit in memory ({drawn['unfit_rows']} of {drawn['rows']})")
    if drawn["numeric_x"]:
        all_x = [v for line in drawn["lines"] for v in (*line["x"], *line["unfit_x"])]
        if min(all_x) > 0 and max(all_x) / min(all_x) >= 16:
            from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

            ax.set_xscale("log", base=2)  # doubling grids (a..b) spread evenly
            ticks = sorted(set(all_x))
            if len(ticks) <= 12:  # the swept values themselves, written plainly (64, not 2^6)
                ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels(categories)
    x_field, metric_name = drawn["x_field"], drawn["metric"]
    ax.set_xlabel(axis_label(x_field))
    ax.set_ylabel(axis_label(metric_name))
    ax.grid(True, which="both", alpha=0.3)
    if len(drawn["lines"]) > 1 or drawn["splitting"] or drawn["unfit_rows"] or drawn["max_x"]:
        ax.legend(fontsize=8, title=", ".join(c.rsplit(".", 1)[-1] for c in drawn["splitting"]) or None,
                  title_fontsize=8)
    title = f"{axis_label(metric_name)} vs {x_field}"
    if data.get("config") or data.get("source_file"):
        title = f"{Path(str(data.get('config') or data.get('source_file'))).name}: {title}"
    if where:
        title += f" ({', '.join(where)})"
    if drawn["reduced"]:
        title += f"\neach point: the {drawn['best_of']} of the deployments simulated there"
    ax.set_title(title, fontsize=9)
    figure.tight_layout()
    return Drawing(figure, drawn)
