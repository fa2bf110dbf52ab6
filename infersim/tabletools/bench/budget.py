"""Time budgets for a measuring run made of parts run one after the other in order of value (kernel
families, models, traces), and the summary file that says what each part did.

Each part has a budget (its estimated time, or what is left of the total). `fit_budgets` keeps the order:
when the budgets add up to more than the total, the last parts get less or nothing (they are skipped, not
the first ones). `part_deadlines` ends each part at the latest time that still leaves every later part
its whole budget: time an early part does not use passes on to the next, and a part that would run over
is cut at its deadline without taking time from the parts after it.

`StageSummary` is the JSON file a run rewrites (atomically) as its parts start and end, so that whoever
started it can say what ran, what was cut or skipped and why, with timings, even after a kill.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from infersim.base.plaindata import JsonError, loads_json

SUMMARY_FORMAT = "infersim-gpu-stage-summary-1"

#: the states of a part, in a summary: complete (every item done), cut (items left out for time, some done),
#: skipped (none done: no time, or nothing to do), partial (items failed, some done), failed (every item failed),
#: stopped (a signal ended the run while it ran)
PART_STATES = ("not started", "running", "complete", "cut", "skipped", "partial", "failed", "stopped")
#: how a tool words an item left out for time (the rest of `not_done` failed)
SKIPPED_PREFIX = "skipped"


def fit_budgets(budgets: Sequence[tuple[str, float]], total: float) -> list[tuple[str, float]]:
    """The budgets in order, each at most what the earlier ones leave of `total` (the last parts are the
    ones shortened or given nothing)."""
    left = max(total, 0.0)
    fitted = []
    for name, seconds in budgets:
        take = min(max(seconds, 0.0), left)
        fitted.append((name, take))
        left -= take
    return fitted


def part_deadlines(budgets: Sequence[tuple[str, float]], total: float) -> dict[str, float]:
    """Seconds after the start by which each part must end: `total` less the budgets of the parts after
    it (after `fit_budgets`, so the deadlines never go backwards and the last part ends at `total`)."""
    fitted = fit_budgets(budgets, total)
    later = sum(seconds for _name, seconds in fitted)
    ends: dict[str, float] = {}
    for name, seconds in fitted:
        later -= seconds
        ends[name] = max(total - later, 0.0)
    return ends


@dataclass
class PartRecord:
    """One part of a run: its plan, budget and estimate, and what became of it."""

    name: str
    planned: int
    estimate_s: float
    budget_s: float | None = None  # None: no budget
    deadline_s: float | None = None  # seconds after the run's start; None: no deadline
    estimate_source: str = ""
    status: str = "not started"
    done: int = 0
    started_s: float | None = None
    seconds: float = 0.0
    not_done: list[str] = field(default_factory=list)  # "<item>: <why>" for each item skipped, cut or failed


def part_status(part: PartRecord) -> str:
    """A finished part's state from what it did (PART_STATES); items left out for time are worded
    '<item>: skipped ...', the others failed."""
    skipped = sum(1 for item in part.not_done if item.split(": ", 1)[-1].startswith(SKIPPED_PREFIX))
    failed = len(part.not_done) - skipped
    if not part.not_done:
        return "complete"
    if skipped:
        return "cut" if part.done else "skipped"
    return "partial" if part.done else ("failed" if failed else "skipped")


class StageSummary:
    """The summary of one tool's run (module docstring); `path` None keeps it in memory only."""

    def __init__(self, path: Path | None, tool: str, budget_s: float | None, parts: Sequence[PartRecord],
                 clock: Callable[[], float] = time.monotonic, **header: Any) -> None:
        self.path = Path(path) if path else None
        self.tool = tool
        self.budget_s = budget_s
        self.parts = {part.name: part for part in parts}
        self.clock = clock
        self.start = clock()
        self.header = header
        self.stopped = ""
        self._last_write = -1e9
        self.write()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def begin(self, name: str) -> PartRecord:
        part = self.parts[name]
        part.status, part.started_s = "running", round(self.elapsed(), 3)
        self.write()
        return part

    def done_one(self, name: str) -> None:
        self.parts[name].done += 1
        if self.clock() - self._last_write > 2.0:  # often enough that a kill loses little
            self.write()

    def not_done(self, name: str, item: str, why: str) -> None:
        self.parts[name].not_done.append(f"{item}: {why}")

    def end(self, name: str, status: str) -> None:
        part = self.parts[name]
        part.status = status
        if part.started_s is not None:
            part.seconds = round(self.elapsed() - part.started_s, 3)
        self.write()

    def stop(self, why: str) -> None:
        """The whole run ended early (a signal): running parts are marked stopped."""
        self.stopped = why
        for part in self.parts.values():
            if part.status == "running":
                self.end(part.name, "stopped")
        self.write()

    def as_dict(self) -> dict[str, Any]:
        return {"format": SUMMARY_FORMAT, "tool": self.tool, **self.header, "budget_s": self.budget_s,
                "elapsed_s": round(self.elapsed(), 3), "stopped": self.stopped,
                "parts": [asdict(part) for part in self.parts.values()]}

    def write(self) -> None:
        self._last_write = self.clock()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".partial")
        temporary.write_text(json.dumps(self.as_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, self.path)  # a reader never sees half a file


def read_summary(path: Path) -> dict[str, Any] | None:
    """A summary file, or None where it is missing or unreadable (a run killed before its first write;
    or text that is not UTF-8, not JSON, nested too deep or giving a key twice: not this writer's)."""
    try:
        data = loads_json(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError, JsonError):
        return None
    return data if isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT else None
