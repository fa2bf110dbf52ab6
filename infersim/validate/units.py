"""Units of the validate points: a point's unit must name the unit its conversion predicts in,
checked before anything runs (one message naming the point, the unit and the metric)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

from infersim.base.errors import MISSING, ConfigError
from infersim.validate.mapping import ENERGY_FROM, MEMORY_FROM, PointMapping


class ReferencePoint(Protocol):
    """What the check reads of a reference point (infersim.validate.evaluate.ReferencePoint)."""

    @property
    def value(self) -> float | dict[str, float]: ...

    @property
    def unit(self) -> str: ...


#: unit families and how reference files write them
_UNIT_TEXT = (("tok/s", re.compile(r"\btok(?:en)?s?\s*/\s*s\b", re.I)),
              ("req/s", re.compile(r"\breq(?:uest)?s?\s*/\s*s\b", re.I)),
              ("TFLOPS", re.compile(r"\bTFLOP/?S\b", re.I)),
              ("GB/s", re.compile(r"\bGB\s*/\s*s\b|\bGBps\b")),
              ("J/tok", re.compile(r"\bJ\s*/\s*tok(?:en)?s?\b")),
              ("tokens", re.compile(r"(?<![/\w])tokens\b(?!\s*/)")),
              ("W", re.compile(r"(?<![/\w])W\b")),
              ("ms", re.compile(r"\bms\b")),
              ("us", re.compile(r"\bus\b|[µμ]s\b")),
              ("s", re.compile(r"(?<![/\w])s\b|\bseconds?\b")))
_STAGE_UNITS = {"prefill.tgs": "tok/s", "decode.tgs": "tok/s", "prefill.ttft_ms": "ms", "decode.tpot_ms": "ms"}
_KERNEL_UNITS = {"time_us": "us", "tflops": "TFLOPS", "gbps": "GB/s"}


def unit_families(text: str) -> set[str]:
    """The unit families a unit text names ('tok/s (per GPU)' -> {'tok/s'}; 'us, GB/s' -> {'us', 'GB/s'})."""
    return {family for family, pattern in _UNIT_TEXT if pattern.search(text)}


def predicted_unit(source: str) -> str | None:
    """The unit family a conversion's number is in (None: a serving key of no known unit)."""
    if source in _KERNEL_UNITS:
        return _KERNEL_UNITS[source]
    if source in _STAGE_UNITS:
        return _STAGE_UNITS[source]
    if source in ENERGY_FROM:
        return "W" if source.endswith("watts_per_gpu") else "J/tok"
    if source.endswith("_ms"):
        return "ms"
    if source.startswith("request_") and ("throughput" in source or "goodput" in source):
        return "req/s"
    if "throughput" in source:
        return "tok/s"
    if source == "duration":
        return "s"
    if source in MEMORY_FROM:
        return "tokens"
    return None


def check_units(reference: Mapping[str, ReferencePoint], mapping: dict[str, PointMapping], reference_path: str,
                points_file: str, wanted: set[str] = frozenset()) -> None:
    """Before anything runs: every compared number's unit (its conversion's, else its point's) must
    name the unit family its conversion predicts in, and a conversion's unit must agree with its
    point's; one message naming the point, the unit and the metric."""
    for pid, point in reference.items():
        entry = mapping.get(pid)
        if entry is None or entry.not_expressed or isinstance(point.value, dict) == ("" in entry.metrics):
            continue  # nothing to compare, or a shape mismatch evaluate names
        for key, conv in entry.metrics.items():
            if wanted and pid not in wanted and f"{pid}/{key}" not in wanted:
                continue
            expected = predicted_unit(conv.source)
            if expected is None:
                continue
            cid = f"{pid}/{key}" if key else pid
            named = unit_families(point.unit)
            if conv.unit:
                own = unit_families(conv.unit)
                if expected not in own:
                    raise ConfigError(points_file, f"{cid}.unit", conv.unit,
                                      f"'{conv.source}' predicts {expected}, not {conv.unit}")
                if named and not own & named:
                    raise ConfigError(reference_path, f"{pid}.unit", point.unit,
                                      f"the mapping compares {cid} in {conv.unit}, a unit this point does not name")
                continue
            if not named:
                raise ConfigError(reference_path, f"{pid}.unit", point.unit or MISSING,
                                  f"names no unit its prediction '{conv.source}' ({expected}) can be compared in "
                                  "(known: tok/s, req/s, TFLOPS, GB/s, J/token, W, ms, us, s, tokens)")
            if expected not in named:
                raise ConfigError(reference_path, f"{pid}.unit", point.unit,
                                  f"the point is measured in {', '.join(sorted(named))}, but its mapping's "
                                  f"'{conv.source}' predicts {expected}: the numbers cannot be compared")
