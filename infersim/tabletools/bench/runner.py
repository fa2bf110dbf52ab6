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
from typing import Any, Callable, Literal, Protocol, Sequence, TextIO

from infersim.base.errors import InferSimError
from infersim.tabletools.bench.cases import (
    HOST_PROBES,
    BenchCase,
    HostCase,
    TimedCase,
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


class Stopped(Exception):
    """The run was asked to stop (SIGTERM)."""


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
              measured_on: str | None = None, reserve_seconds: float = 5.0, force: bool = False) -> BenchResult:
    """Time every case in order, writing each row as it is measured (module docstring). The run stops
    before a case whose estimated time would end it later than `budget_seconds` (minus a reserve for
    the final write) after the start."""
    stream: TextIO | None = sys.stderr if progress == "stderr" else progress  # type: ignore[assignment]
    env = backend.environment()
    timed_dtypes = {getattr(c, "dtype") for c in cases if not isinstance(c, HostCase) and c.family != "elementwise"}
    missing_peaks = sorted(timed_dtypes - set(peaks))
    if missing_peaks:
        raise InferSimError(f"no peak FLOP/s for {', '.join(missing_peaks)} on {env.device.name}: "
                            f"give --peak-{missing_peaks[0]} or --hardware")
    writer = TableWriter(out, env.device, env.software, peaks, command, measured_on or today(),
                         [f"timing: {getattr(timer, 'description', type(timer).__name__)}"], force=force)
    result = BenchResult(Path(out), 0)
    probes: dict[str, float] = {}
    host_notes: list[str] = []
    start = clock()

    def say(text: str) -> None:
        if stream:
            print(text, file=stream, flush=True)

    def skip(reason: str, count: int = 1) -> None:
        result.skipped[reason] = result.skipped.get(reason, 0) + count

    previous = _on_sigterm()
    index = 0
    try:
        for index, case in enumerate(cases, start=1):
            elapsed = clock() - start
            if elapsed + estimated_seconds(case) > budget_seconds - reserve_seconds:
                result.stopped = f"time budget of {budget_seconds:g} s reached after {elapsed:.0f} s"
                skip(f"not reached: {result.stopped}", len(cases) - index + 1)
                say(f"[{index}/{len(cases)}] stopping: {result.stopped}")
                break
            if isinstance(case, HostCase):
                _host_case(case, backend, probes, host_notes, skip, result, say, index, len(cases))
                launch_cpu, step_cpu, how = host_costs(probes)
                writer.set_host(probes, launch_cpu, step_cpu, how)
                continue
            _timed_case(case, backend, timer, writer, peaks, skip, result, say, index, len(cases))
    except (Stopped, KeyboardInterrupt) as exc:
        result.stopped = "stopped by SIGTERM" if isinstance(exc, Stopped) else "stopped by an interrupt"
        skip(f"not reached: {result.stopped}", len(cases) - index + 1)
        say(f"[{index}/{len(cases)}] {result.stopped}: writing what was measured")
    finally:
        _restore_sigterm(previous)
        backend.release()
        at_end = getattr(backend, "clocks_at_end", None)  # clocks after the run, beside those at its start
        if callable(at_end):
            writer.device = replace(writer.device, clocks={**writer.device.clocks, **at_end()})
        notes = host_notes + [f"kernel failed: {f}" for f in result.failed] + [
            f"not measured ({count} cases): {reason}" for reason, count in sorted(result.skipped.items())]
        writer.finish(notes, complete=not result.stopped.startswith("stopped"))
    if not result.measured and not probes:
        raise InferSimError("no kernel could be measured: " + "; ".join(sorted(result.skipped)) if result.skipped
                            else "no kernels to measure (check --kernels and the model cards)")
    return result


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
    def handler(signum: int, frame: Any) -> None:
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
