"""Sweep output: records, the tables printed on stdout, CSV / JSON / Parquet files and the frontier plot."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from infersim.base.errors import InferSimError
from infersim.sweep.analysis import Best, Choice, Targets, variant_axes, why_not
from infersim.sweep.evaluate import Row, SweepSpec
from infersim.sweep.grid import SEARCHED_FIELDS
from infersim.base.units import GB

OUTPUT_FORMATS = (".csv", ".json", ".parquet")


def check_output_path(path: str | None) -> None:
    """Fail before a sweep runs when its output cannot be written."""
    if not path:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise InferSimError(f"--out {path}: unknown format '{suffix or '(none)'}'; use a .csv, .json or .parquet file")
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise InferSimError(f"--out {path}: writing Parquet needs pyarrow (pip install pyarrow); "
                            "or use .csv or .json")
    parent = Path(path).parent
    if not parent.is_dir():
        raise InferSimError(f"--out {path}: directory {parent} does not exist")


def check_plot_path(path: str | None, need_matplotlib: bool = True) -> None:
    """A --plot path's format and directory (before a search runs), and matplotlib unless
    `need_matplotlib` is false (asked again when drawing, after the report is printed)."""
    if not path:
        return
    from infersim.plot.backend import check_picture_path

    check_picture_path(path, "--plot", need_matplotlib)


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def layout_text(row: Row) -> str:
    """Compact parallel layout: [PPn ]A:TPxDP F:TPxEPxDP (x1 parts omitted)."""
    if not row.ok:
        return "-"
    attn = f"TP{row.attn_tp}xDP{row.attn_dp}"
    ffn = "x".join(p for p in (f"TP{row.ffn_tp}" if row.ffn_tp > 1 or row.ffn_ep == 1 else "",
                               f"EP{row.ffn_ep}" if row.ffn_ep > 1 else "",
                               f"DP{row.ffn_dp}" if row.ffn_dp > 1 else "") if p)
    pp = f"PP{row.pp} " if row.pp > 1 else ""
    return f"{pp}A:{attn} F:{ffn}"


def row_record(spec: SweepSpec, row: Row, targets: Targets | None = None,
               on_cards: Mapping[tuple[int, ...], Row] | None = None) -> dict[str, Any]:
    """One row as a flat mapping: grid values by full field path, then deployment and results
    (`on_cards`: the configurations simulated without the run's calibration profile, by row_key:
    every record then has their TPOT and TTFT, None where that run has none)."""
    values = spec.values(row.point)
    rec: dict[str, Any] = {axis.path: value for axis, value in zip(spec.axes, values)}
    rec["status"] = "ok" if row.ok else "rejected"
    rec.update({
        "num_gpus": row.num_gpus or None, "num_nodes": row.num_nodes or None, "pp": row.pp or None,
        "attention_tp": row.attn_tp or None, "attention_dp": row.attn_dp or None,
        "ffn_tp": row.ffn_tp or None, "ffn_ep": row.ffn_ep or None, "ffn_dp": row.ffn_dp or None,
        "batch_per_gpu": row.batch or None,
        # the OSL the row was timed with: below the workload's where the engine's server cuts the output
        "osl_timed": row.osl or None,
        "tpot_ms": _num(row.tpot_s * 1e3), "user_tokens_per_s": _num(row.user_tps), "tgs": _num(row.tgs),
        "total_tokens_per_s": _num(row.tgs * row.num_gpus) if row.ok else None,
        # ttft_ms: one prompt alone (the main report's single_request_ttft_ms); prefill_step_ms and
        # prefill_tgs: the workload's prefill step, all the prompts it packs together
        "ttft_ms": _num(row.ttft_s * 1e3), "prefill_step_ms": _num(row.prefill_step_s * 1e3),
        "prefill_tgs": _num(row.prefill_tgs),
        "cost_per_mtok_usd": _num(row.cost_per_mtok), "price_per_gpu_hour": row.price or None,
        "joules_per_token": _num(row.joules_per_token), "watts_per_gpu": _num(row.watts_per_gpu),
        "energy_cost_per_mtok_usd": _num(row.energy_usd_per_mtok),
        "cost_with_energy_per_mtok_usd": _num(row.cost_with_energy_per_mtok),
        # the tables' $/Mtok and the Pareto cost: GPU-hours + energy, or GPU-hours alone without power facts
        "total_cost_per_mtok_usd": _num(row.total_cost_per_mtok),
        "cost_includes_energy": row.cost_includes_energy if row.ok else None,
        "bound": row.bound or None, "fits": row.fits if row.ok else None,
        "max_batch_per_gpu": row.max_batch if row.ok else None,
        # the engine's default running-request cap per GPU: a batch above it needs a larger cap at launch
        "default_running_cap_per_gpu": (row.running_cap or None) if row.ok else None,
        "kv_capacity_gb": _num(row.kv_capacity_bytes / GB), "weights_gb": _num(row.weights_bytes / GB),
    })
    if on_cards is not None:
        cards = _on_cards(on_cards, row)
        rec["tpot_ms_on_the_cards"] = _num(cards.tpot_s * 1e3) if cards is not None else None
        rec["ttft_ms_on_the_cards"] = _num(cards.ttft_s * 1e3) if cards is not None else None
    if targets is not None:
        reason = why_not(row, targets)
        rec["meets_targets"] = not reason
        rec["why_not"] = reason or None
    rec["problem"] = row.status or None
    return rec


def best_record(spec: SweepSpec, best: Best, axes: Sequence[int], targets: Targets) -> dict[str, Any]:
    rec: dict[str, Any] = {spec.axes[i].path: v for i, v in zip(axes, best.variant)}
    rec["binding"] = best.binding
    rec["candidates"] = best.candidates
    rec["feasible"] = best.feasible
    if best.row is not None:
        full = row_record(spec, best.row, targets)
        rec.update({k: v for k, v in full.items() if k not in rec and k not in {a.path for a in spec.axes}})
    return rec


# ---------------------------------------------------------------------------------------------
# Tables


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _value_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def row_key(row: Row) -> tuple[int, ...]:
    """What identifies a configuration across two sweeps of one grid: its point, layout and batch."""
    return (row.point, row.num_gpus, row.pp, row.attn_tp, row.attn_dp, row.ffn_tp, row.ffn_ep, row.ffn_dp, row.batch)


def _on_cards(on_cards: Mapping[tuple[int, ...], Row], row: Row) -> Row | None:
    """The simulated row of the same configuration on the cards, or None."""
    cards = on_cards.get(row_key(row)) if row.ok else None
    return cards if cards is not None and cards.ok else None


def rows_table(spec: SweepSpec, rows: Sequence[Row], targets: Targets, show_prefill: bool, show_cost: bool,
               axes: Sequence[int] | None = None, on_cards: Mapping[tuple[int, ...], Row] | None = None) -> str:
    """The rows as a table; `on_cards`: the same configurations simulated without the run's
    calibration profile (by row_key), whose TPOT (and TTFT) stand beside the calibrated ones."""
    axes = list(range(len(spec.axes))) if axes is None else list(axes)
    headers = [spec.axes[i].label for i in axes] + ["GPUs", "layout", "batch", "TPOT ms"]
    if on_cards is not None:
        headers.append("on the cards")
    headers += ["tok/s/user", "TGS"]
    if show_prefill:
        headers += ["TTFT ms"] + (["on the cards"] if on_cards is not None else [])
    if show_cost:
        headers.append("$/Mtok")
    show_energy = has_energy(rows)
    if show_energy:
        headers.append("J/tok")
    headers += ["bound", "fits"]
    if targets.any:
        headers.append("meets")
    body = []
    for row in rows:
        values = spec.values(row.point)
        line = [_value_text(values[i]) for i in axes]
        if not row.ok:
            line += ["-", "rejected: " + row.status] + ["-"] * (len(headers) - len(line) - 2)
            body.append(line)
            continue
        cards = _on_cards(on_cards, row) if on_cards is not None else None
        line += [row.num_gpus, layout_text(row), row.batch, _fmt(row.tpot_s * 1e3)]
        if on_cards is not None:
            line.append(_fmt(cards.tpot_s * 1e3) if cards is not None else "-")
        line += [_fmt(row.user_tps, 1), _fmt(row.tgs, 0)]
        if show_prefill:
            line.append(_fmt(row.ttft_s * 1e3, 1))
            if on_cards is not None:
                line.append(_fmt(cards.ttft_s * 1e3, 1) if cards is not None else "-")
        if show_cost:
            line.append(_fmt(row.total_cost_per_mtok, 3))
        if show_energy:
            line.append(_fmt(row.joules_per_token, 3))
        line += [row.bound, "yes" if row.fits else f"no (max {row.max_batch})"]
        if targets.any:
            reason = why_not(row, targets)
            line.append("yes" if not reason else "no: " + reason)
        body.append(line)
    return tabulate(body, headers=headers, disable_numparse=True)


def has_energy(rows: Sequence[Row]) -> bool:
    """Whether any simulated row has energy figures (its hardware card has power facts)."""
    return any(r.ok and not math.isnan(r.joules_per_token) for r in rows)


def choice_axes(spec: SweepSpec) -> list[int]:
    """Deployment axes that the layout and batch columns do not show (overlap, MoE communication, ...)."""
    return [i for i, a in enumerate(spec.axes) if a.is_deployment and a.path not in SEARCHED_FIELDS]


def best_table(spec: SweepSpec, bests: Sequence[Best], axes: Sequence[int], show_prefill: bool,
               show_cost: bool) -> str:
    extra = choice_axes(spec)
    headers = [spec.axes[i].label for i in axes] + ["GPUs", "layout"] + [spec.axes[i].label for i in extra] + [
        "batch", "TPOT ms", "TGS"]
    if show_prefill:
        headers.append("TTFT ms")
    if show_cost:
        headers.append("$/Mtok")
    show_energy = has_energy([b.row for b in bests if b.row is not None])
    if show_energy:
        headers.append("J/tok")
    headers += ["binding constraint", "feasible"]
    body = []
    for best in bests:
        line: list[Any] = [_value_text(v) for v in best.variant]
        row = best.row
        if row is None:
            line += ["-", "none meets the targets"] + ["-"] * (len(extra) + 3) + (["-"] if show_prefill else []) + \
                    (["-"] if show_cost else []) + (["-"] if show_energy else []) + [best.binding, f"0/{best.candidates}"]
        else:
            values = spec.values(row.point)
            line += [row.num_gpus, layout_text(row)] + [_value_text(values[i]) for i in extra] + [
                row.batch, _fmt(row.tpot_s * 1e3), _fmt(row.tgs, 0)]
            if show_prefill:
                line.append(_fmt(row.ttft_s * 1e3, 1))
            if show_cost:
                line.append(_fmt(row.total_cost_per_mtok, 3))
            if show_energy:
                line.append(_fmt(row.joules_per_token, 3))
            line += [best.binding, f"{best.feasible}/{best.candidates}"]
        body.append(line)
    return tabulate(body, headers=headers, disable_numparse=True)


def cost_legend(spec: SweepSpec, rows: Sequence[Row]) -> str:
    """What the tables' $/Mtok counts: the decode step's GPU-hours at the price used, plus its energy
    at the run's electricity price and PUE where the hardware card has power facts (as the main
    report's cost line), or the GPU-hours alone, said so, where it has none."""
    paths = {a.path for a in spec.axes}
    if spec.price_per_gpu_hour is not None:
        price = f"${spec.price_per_gpu_hour:g}/GPU-hour (--price-per-gpu-hour)"
    elif "hardware" in paths:
        price = "each card's usd_per_gpu_hour"
    else:
        price = f"${spec.base.config.hardware.usd_per_gpu_hour:g}/GPU-hour"
    electricity = spec.base.config.electricity
    if any(p.startswith("energy.") for p in paths):
        energy = "energy at each row's electricity price and PUE"
    else:
        pue = f"PUE {electricity.pue:g}" + (" (GPU boards only)" if electricity.pue == 1 else "")
        energy = f"energy at ${electricity.usd_per_kwh:g}/kWh x {pue}"
    simulated = [r for r in rows if r.ok]
    with_energy = sum(r.cost_includes_energy for r in simulated)
    head = "$/Mtok: USD per million output tokens of the decode step: GPU-hours at " + price
    if simulated and with_energy == len(simulated):
        return f"{head} + {energy}"
    if with_energy:
        return (f"{head} + {energy}; GPU-hours alone on hardware without power facts (the rows without J/tok; "
                "docs/energy.md)")
    names = sorted({str(spec.values(r.point)[i]) for r in simulated for i, a in enumerate(spec.axes)
                    if a.path == "hardware"}) or [spec.base.config.hardware.name]
    return f"{head} alone: hardware card {', '.join(names)} has no power facts, so no energy (docs/energy.md)"


def deployment_words(spec: SweepSpec, choice: Choice) -> str:
    """A chosen point in words: GPU x count, nodes, layout, batch (and the other variant values)."""
    row = choice.row
    assert row is not None
    names = {spec.axes[i].path: v for i, v in zip(variant_axes(spec), choice.variant)}
    hardware = names.pop("hardware", spec.base.config.hardware.name)
    rest = ", ".join(f"{path.split('.')[-1] if '.' in path else path}={_value_text(v)}" for path, v in names.items())
    nodes = f" on {row.num_nodes} nodes" if row.num_nodes > 1 else ""
    return (f"{hardware} x {row.num_gpus}{nodes}, {layout_text(row)}, batch {row.batch}"
            + (f" ({rest})" if rest else ""))


def answer_line(spec: SweepSpec, best: Choice, targets: Targets) -> str:
    """The search's answer in one line: the cheapest point meeting the targets, and its cost."""
    row = best.row
    assert row is not None
    goal = (f"cheapest meeting {targets.describe()}" if targets.any else
            "cheapest of all (no speed target; --target-user-tps or --target-tpot-ms sets one)")
    return (f"answer: {goal}: {deployment_words(spec, best)}: ${row.total_cost_per_mtok:.3f}/M output tokens "
            f"({row.user_tps:,.1f} tok/s/user, TPOT {row.tpot_s * 1e3:,.2f} ms, {row.tgs:,.0f} tokens/GPU/s)")


def choices_text(spec: SweepSpec, choices: Sequence[Choice], targets: Targets) -> list[str]:
    """The cheapest point of each variant, cheapest first; then the variants with none, and why."""
    axes = variant_axes(spec)
    what = ", ".join(spec.axes[i].label for i in axes) or "run"
    found = sorted((c for c in choices if c.row is not None), key=lambda c: c.row.total_cost_per_mtok)  # type: ignore[union-attr]
    body = [[_value_text(v) for v in c.variant] + [c.row.num_gpus, c.row.num_nodes, layout_text(c.row), c.row.batch,
                                                   _fmt(c.row.user_tps, 1), _fmt(c.row.total_cost_per_mtok, 3),
                                                   _fmt(c.row.tpot_s * 1e3)]
            for c in found if c.row is not None]
    headers = [spec.axes[i].label for i in axes] + ["GPUs", "nodes", "layout", "batch", "tok/s/user", "$/Mtok",
                                                    "TPOT ms"]
    goal = f"meeting {targets.describe()}" if targets.any else "no target"
    lines = [f"CHEAPEST POINT PER {what.upper()} ({goal}; USD per million output tokens)"]
    if body:
        lines.append(tabulate(body, headers=headers, disable_numparse=True))
    lines += [f"no feasible point: {', '.join(_value_text(v) for v in c.variant) or 'the run'}: {c.reason}"
              for c in choices if c.row is None]
    return lines


def frontier_table(spec: SweepSpec, frontier: Sequence[Row], show_prefill: bool, objective: str = "cost",
                   on_cards: Mapping[tuple[int, ...], Row] | None = None) -> str:
    """The frontier's rows; `objective` energy puts J per output token beside speed (the frontier's
    axis), cost puts $/Mtok there; the other follows when the rows have it. `on_cards`: as for
    rows_table, the TPOT (and TTFT) of each row without the run's calibration profile beside its own."""
    extra = choice_axes(spec)
    energy = has_energy(frontier)
    first = ["$/Mtok"] + (["J/tok"] if energy else []) if objective == "cost" else ["J/tok", "W/GPU", "$/Mtok"]
    beside = ["on the cards"] if on_cards is not None else []
    headers = ["tok/s/user", *first, "TPOT ms", *beside] + (["TTFT ms", *beside] if show_prefill else []) + [
        "GPUs", "nodes", "layout"] + [spec.axes[i].label for i in extra] + ["batch", "TGS", "bound"]
    body = []
    for row in frontier:
        if objective == "cost":
            values = [_fmt(row.total_cost_per_mtok, 3)] + ([_fmt(row.joules_per_token, 3)] if energy else [])
        else:
            values = [_fmt(row.joules_per_token, 3), _fmt(row.watts_per_gpu, 0), _fmt(row.total_cost_per_mtok, 3)]
        cards = _on_cards(on_cards, row) if on_cards is not None else None
        line = [_fmt(row.user_tps, 1), *values, _fmt(row.tpot_s * 1e3)]
        if on_cards is not None:
            line.append(_fmt(cards.tpot_s * 1e3) if cards is not None else "-")
        if show_prefill:
            line.append(_fmt(row.ttft_s * 1e3, 1))
            if on_cards is not None:
                line.append(_fmt(cards.ttft_s * 1e3, 1) if cards is not None else "-")
        values = spec.values(row.point)
        line += [row.num_gpus, row.num_nodes, layout_text(row)] + [_value_text(values[i]) for i in extra] + [
            row.batch, _fmt(row.tgs, 0), row.bound]
        body.append(line)
    return tabulate(body, headers=headers, disable_numparse=True)


# ---------------------------------------------------------------------------------------------
# Files


def write_output(path: str, records: Iterable[dict[str, Any]], meta: dict[str, Any]) -> int:
    """Write records by the file's extension: .csv (one row per record; the columns are the first
    record's) and .json (meta, then the records under "rows") one at a time as they are made, so a
    sweep's rows are not held twice; .parquet (needs pyarrow) all at once. Returns the records written."""
    check_output_path(path)
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return _write_json(path, records, meta)
    if suffix == ".csv":
        return _write_csv(path, records)
    return _write_parquet(path, records)


def _write_json(path: str, records: Iterable[dict[str, Any]], meta: dict[str, Any]) -> int:
    count = 0
    with open(path, "w") as handle:
        head = json.dumps({**meta, "rows": []}, indent=1, default=str, allow_nan=False)
        handle.write(head[:head.rindex("[") + 1])
        for rec in records:
            handle.write(("," if count else "") + "\n  " + json.dumps(rec, default=str, allow_nan=False))
            count += 1
        handle.write(("\n " if count else "") + "]\n}\n")
    return count


def _write_csv(path: str, records: Iterable[dict[str, Any]]) -> int:
    count = 0
    with open(path, "w", newline="") as handle:
        writer = None
        for rec in records:
            if writer is None:
                writer = csv.DictWriter(handle, fieldnames=list(rec))
                writer.writeheader()
            writer.writerow({k: ("" if v is None else v) for k, v in rec.items()})
            count += 1
    return count


def _write_parquet(path: str, records: Iterable[dict[str, Any]]) -> int:
    """Parquet takes its column types from every row at once (a column null in the first rows is
    typed by later ones), so these rows are gathered first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(records)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


# ---------------------------------------------------------------------------------------------
# Plot


def plot_frontier(path: str, curves: Sequence[tuple[str, Sequence[Row], Sequence[Row]]], title: str,
                  chosen: tuple[Row, str] | None = None, objective: str = "cost") -> None:
    """Frontier PNG: each curve is (label, all feasible rows, frontier rows); y is the cost per million
    output tokens, or with `objective` energy the decode step's J per output token; `chosen` (a row and
    its words) is marked with a star and labelled first, so its label always finds a free place."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = frontier_figure(curves, title, chosen, plt, objective)
    fig.savefig(path)
    plt.close(fig)


def frontier_figure(curves: Sequence[tuple[str, Sequence[Row], Sequence[Row]]], title: str,
                    chosen: tuple[Row, str] | None, plt: Any, objective: str = "cost") -> Any:
    """The frontier picture (see plot_frontier) as a matplotlib figure."""
    y_of = (lambda r: r.joules_per_token) if objective == "energy" else (lambda r: r.total_cost_per_mtok)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels: list[tuple[float, float, str, str]] = []
    frontier_points: list[tuple[float, float]] = []
    for k, (label, points, frontier) in enumerate(curves):
        color = colors[k % len(colors)]
        ax.scatter([r.user_tps for r in points], [y_of(r) for r in points], s=5, alpha=0.12, color=color,
                   linewidths=0, label="all feasible deployments" if len(curves) == 1 else None)
        ordered = sorted(frontier, key=lambda r: r.user_tps)
        fx = [r.user_tps for r in ordered]
        fy = [y_of(r) for r in ordered]
        # between two frontier points the cheapest way to reach a speed is the faster point's cost
        ax.step(fx, fy, where="pre", color=color, linewidth=1.8, label=label or "Pareto frontier")
        ax.scatter(fx, fy, s=18, color=color, zorder=3)
        # label a few frontier points (GPUs, batch per GPU), spread along the curve
        marks = 5 if len(curves) == 1 else 3
        picks = sorted({round(i * (len(ordered) - 1) / max(marks - 1, 1)) for i in range(marks)}) if ordered else []
        labels.extend((ordered[i].user_tps, y_of(ordered[i]),
                       f"{ordered[i].num_gpus} GPU, batch {ordered[i].batch}", color) for i in picks
                      if chosen is None or ordered[i] is not chosen[0])
        frontier_points += list(zip(fx, fy))
    if chosen is not None:
        row, words = chosen
        ax.scatter([row.user_tps], [y_of(row)], s=160, marker="*", color="gold", edgecolors="black",
                   linewidths=0.8, zorder=4, label="the answer (star)")
        labels.insert(0, (row.user_tps, y_of(row), _wrapped(words, 48), "black"))
    ax.set_xlabel("output speed per request (tokens/s per user = 1 / TPOT)")
    ax.set_ylabel("energy (J per output token, decode step)" if objective == "energy" else
                  "cost (USD per million output tokens)")
    ax.set_yscale("log")
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from infersim.plot.common import place_point_labels, plain_log_ticks, plain_number

    for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        axis.set_major_locator(FixedLocator(plain_log_ticks(low, high)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))  # 20, 0.1: not 2 x 10^1
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.set_title(title, fontsize=10, wrap=False)
    legend = ax.legend(fontsize=8)
    fig.tight_layout()
    # point labels clear of each other, of the frontier points and of the legend, inside the axes;
    # one with no free place is left out (the table holds every point)
    placed = place_point_labels(ax, [(x, y, text) for x, y, text, _ in labels], fontsize=7, avoid=[legend],
                                avoid_points=frontier_points, marker_radius_px=3.5, inside=True,
                                required=1 if chosen is not None else 0, avoid_lines=ax.lines)
    for note, (_x, _y, _text, color) in zip(placed, labels):
        if note is not None:
            note.set_color(color)
    if chosen is not None and placed and placed[0] is not None:  # the answer's words stand out from the lines
        placed[0].set_bbox({"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": "0.6", "alpha": 0.9})
    return fig


def _wrapped(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))
