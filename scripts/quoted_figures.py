"""Figures the pages quote in their prose, held to what the commands print.

scripts/quoted_figures.yaml lists each quote (its page, its words with a format field for each
number, the command whose output holds the numbers and where in it). A quote's command must be one
that a checked `console` block of the pages runs, so the figure comes from a command the docs tests
run. `problems()` names every quote that its page no longer holds or whose numbers differ from the
output; `rewritten()` gives a page with each drifted number replaced (scripts/refresh_readme_example.py
writes it).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "scripts" / "quoted_figures.yaml"
#: a number as the pages write it: a sign, digits with thousands commas, a decimal part
NUMBER = r"([-+]?\d[\d,]*(?:\.\d+)?)"


@dataclass(frozen=True)
class Quote:
    page: str
    quote: str
    command: str
    find: tuple[str, ...]
    after: tuple[str | None, ...]
    sources: tuple[str, ...]  # the command of each number
    scale: tuple[float, ...]

    @property
    def where(self) -> str:
        return f"{self.page}: \"{self.quote}\""


def load(path: Path = FIGURES) -> list[Quote]:
    quotes = []
    for entry in yaml.safe_load(path.read_text()):
        find = tuple(entry["find"])
        count = len(find)
        quotes.append(Quote(entry["page"], entry["quote"], entry["command"], find,
                            tuple(entry.get("after") or [None] * count),
                            tuple(entry.get("from") or [entry["command"]] * count),
                            tuple(float(s) for s in entry.get("scale") or [1.0] * count)))
    return quotes


def fields(quote: str) -> list[str]:
    """The format specs of a quote's fields, in order ('{0:+.1f}' -> '+.1f')."""
    return [spec or "" for _literal, name, spec, _conv in string.Formatter().parse(quote) if name is not None]


def pattern(quote: str) -> re.Pattern[str]:
    """The quote as a regular expression over a page whose whitespace is collapsed: literal words,
    a number for each field."""
    parts = []
    for literal, name, _spec, _conv in string.Formatter().parse(quote):
        parts.append(re.escape(literal).replace(r"\ ", " "))
        if name is not None:
            parts.append(NUMBER)
    return re.compile("".join(parts))


def number_in(output: str, find: str, after: str | None) -> float | None:
    lines = output.splitlines()
    if after is not None:
        start = next((i for i, line in enumerate(lines) if re.search(after, line)), None)
        if start is None:
            return None
        lines = lines[start + 1:]
    for line in lines:
        match = re.search(find, line)
        if match:
            return float(match.group(1).replace(",", "").rstrip("%"))
    return None


def expected(quote: Quote, output_of: Callable[[str], str]) -> tuple[list[str] | None, str]:
    """The numbers the quote should hold, formatted as it writes them; or None and why not."""
    out = []
    for find, after, source, scale, spec in zip(quote.find, quote.after, quote.sources, quote.scale,
                                                fields(quote.quote)):
        value = number_in(output_of(source), find, after)
        if value is None:
            return None, f"the output of `{source}` has no line matching {find!r}"
        out.append(format(value * scale, spec))
    return out, ""


def _collapsed(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def problems(output_of: Callable[[str], str], checked_commands: set[str],
             read: Callable[[str], str] = lambda page: (REPO / page).read_text(),
             quotes: list[Quote] | None = None) -> list[str]:
    """Every quote (of `quotes`, default all) whose command no checked block runs, that its page
    does not hold, or whose numbers differ from what the command prints now."""
    found = []
    for quote in load() if quotes is None else quotes:
        missing = [c for c in {quote.command, *quote.sources} if c not in checked_commands]
        if missing:
            found.append(f"{quote.where}: `{missing[0]}` is run by no checked console block")
            continue
        numbers, why = expected(quote, output_of)
        if numbers is None:
            found.append(f"{quote.where}: {why}")
            continue
        match = pattern(quote.quote).search(_collapsed(read(quote.page)))
        if match is None:
            found.append(f"{quote.where}: the page no longer has these words")
        elif list(match.groups()) != numbers:
            found.append(f"{quote.where}: the page says {', '.join(match.groups())}, the command prints "
                         f"{', '.join(numbers)}")
    return found


def rewritten(page: str, text: str, output_of: Callable[[str], str]) -> str:
    """The page with the numbers of its quotes replaced by what the commands print now (the words
    and line breaks as they were)."""
    for quote in [q for q in load() if q.page == page]:
        numbers, _why = expected(quote, output_of)
        if numbers is None:
            continue
        words = pattern(quote.quote).pattern.replace(" ", r"\s+")
        match = re.search(words, text)
        if match is None:
            continue
        for index in range(len(numbers), 0, -1):  # from the last: earlier spans stay where they are
            text = text[:match.start(index)] + numbers[index - 1] + text[match.end(index):]
    return text
