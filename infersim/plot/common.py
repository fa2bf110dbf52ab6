"""Small helpers shared by the figures: reading numbers from result JSON and placing labels."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from infersim.base.errors import InferSimError


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


def require_list(data: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise InferSimError(f"{what}: expected a non-empty list under '{key}'")
    return value


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
    for start, count, centre in clusters:
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
                 (0, 24, "center"), (0, -32, "center"))


def place_point_labels(ax: Any, labels: Sequence[tuple[float, float, str]], fontsize: float = 7.5,
                       avoid: Sequence[Any] = (), marker_radius_px: float = 5.0,
                       avoid_points: Sequence[tuple[float, float]] = (), inside: bool = False) -> list[Any]:
    """Annotate points so that labels do not cover each other, the points, or the `avoid` artists.

    Greedy: each label (in the given order, most important first) takes the first offset around its
    point whose box overlaps no label placed before it (and with `inside`, lies within the axes,
    so no label is cut off); when every offset collides, the first that fits inside is used.
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

    def within(box: Any) -> bool:
        return not inside or (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)

    placed = []
    for x, y, text in labels:
        chosen = None
        fallback = None
        for dx, dy, align in LABEL_OFFSETS:
            note = ax.annotate(text, xy=(x, y), xytext=(dx, dy), textcoords="offset points", ha=align,
                               fontsize=fontsize)
            box = note.get_window_extent(renderer).expanded(1.04, 1.1)
            if within(box) and not any(box.overlaps(other) for other in taken):
                chosen = (note, box)
                break
            if fallback is None and within(box):
                fallback = (dx, dy, align)
            note.remove()
        if chosen is None:
            dx, dy, align = fallback or LABEL_OFFSETS[0]
            note = ax.annotate(text, xy=(x, y), xytext=(dx, dy), textcoords="offset points", ha=align,
                               fontsize=fontsize)
            chosen = (note, note.get_window_extent(renderer))
        taken.append(chosen[1])
        placed.append(chosen[0])
    return placed
