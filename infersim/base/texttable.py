"""A plain-text table in tabulate's "simple" layout (left-aligned text columns, a dashed rule under
the headers, two spaces between columns), for the main report: importing tabulate (and the
package metadata and wide-character tables it loads) costs more than the whole simulation of a
plain run. Other commands keep using tabulate. And a count with its noun (`counted`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def counted(n: int, thing: str, things: str = "") -> str:
    """`n` with its noun, singular for one: '1 request', '0 requests', '2,048 requests'; `things` is
    the plural where it is not `thing` + 's'."""
    return f"{n:,} {thing if n == 1 else things or thing + 's'}"


def simple_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c).strip() for c in row] for row in rows]
    # as tabulate: a column is at least its header plus 2 wide (its MIN_PADDING)
    widths = [max([len(h) + 2] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()

    return "\n".join([line(list(headers)), "  ".join("-" * w for w in widths)] + [line(r) for r in cells])
