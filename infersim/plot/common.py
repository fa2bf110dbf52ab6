"""Small helpers shared by the figures: reading numbers from result JSON and placing labels."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def number(value: Any) -> float | None:
    """A finite float, or None for missing, empty, non-numeric or NaN values (CSV cells are text)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def first_number(record: Mapping[str, Any], keys: Sequence[str]) -> float | None:
    """The first of `keys` that holds a number (result files of different tools name fields differently)."""
    for key in keys:
        x = number(record.get(key))
        if x is not None:
            return x
    return None


def spread_labels(wanted: Sequence[float], min_gap: float, low: float, high: float) -> list[float]:
    """Label positions as close to `wanted` as possible, at least `min_gap` apart, within [low, high].

    Labels beside a stacked bar sit at their segments' centres unless that would make them overlap;
    then overlapping labels form a cluster centred on the mean of the positions they want (the
    least-squares placement), clusters merge until none overlap, and the whole is kept within the
    limits. Order is kept, so leader lines from segments to labels never cross.
    """
    if not wanted:
        return []
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    # each cluster: [first index into order, count, centre]
    clusters: list[list[float]] = []
    for k, i in enumerate(order):
        clusters.append([k, 1, wanted[i]])
        while len(clusters) > 1:
            a, b = clusters[-2], clusters[-1]
            a_top = a[2] + (a[1] - 1) * min_gap / 2
            b_bottom = b[2] - (b[1] - 1) * min_gap / 2
            if b_bottom - a_top >= min_gap:
                break
            members = [wanted[order[int(a[0]) + j]] for j in range(int(a[1] + b[1]))]
            # centre of n evenly spaced labels minimising squared displacement = mean of wanted offsets
            n = len(members)
            centre = sum(m - (j - (n - 1) / 2) * min_gap for j, m in enumerate(members)) / n
            clusters[-2:] = [[a[0], a[1] + b[1], centre]]
    placed: list[float] = []
    for _start, count, centre in clusters:
        placed += [centre + (j - (count - 1) / 2) * min_gap for j in range(int(count))]
    # keep within the limits, shifting neighbours along so gaps hold
    placed[0] = max(placed[0], low)
    for k in range(1, len(placed)):
        placed[k] = max(placed[k], placed[k - 1] + min_gap)
    if placed[-1] > high:
        placed[-1] = high
        for k in range(len(placed) - 2, -1, -1):
            placed[k] = min(placed[k], placed[k + 1] - min_gap)
    out = [0.0] * len(wanted)
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out


def si_format(value: float, unit: str = "") -> str:
    """1.48e14 -> '148 T' + unit: ceilings and intensities read better with SI prefixes."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def plain_log_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Ticks for a log axis from low to high, to be written as plain numbers: 1-2-5 steps per
    decade (1-2-3-5, or every digit, on a short axis; decades only on a long one), at most `most`."""
    def ticks(mantissas: tuple[int, ...]) -> list[float]:
        return [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                for m in mantissas if low <= m * 10.0 ** e <= high]

    for mantissas in ((1, 2, 5), (1, 2, 3, 5), tuple(range(1, 10))):
        chosen = ticks(mantissas)
        if len(chosen) >= 3:
            break
    if len(chosen) > most:
        decades = ticks((1,))
        chosen = decades if len(decades) >= 2 else chosen[::math.ceil(len(chosen) / most)]
    return chosen


def plain_number(value: float) -> str:
    """A tick value as a person writes it: 2,000 (not 2 x 10^3), 0.5."""
    return f"{value:,.0f}" if value >= 10 else f"{value:g}"


#: where a point's label may go, in points from the point: (dx, dy, horizontal alignment), tried in order
LABEL_OFFSETS = ((6, 5, "left"), (6, -13, "left"), (-6, 5, "right"), (-6, -13, "right"), (0, 9, "center"),
                 (0, -18, "center"), (12, 16, "left"), (12, -24, "left"), (-12, 16, "right"), (-12, -24, "right"),
                 (0, 24, "center"), (0, -32, "center"), (24, 30, "left"), (24, -40, "left"), (-24, 30, "right"),
                 (-24, -40, "right"), (0, 44, "center"), (0, -52, "center"))
#: the first offsets of LABEL_OFFSETS, close enough to read as their point's label
NEAR_OFFSETS = 12


def place_point_labels(ax: Any, labels: Sequence[tuple[float, float, str]], fontsize: float = 7.5,
                       avoid: Sequence[Any] = (), marker_radius_px: float = 5.0,
                       avoid_points: Sequence[tuple[float, float]] = (), inside: bool = False,
                       required: int = 0, avoid_lines: Sequence[Any] = ()) -> list[Any]:
    """Annotate points so that labels do not cover each other, the points, or the `avoid` artists.

    Greedy: each label (in the given order, most important first) takes the first offset around its
    point whose box overlaps no label placed before it (and with `inside`, lies within the axes,
    so no label is cut off), preferring one that crosses none of `avoid_lines` (Line2D). A label
    with no such place is left out (None in the returned list, which follows `labels`), except the
    first `required` ones, which take the first place inside.
    """
    figure = ax.figure
    renderer = figure.canvas.get_renderer()
    from matplotlib.transforms import Bbox

    taken = [artist.get_window_extent(renderer) for artist in avoid]
    for x, y in [(x, y) for x, y, _ in labels] + list(avoid_points):
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_extents(px - marker_radius_px, py - marker_radius_px,
                                       px + marker_radius_px, py + marker_radius_px))
    frame = ax.get_window_extent(renderer)
    segments = _line_segments(avoid_lines)

    def free(box: Any) -> bool:
        inside_ok = not inside or (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and
                                   box.y1 <= frame.y1)
        return inside_ok and not any(box.overlaps(other) for other in taken)

    placed: list[Any] = []
    for index, (x, y, text) in enumerate(labels):
        found = _first_place(ax, x, y, text, fontsize, renderer, free, segments)
        if found is None and index < required:
            found = _first_place(ax, x, y, text, fontsize, renderer, lambda box: True, [])
        if found is None:
            placed.append(None)
            continue
        taken.append(found[1])
        placed.append(found[0])
    return placed


def _first_place(ax: Any, x: float, y: float, text: str, fontsize: float, renderer: Any, free: Any,
                 segments: Sequence[tuple[float, float, float, float]]) -> tuple[Any, Any] | None:
    """(annotation, its box) at the first offset that is free and crosses no segment, else the first
    free one; None when no offset is free."""
    free_places = []
    for index, (dx, dy, align) in enumerate(LABEL_OFFSETS):
        note = ax.annotate(text, xy=(x, y), xytext=(dx, dy), textcoords="offset points", ha=align, fontsize=fontsize)
        box = note.get_window_extent(renderer).expanded(1.04, 1.1)
        note.remove()
        if free(box):
            clear = not any(_crosses(box, seg) for seg in segments)
            # near the point and off every line first, then near across a line, then further off
            rank = (index >= NEAR_OFFSETS, not clear, index)
            free_places.append((rank, dx, dy, align, box))
    if not free_places:
        return None
    _rank, dx, dy, align, box = min(free_places, key=lambda place: place[0])
    return ax.annotate(text, xy=(x, y), xytext=(dx, dy), textcoords="offset points", ha=align, fontsize=fontsize), box


def _line_segments(lines: Sequence[Any]) -> list[tuple[float, float, float, float]]:
    """The display-space segments of lines (Line2D), to keep labels off them."""
    import numpy as np
    from matplotlib.cbook import STEP_LOOKUP_MAP

    out = []
    for line in lines:
        x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        step = STEP_LOOKUP_MAP.get(line.get_drawstyle())
        if step is not None and line.get_drawstyle() != "default" and len(x) > 1:
            x, y = step(x, y)  # the corners a step line is drawn through
        xy = line.get_transform().transform(np.column_stack([x, y]))
        out += [(x0, y0, x1, y1) for (x0, y0), (x1, y1) in zip(xy[:-1], xy[1:])]
    return out


def _crosses(box: Any, seg: tuple[float, float, float, float]) -> bool:
    """Whether a segment passes through a box (clipped to it: Liang-Barsky)."""
    x0, y0, x1, y1 = seg
    dx, dy = x1 - x0, y1 - y0
    low, high = 0.0, 1.0
    for p, q in ((-dx, x0 - box.x0), (dx, box.x1 - x0), (-dy, y0 - box.y0), (dy, box.y1 - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low > high:
            return False
    return True
