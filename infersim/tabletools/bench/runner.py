"""The measuring loop of `mfu bench`: time each case, write its rows at once, keep going.

A case that cannot run (no kernel for it, out of memory) is skipped with its reason; a case whose
kernel raises while being prepared or timed is recorded as failed (label and error in the provenance
notes) and the run goes on; the time budget ends the run cleanly before the command's own limit;
SIGTERM (what `timeout` sends) ends it the same way. Whatever happens, the rows measured so far are on
disk and the directory loads (see writer.TableWriter).
"""

from __future__ import annotations

import datetime as _dt
import math
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO
from collections.abc import Callable, Sequence

from infersim.base.errors import InferSimError
from infersim.tabletools.bench.budget import PartRecord, StageSummary, fit_budgets, part_deadlines
from infersim.tabletools.bench.cases import (
    HOST_PROBES,
    BenchCase,
    HostCase,
    TimedCase,
    budget_group,
    estimated_seconds,
    table_file,
)
from infersim.tabletools.bench.environment import Environment
from infersim.tabletools.bench.torch_backend import HostResult, Prepared
from infersim.tabletools.bench.writer import TableWriter
from infersim.tables.format import efficiency_of


class KernelBackend(Protocol):
    def environment(self) -> Environment:
        """What the kernels run on: device name, SM count, clocks; software versions."""
        ...

    def prepare(self, case: TimedCase) -> Prepared | str:
        """Allocate inputs, launch once; a Prepared (launch closure, library), or why the case cannot run here."""
        ...

    def release(self) -> None:
        """Free what the last `prepare` allocated (and undo what it pinned)."""
        ...

    def host_probe(self, case: HostCase) -> HostResult | str:
        """Seconds per call of a host-side probe, or why it cannot run here."""
        ...


class KernelTimer(Protocol):
    description: str

    def measure(self, case: TimedCase, launch: Callable[[], Any]) -> float:
        """Median seconds of one `launch` (warm-up first)."""
        ...


@dataclass
class BenchResult:
    directory: Path
    measured: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> cases
    failed: list[str] = field(default_factory=list)  # "<case>: <error>" of each kernel that raised
    stopped: str = ""  # why the run ended before its plan did (budget, signal), or ""


class Stopped(BaseException):
    """The run was asked to stop (SIGTERM). A BaseException, so that no `except Exception` around a kernel or
    a probe swallows it."""


def today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def host_costs(probes: dict[str, float]) -> tuple[float | None, float | None, str]:
    """(launch_cpu, step_cpu, how) from the host probes: the HF probe's per-kernel and per-step costs
    where it ran; else the bare launch of a small op (a lower bound: model code adds Python around
    each launch) and no step cost."""
    if probes.get("hf_kernel", 0.0) > 0:
        step = probes.get("hf_generate_step", 0.0) + probes.get("hf_forward_step", 0.0)
        return probes["hf_kernel"], step if step > 0 else None, (
            "launch_cpu: host seconds per kernel inside HF transformers' decoder layers (hf_kernel: tiny-width "
            "Llama, wall time per decode forward at two layer counts over the CUDA kernels counted by the "
            "profiler); step_cpu: generate()'s work per step outside the forward plus the forward's own work "
            "outside the layers (hf_generate_step + hf_forward_step)")
    if probes.get("launch", 0.0) > 0:
        return probes["launch"], None, (
            "launch_cpu: host seconds per eager launch of torch.add on 1-element tensors (no model code around "
            "it: a lower bound for model code); the HF probe did not run, so no step_cpu")
    return None, None, ""


def run_bench(cases: Sequence[BenchCase], backend: KernelBackend, timer: KernelTimer, out: Path,
              peaks: dict[str, float], command: str, progress: TextIO | None | Literal["stderr"] = "stderr",
              budget_seconds: float = math.inf, clock: Callable[[], float] = time.monotonic,
              measured_on: str | None = None, reserve_seconds: float = 5.0,
              group_budgets: Sequence[tuple[str, float]] = (), summary_path: Path | None = None,
              force: bool = False) -> BenchResult:
    """Time every case in order, writing each row as it is measured (module docstring). The run stops
    before a case whose estimated time would end it later than `budget_seconds` (minus a reserve for
    the final write) after the start. With `group_budgets` ((group, seconds) in the order the cases run:
    plan_cases(group_order=...)), each group of cases.BUDGET_GROUPS also ends at its own deadline
    (budget.part_deadlines): the cases of a group that would end after it are not measured, and the next
    group starts. `summary_path` gets the run's summary per group (budget.StageSummary)."""
    stream: TextIO | None = sys.stderr if progress == "stderr" else progress  # type: ignore[assignment]
    env = backend.environment()
    timed_dtypes = {c.dtype for c in cases if not isinstance(c, HostCase) and c.family != "elementwise"}
    missing_peaks = sorted(timed_dtypes - set(peaks))
    if missing_peaks:
        raise InferSimError(f"no peak FLOP/s for {', '.join(missing_peaks)} on {env.device.name}: "
                            f"give --peak-{missing_peaks[0]} or --hardware")
    writer = TableWriter(out, env.device, env.software, peaks, command, measured_on or today(),
                         [f"timing: {getattr(timer, 'description', type(timer).__name__)}"], force=force)
    loop = _BenchLoop(cases, backend, timer, writer, peaks, stream, budget_seconds, reserve_seconds, clock,
                      group_budgets, summary_path, device=env.device.name)
    loop.run()
    if not loop.result.measured and not loop.probes:
        skipped = loop.result.skipped
        raise InferSimError("no kernel could be measured: " + "; ".join(sorted(skipped)) if skipped
                            else "no kernels to measure (check --kernels and the model cards)")
    return loop.result


class _BenchLoop:
    """The state of one run_bench: the cases, their deadlines, what was measured and skipped."""

    def __init__(self, cases: Sequence[BenchCase], backend: KernelBackend, timer: KernelTimer, writer: TableWriter,
                 peaks: dict[str, float], stream: TextIO | None, budget_seconds: float, reserve_seconds: float,
                 clock: Callable[[], float], group_budgets: Sequence[tuple[str, float]], summary_path: Path | None,
                 device: str) -> None:
        self.cases, self.backend, self.timer, self.writer, self.peaks = cases, backend, timer, writer, peaks
        self.stream, self.budget, self.reserve, self.clock = stream, budget_seconds, reserve_seconds, clock
        self.result = BenchResult(Path(writer.directory), 0)
        self.probes: dict[str, float] = {}
        self.host_notes: list[str] = []
        self.budgeted = bool(group_budgets)
        self.summary = _group_summary(cases, group_budgets, budget_seconds - reserve_seconds, summary_path, clock,
                                      device)
        self.reasons: dict[str, dict[str, int]] = {name: {} for name in self.summary.parts}
        self.cut: set[str] = set()

    def say(self, text: str) -> None:
        if self.stream:
            print(text, file=self.stream, flush=True)

    def skip(self, reason: str, count: int = 1, group: str = "") -> None:
        self.result.skipped[reason] = self.result.skipped.get(reason, 0) + count
        if group:
            self.reasons[group][reason] = self.reasons[group].get(reason, 0) + count

    def run(self) -> None:
        previous = _on_sigterm()
        index, current = 0, ""
        try:
            for index, case in enumerate(self.cases, start=1):
                group = budget_group(case)
                if group != current:
                    self._switch(current, group)
                    current = group
                if not self._within_budget(case, group, index):
                    if self.result.stopped:
                        break
                    continue
                self._measure(case, group, index)
        except (Stopped, KeyboardInterrupt) as exc:
            self.result.stopped = "stopped by SIGTERM" if isinstance(exc, Stopped) else "stopped by an interrupt"
            self._not_reached(max(index - 1, 0), f"not reached: {self.result.stopped}")
            self.say(f"[{index}/{len(self.cases)}] {self.result.stopped}: writing what was measured")
        finally:
            _restore_sigterm(previous)
            self._finish()

    def _switch(self, previous: str, group: str) -> None:
        """Groups run one after the other in a budgeted run (each ends when the next begins); otherwise they
        take turns, so each is running from its first case to the end of the run."""
        if previous and self.budgeted:
            self._end_group(previous)
        if self.summary.parts[group].status == "not started":
            self.summary.begin(group)

    def _end_group(self, group: str) -> None:
        for reason, count in self.reasons[group].items():
            self.summary.not_done(group, f"{count} cases", reason)
        self.reasons[group] = {}
        self.summary.end(group, "cut" if group in self.cut else "complete")

    def _within_budget(self, case: BenchCase, group: str, index: int) -> bool:
        elapsed = self.summary.elapsed()
        estimate = estimated_seconds(case)
        if elapsed + estimate > self.budget - self.reserve:
            self.result.stopped = f"time budget of {self.budget:g} s reached after {elapsed:.0f} s"
            self._not_reached(index - 1, f"not reached: {self.result.stopped}")
            self.say(f"[{index}/{len(self.cases)}] stopping: {self.result.stopped}")
            return False
        deadline = self.summary.parts[group].deadline_s
        if self.budgeted and deadline is not None and elapsed + estimate > deadline:
            if group not in self.cut:
                self.cut.add(group)
                self.say(f"[{index}/{len(self.cases)}] {group}: its deadline ({deadline:.0f} s after the start) "
                         f"comes before this case would end; the rest of {group} is not measured")
            self.skip(f"not reached: the {group} budget ended {deadline:.0f} s after the start", group=group)
            return False
        return True

    def _not_reached(self, measured_so_far: int, reason: str) -> None:
        """Every case after the first `measured_so_far` is not reached, counted per group."""
        for case in self.cases[measured_so_far:]:
            self.skip(reason, group=budget_group(case))
            self.cut.add(budget_group(case))

    def _measure(self, case: BenchCase, group: str, index: int) -> None:
        measured, failed = self.result.measured, len(self.result.failed)
        if isinstance(case, HostCase):
            _host_case(case, self.backend, self.probes, self.host_notes, lambda r: self.skip(r, group=group),
                       self.result, self.say, index, len(self.cases))
            launch_cpu, step_cpu, how = host_costs(self.probes)
            self.writer.set_host(self.probes, launch_cpu, step_cpu, how)
        else:
            _timed_case(case, self.backend, self.timer, self.writer, self.peaks,
                        lambda r: self.skip(r, group=group), self.result, self.say, index, len(self.cases))
        if len(self.result.failed) > failed:
            self.reasons[group]["kernel failed (provenance notes)"] = \
                self.reasons[group].get("kernel failed (provenance notes)", 0) + 1
        elif self.result.measured > measured or isinstance(case, HostCase):
            self.summary.done_one(group)

    def _finish(self) -> None:
        self.backend.release()
        at_end = getattr(self.backend, "clocks_at_end", None)  # clocks after the run, beside those at its start
        if callable(at_end):
            self.writer.device = replace(self.writer.device, clocks={**self.writer.device.clocks, **at_end()})
        notes = self.host_notes + [f"kernel failed: {f}" for f in self.result.failed] + [
            f"not measured ({count} cases): {reason}" for reason, count in sorted(self.result.skipped.items())]
        self.writer.finish(notes, complete=not self.result.stopped.startswith("stopped"))
        for group, part in self.summary.parts.items():
            if part.status == "running":
                self._end_group(group)
            elif part.status == "not started":
                self._end_group(group)
                part.status = "skipped"
                if not part.planned:
                    part.not_done.append("nothing planned: no case of this family for these models and options")
        if self.result.stopped.startswith("stopped"):
            self.summary.stopped = self.result.stopped
        self.summary.write()


def _group_summary(cases: Sequence[BenchCase], group_budgets: Sequence[tuple[str, float]], budget_seconds: float,
                   path: Path | None, clock: Callable[[], float], device: str) -> StageSummary:
    """One part per group of cases (in the order they first appear, or the budgets' order), with its plan,
    estimate and deadline (the last group's is `budget_seconds`: the run's budget less its final write)."""
    planned: dict[str, list[BenchCase]] = {name: [] for name, _seconds in group_budgets}
    for case in cases:
        planned.setdefault(budget_group(case), []).append(case)
    total: float | None = budget_seconds if math.isfinite(budget_seconds) else (
        sum(s for _n, s in group_budgets) if group_budgets else None)
    budgets = dict(fit_budgets(group_budgets, total or 0.0)) if group_budgets else {}
    deadlines = part_deadlines(group_budgets, total or 0.0) if group_budgets else {}
    parts = [PartRecord(name, len(group), round(sum(estimated_seconds(c) for c in group), 3),
                        budget_s=_rounded(budgets.get(name, total)), deadline_s=_rounded(deadlines.get(name, total)),
                        estimate_source="cases.estimated_seconds: a roofline at half a Hopper GPU's bf16 peak and 75% "
                                        "of its HBM bandwidth, 25 runs plus 20 ms per case")
             for name, group in planned.items()]
    return StageSummary(path, "mfu bench", total, parts, clock, device=device)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _host_case(case: HostCase, backend: KernelBackend, probes: dict[str, float], notes: list[str],
               skip: Callable[[str], None], result: BenchResult, say: Callable[[str], None], index: int,
               total: int) -> None:
    try:
        found = backend.host_probe(case)
    except Exception as exc:  # noqa: BLE001 - one failing probe must not lose the others' measurements
        result.failed.append(f"{case.label()}: {type(exc).__name__}: {_first_line(exc)}")
        say(f"[{index}/{total}] {case.label()}: failed ({type(exc).__name__}: {_first_line(exc)})")
        return
    if isinstance(found, str):
        skip(found)
        say(f"[{index}/{total}] {case.label()}: skipped ({found})")
        return
    probes.update(found.seconds)
    notes += found.notes + [f"host probe {case.probe}: {HOST_PROBES.get(case.probe, '')}"]
    shown = ", ".join(f"{k} {v * 1e6:.2f} us" if not k.endswith("per_layer") else f"{k} {v:g}"
                      for k, v in found.seconds.items())
    say(f"[{index}/{total}] {case.label()}: {shown}")


def _timed_case(case: TimedCase, backend: KernelBackend, timer: KernelTimer, writer: TableWriter,
                peaks: dict[str, float], skip: Callable[[str], None], result: BenchResult,
                say: Callable[[str], None], index: int, total: int) -> None:
    try:
        prepared = backend.prepare(case)
        if isinstance(prepared, str):
            skip(prepared)
            say(f"[{index}/{total}] {case.label()}: skipped ({prepared})")
            return
        seconds = timer.measure(case, prepared.launch)
    except (Stopped, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - one failing kernel must not lose the others' measurements
        result.failed.append(f"{case.label()}: {type(exc).__name__}: {_first_line(exc)}")
        say(f"[{index}/{total}] {case.label()}: failed ({type(exc).__name__}: {_first_line(exc)})")
        return
    finally:
        backend.release()
    rows = case.rows(round(seconds * 1e6, 4))
    writer.add(table_file(case), case.family, rows, prepared.library, prepared.library_version)
    result.measured += 1
    row = rows[0]
    if case.family == "elementwise":
        shown = f"{row.latency_us:.2f} us ({row.bytes / seconds / 1e9:.0f} GB/s)"  # type: ignore[union-attr]
    else:
        shown = f"{row.latency_us:.2f} us (efficiency {efficiency_of(row, peaks[case.dtype]):.3f})"  # type: ignore[arg-type]
    say(f"[{index}/{total}] {case.label()}: {shown} [{prepared.library}]")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _on_sigterm() -> Any:
    """SIGTERM raises Stopped in the main thread, so the loop ends through `finally` and writes."""
    def handler(_signum: int, _frame: Any) -> None:
        raise Stopped()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: no handler, the rows on disk still load
        return None


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------
# Peak FLOP/s of the device (the `efficiency` column is relative to them)


def hardware_card_for(device_name: str) -> str | None:
    """The bundled hardware card matching a driver-reported device name, if any: a card's name or
    alias (cards list the names nvidia-smi and rocm-smi report, e.g. "NVIDIA H100 PCIe", "AMD
    Instinct MI300X"), with or without the maker's prefix; else the Hopper part the name contains."""
    from infersim.cards.registry import forgiving_name

    for candidate in dict.fromkeys((device_name, device_name.removeprefix("NVIDIA ").removeprefix("AMD "))):
        try:
            found = forgiving_name(candidate, "hardware")
        except InferSimError:  # ambiguous: the markers below decide
            continue
        if found is not None:
            return found[0]
    name = device_name.upper().replace(" ", "")
    for marker, card in (("H200", "h200"), ("H800", "h800"), ("H20", "h20"), ("H100", "h100-sxm")):
        if marker in name:
            if card == "h100-sxm" and "PCIE" in name:
                return None
            return card
    return None


def peaks_for(device_name: str, hardware: str | None, overrides: dict[str, float]) -> tuple[dict[str, float], str]:
    """Dense peak FLOP/s per dtype, and where they came from."""
    peaks: dict[str, float] = {}
    source = "command line"
    card_name = hardware or hardware_card_for(device_name)
    if card_name:
        from infersim.run.config import load_hardware_card

        card, card_source = load_hardware_card(card_name)
        peaks.update(card.peak.flops)
        source = f"hardware card {card_source}"
    peaks.update(overrides)
    if not peaks:
        raise InferSimError(f"no peak FLOP/s known for '{device_name}': give --hardware CARD or "
                            f"--peak-bf16/--peak-fp8 (dense FLOP/s)")
    if overrides and card_name:
        source += " with command-line overrides"
    return peaks, source
