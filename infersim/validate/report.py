"""Validation results as readable text and as JSON-ready data."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from infersim.run.confidence import GRADES
from infersim.validate.evaluate import WITHIN, Comparison, Stats, Validation


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def _stats_data(stats: Stats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {"n": stats.n, "median_abs_error_pct": 100 * stats.median_abs_error,
            "mean_abs_error_pct": 100 * stats.mean_abs_error, "signed_mean_error_pct": 100 * stats.signed_mean_error,
            f"within_{round(100 * WITHIN)}pct_share_pct": 100 * stats.within_share}


def _point_data(c: Comparison) -> dict[str, Any]:
    return {"id": c.id, "source": c.source, "kind": c.kind, "measured": c.measured, "predicted": c.predicted,
            "error_pct": 100 * c.error, "unit": c.unit, "dominant_module": c.dominant_module,
            "dominant_detail": c.dominant_detail, "grade": c.grade or None, "note": c.note,
            "accepted_outlier": c.accepted_outlier or None}


def _summary_data(result: Validation) -> dict[str, Any]:
    stats = result.stats()
    return {
        "overall": _stats_data(stats["overall"]),
        "energy": _stats_data(stats["energy"]),
        "memory": _stats_data(stats["memory"]),
        "by_source": {k: _stats_data(v) for k, v in stats["by_source"].items()},
        "by_kind": {k: _stats_data(v) for k, v in stats["by_kind"].items()},
        "by_grade": {k: _stats_data(v) for k, v in stats["by_grade"].items()},
        "by_serving_metric": {k: _stats_data(v) for k, v in stats["by_metric"].items()},
    }


def to_json_data(result: Validation, on_cards: Validation | None = None) -> dict[str, Any]:
    """The report as data; `on_cards`: the same points without the calibration profile, whose
    statistics go beside the calibrated ones (summary_on_the_cards)."""
    out = _json_data(result)
    if on_cards is not None:
        out["summary_on_the_cards"] = _summary_data(on_cards)
    return out


def _json_data(result: Validation) -> dict[str, Any]:
    return {
        "reference": result.reference,
        "points_file": result.points_file,
        "mfu_tables": result.mfu_tables,
        "points": [_point_data(c) for c in result.comparisons],
        "summary": _summary_data(result),
        "not_expressed": [{"id": n.id, "source": n.source, "kind": n.kind, "reason": n.reason}
                          for n in result.not_expressed],
        "excluded": [{"id": c.id, "source": c.source, "error_pct": 100 * c.error, "reason": c.accepted_outlier}
                     for c in result.comparisons if c.accepted_outlier],
    }


def _metric_order(item: tuple[str, Any]) -> tuple[int, str]:
    """TTFT, ITL, E2E (as the serving benchmarks list them), then anything else by name."""
    order = ("ttft", "itl", "tpot", "e2e")
    head = item[0].split("_")[0]
    return (order.index(head) if head in order else len(order), item[0])


def _stats_row(name: str, stats: Stats | None, beside: tuple[str, ...] | list[str] = ()) -> list[str]:
    """A group's statistics, then `beside` (its statistics on the cards, under a profile)."""
    if stats is None:
        return [name, "0", "-", "-", "-", "-", *beside]
    return [name, str(stats.n), f"{100 * stats.median_abs_error:.1f}%", f"{100 * stats.mean_abs_error:.1f}%",
            f"{100 * stats.signed_mean_error:+.1f}%", f"{100 * stats.within_share:.0f}%", *beside]


def to_text(result: Validation, summary_only: bool = False, on_cards: Validation | None = None) -> str:
    """The report: every point compared, the statistics, notes and the points not expressed; with
    `summary_only`, the statistics alone (what `infersim validate --summary` prints); `on_cards`: the
    same points without the calibration profile, whose statistics stand beside the calibrated ones."""
    lines = [f"reference: {result.reference}", f"points:    {result.points_file}",
             f"kernel tables: {result.mfu_tables}", ""]
    if summary_only:
        pass
    elif result.comparisons:
        rows = [[c.id + (" [excluded]" if c.accepted_outlier else ""), c.kind, _number(c.measured),
                 _number(c.predicted), f"{100 * c.error:+.1f}%", c.unit, c.grade or "-",
                 c.dominant_module + (f" ({c.dominant_detail})" if c.dominant_detail else "")]
                for c in result.comparisons]
        lines.append(tabulate(rows, headers=["point", "kind", "measured", "predicted", "error", "unit", "grade",
                                             "dominant module"], disable_numparse=True))
    else:
        lines.append("no point compared")
    stats = result.stats()
    cards_stats = on_cards.stats() if on_cards is not None else None

    def beside(group: str, key: str | None = None) -> list[str]:
        """The group's median |error| and share within on the cards (none without a profile)."""
        if cards_stats is None:
            return []
        found = cards_stats[group] if key is None else cards_stats[group].get(key)
        return ["-", "-"] if found is None else [f"{100 * found.median_abs_error:.1f}%",
                                                 f"{100 * found.within_share:.0f}%"]

    rows = [_stats_row("overall", stats["overall"], beside("overall"))]
    for apart in _APART_WHAT:  # quantities of their own: kept out of the overall of times
        if stats[apart] is not None:
            rows.append(_stats_row(f"overall {apart}", stats[apart], beside(apart)))
    rows += [_stats_row(f"source {k}", v, beside("by_source", k)) for k, v in sorted(stats["by_source"].items())]
    rows += [_stats_row(f"kind {k}", v, beside("by_kind", k)) for k, v in sorted(stats["by_kind"].items())]
    order = {g: i for i, g in enumerate(GRADES)}
    rows += [_stats_row(f"grade {k}", v, beside("by_grade", k))
             for k, v in sorted(stats["by_grade"].items(), key=lambda kv: order.get(kv[0], 9))]
    rows += [_stats_row(f"serving {k}", v, beside("by_metric", k))
             for k, v in sorted(stats["by_metric"].items(), key=_metric_order)]
    overall = stats["overall"]
    excluded = [c for c in result.comparisons if c.accepted_outlier]
    if overall is not None:
        lines += ["" if not summary_only else None, f"overall: {overall.n} numbers compared, median |error| {100 * overall.median_abs_error:.1f}%, "
                      f"mean |error| {100 * overall.mean_abs_error:.1f}%, within {round(100 * WITHIN)}%: "
                      f"{100 * overall.within_share:.0f}%; {len(result.not_expressed)} points not expressed"
                      + (f"; {len(excluded)} accepted outlier{'s' if len(excluded) > 1 else ''} excluded" if excluded
                         else "")]
    lines += _apart_lines(stats)
    headers = ["group", "n", "median |err|", "mean |err|", "signed mean", f"within {round(100 * WITHIN)}%"]
    if cards_stats is not None:
        headers += ["median on the cards", f"within {round(100 * WITHIN)}% on the cards"]
    lines += ["", "SUMMARY (error = (predicted - measured) / measured"
              + ("; calibrated, and on the cards without the profile" if cards_stats is not None else "") + ")",
              tabulate(rows, headers=headers, disable_numparse=True)]
    if summary_only:
        lines += ["", "grade: how each prediction was priced (measured tables of its GPU and engine; tables of another "
                      "engine or GPU, transferred; roofline with the card's efficiencies), by the share of its time",
                  "each point, its notes and the points not expressed: infersim validate (without --summary); "
                  "sources: the `sources:` block of the reference file"]
        return "\n".join(line for line in lines if line is not None)
    notes: dict[tuple[str, str], str] = {}  # a note all sub-metrics of a point share is listed once, by the point
    for c in result.comparisons:
        if c.note and c.kind not in ("kernel_gemm", "kernel_grouped_gemm", "deepep"):
            notes[(c.point_id, c.note)] = c.point_id if (c.point_id, c.note) in notes else c.id
    if notes:
        lines += ["", "NOTES", *_notes_lines([(shown, note) for (_, note), shown in notes.items()])]
    if excluded:
        lines += ["", f"EXCLUDED FROM THE STATISTICS: accepted outliers of their own runs ({len(excluded)})"]
        lines += [f"  {c.id} [{c.source}] {100 * c.error:+.1f}%: {c.accepted_outlier}" for c in excluded]
    if result.not_expressed:
        lines += ["", f"NOT EXPRESSED ({len(result.not_expressed)})"]
        lines += [f"  {n.id} [{n.source}]: {n.reason}" for n in result.not_expressed]
    return "\n".join(lines)


#: what each quantity kept apart from the times compares
_APART_WHAT = {"energy": "J per output token, W per GPU", "memory": "the KV pool a server reports at start, tokens"}


def _apart_lines(stats: dict[str, Any]) -> list[str]:
    """A line for each quantity kept out of the overall of times (energy, memory) that has points."""
    lines = []
    for apart, what in _APART_WHAT.items():
        found = stats[apart]
        if found is not None:
            lines.append(f"{apart}: {found.n} numbers compared ({what}), median |error| "
                         f"{100 * found.median_abs_error:.1f}%, mean |error| {100 * found.mean_abs_error:.1f}%, "
                         f"within {round(100 * WITHIN)}%: {100 * found.within_share:.0f}%; not in the overall above")
    return lines


def _notes_lines(notes: list[tuple[str, str]]) -> list[str]:
    """One line per noted point; the parts ("; "-separated) that every one of three or more notes
    holds are said once, first, and left out of each (a run's stages repeat its workload's notes)."""
    parts = [note.split("; ") for _, note in notes]
    shared = [p for p in parts[0] if all(p in other for other in parts[1:])] if len(notes) >= 3 else []
    if not shared:
        return [f"  {shown}: {note}" for shown, note in notes]
    lines = [f"  shared by all {len(notes)} noted points: " + "; ".join(shared)]
    for (shown, _), own in zip(notes, parts):
        rest = [p for p in own if p not in shared]
        if rest:
            lines.append(f"  {shown}: " + "; ".join(rest))
    return lines

