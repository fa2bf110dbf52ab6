"""What a sweep's command line does not say: a field given both on the grid and by a flag or --set
(refused: the grid's value would win at every point), and what the run does that the user did not
ask for (said in notes: kernel tables dropped for a hardware axis, the MoE path of expert-TP
layouts in a layout search)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError, shorten
from infersim.base.texttable import counted
from infersim.run.request_limits import larger_cap
from infersim.run.flags import FLAG_OF_FIELD, LAYOUT_FLAG_FIELDS, RunFlags, flag_fields, flag_name
from infersim.shapes.kernels import NoTables
from infersim.sweep.evaluate import Row, SweepSpec
from infersim.sweep.falling import falling_tpot_note


#: a card named by these is the base of the fields set inside it: both may be given
CARD_FIELDS = ("model", "hardware", "engine")


def _flag_fields(flags: RunFlags) -> dict[str, str]:
    """Run-config field (dotted) -> the flag that sets it, with its value."""
    named = {field: f"{FLAG_OF_FIELD[field]} {shorten(str(value))}" for field, value in flag_fields(flags).items()}
    for attribute, field in LAYOUT_FLAG_FIELDS:
        value = getattr(flags, attribute)
        if value is not None:
            named[f"deployment.{field}"] = f"{flag_name(attribute)} {value}"
    return named


def _overlaps(field: str, axis: str) -> bool:
    """Whether setting `field` and varying `axis` name the same value (a card and a field inside it do not)."""
    if field == axis:
        return True
    if axis.startswith(field + "."):
        return field not in CARD_FIELDS
    return field.startswith(axis + ".") and axis not in CARD_FIELDS


def refuse_fields_given_twice(axes: Sequence[Any], flags: RunFlags, overrides: list[str]) -> None:
    """A field the grid varies is set at every point: a flag or --set of it (or of a section holding
    it, or a field inside it) would be dropped without a word."""
    given = _flag_fields(flags)
    for text in overrides:
        given.setdefault(text.split("=", 1)[0].strip(), f"--set {shorten(text)}")
    for axis in axes:
        for field, flag in given.items():
            if _overlaps(field, axis.path):
                raise InferSimError(f"{flag} and --grid {axis.path}=...: the grid sets {axis.path} at every point, "
                                    f"so {flag.split()[0]} would not be used; give the values once (in --grid)")


def unlaunchable_note(spec: SweepSpec, unlaunchable: dict[str, int], limit: int = 3) -> str:
    """How many searched layouts the search left out because the engine cannot launch them, and why
    ('' where none was)."""
    if not unlaunchable:
        return ""
    engine = spec.base.config.engine
    total, reasons = _tally(unlaunchable, limit, " reason(s)")
    return (f"layout search: {total:,} layout{'s' if total != 1 else ''} left out that engine {engine.name} "
            f"{engine.version} cannot launch (the rule --emit-launch spells commands by, docs/launch.md): {reasons}")


def _tally(counts: dict[str, int], limit: int, more_of: str = "") -> tuple[int, str]:
    """(the counts' total, the `limit` most counted as 'N x what; ...', and how many more there are)."""
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    said = "; ".join(f"{n:,} x {what}" for what, n in top[:limit])
    more = f"; {len(top) - limit} more{more_of}" if len(top) > limit else ""
    return sum(counts.values()), said + more


def above_cap_note(spec: SweepSpec, rows: Sequence[Row]) -> str:
    """How many simulated configurations run a decode batch above the engine's default running-request
    cap (each fits where its KV cache holds the batch, as the main run does) and what their server
    needs ('' where none does)."""
    above = [row for row in rows if row.above_running_cap]
    if not above:
        return ""
    engine = spec.base.config.engine
    caps = sorted({row.running_cap for row in above})
    cap_text = f"{caps[0]:,}" if len(caps) == 1 else f"{caps[0]:,}-{caps[-1]:,}"
    one = len(above) == 1
    return (f"{counted(len(above), 'configuration')} run{'s' if one else ''} a decode batch above {engine.name}'s "
            f"default running-request cap ({cap_text} per GPU): {'it fits' if one else 'they fit'} where the KV cache "
            f"holds the batch, and a server runs {'it' if one else 'them'} {larger_cap(engine)}")


def shortened_note(shortened: dict[str, int], limit: int = 3) -> str:
    """How many grid points ask for requests longer than the engine's server runs whole, which it
    runs with their output cut (SweepResult.shortened), and what it cuts them to ('' where none does)."""
    if not shortened:
        return ""
    total, said = _tally(shortened, limit)
    return (f"{counted(total, 'grid point')} ask{'s' if total == 1 else ''} for requests longer than "
            f"the engine's server runs whole: {'its rows are' if total == 1 else 'their rows are'} timed with the "
            f"output it cuts them to, not the OSL of the grid: {said}")


def sweep_notes(spec: SweepSpec, unlaunchable: dict[str, int] | None = None,
                rows: Sequence[Row] = (), shortened: dict[str, int] | None = None) -> list[str]:
    """What a sweep does that its command line does not say: kernel tables dropped for a hardware
    axis, the MoE path a layout search gives expert-TP layouts, the searched layouts left out
    because the engine cannot launch them (`unlaunchable`: SweepResult.unlaunchable), the `rows`
    whose batch is above the engine's default running-request cap, where their TPOT falls as the
    batch grows, and the grid points whose requests the engine runs with their output cut
    (`shortened`: SweepResult.shortened)."""
    notes = []
    left_out = unlaunchable_note(spec, unlaunchable or {})
    if left_out:
        notes.append(left_out)
    cut = shortened_note(shortened or {})
    if cut:
        notes.append(cut)
    above = above_cap_note(spec, rows)
    if above:
        notes.append(above)
    falling = falling_tpot_note(spec, rows)
    if falling:
        notes.append(falling)
    config = spec.base.config
    hardware_axes = [a.path for a in spec.axes if a.path.split(".")[0] == "hardware"]
    if config.tables_auto and hardware_axes and not isinstance(config.tables, NoTables):
        tables = "/".join(Path(config.tables_source).parts[-3:])  # mfu_tables/<source>/<device>[/<engine>]
        notes.append(f"--grid {hardware_axes[0]}: every point is timed on the roofline, without measured kernel "
                     f"tables: the bundled tables are chosen per device and engine ({tables} for "
                     f"{config.hardware.name}), and one set would time the other or changed devices wrongly; "
                     "run each device on its own for table times")
    if spec.search is not None and config.model.is_moe and config.deployment.moe_comm != "all-gather":
        notes.append(f"layout search: layouts with expert TP (FFN TP > 1) run moe_comm all-gather (tokens gathered "
                     f"onto every shard), the others the config's {config.deployment.moe_comm}")
    return notes
