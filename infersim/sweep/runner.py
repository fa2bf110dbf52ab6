"""Running a sweep: in process, on local worker processes, or on any concurrent.futures.Executor.

The units of a spec (see `infersim.sweep.evaluate`) are cut into contiguous chunks; each chunk is
one task `evaluate_chunk(pickled spec, start, stop)`, so a task ships a few kilobytes and a
worker unpickles the spec once per sweep. Chunks are sized so that a worker spends a fraction of
a second on each: process overhead stays small and an interrupt loses little.

Ctrl-C (SIGINT) or SIGTERM stops the sweep and keeps every finished chunk: the result says how many units finished
(`interrupted`, `finished_units`) and the caller writes what there is.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import math
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from infersim.base.workers import available_cpus, pool_workers, stop_pool, worker_pool
from infersim.base.errors import InferSimError
from infersim.sweep.evaluate import ChunkResult, Evaluator, Row, SweepSpec, check_sweep_size, evaluate_chunk

#: below this many estimated simulations a sweep runs in process (starting workers costs more)
SERIAL_BELOW = 3000
#: target simulations per chunk: about a tenth of a second of work
CHUNK_SIMULATIONS = 1000


@dataclass
class SweepResult:
    spec: SweepSpec
    rows: list[Row]  # in unit order: grid order, then searched layouts and batches
    total_units: int
    finished_units: int
    rejected: int = 0
    unfit: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    elapsed_s: float = 0.0
    workers: int = 1  # worker processes used (1 = in process; 0 = a caller's executor)
    interrupted_by: str = ""  # "SIGINT" (Ctrl-C) or "SIGTERM" when interrupted
    # grid point -> why its searched layouts gave no row (rejections, batches that do not fit) -> count
    by_point: dict[int, dict[str, int]] = field(default_factory=dict)
    # why the engine cannot launch them -> searched layouts the search left out (ChunkResult.unlaunchable)
    unlaunchable: dict[str, int] = field(default_factory=dict)
    # what the engine's server does to a request longer than it runs whole -> grid points timed with the
    # output it cuts such a request to (ChunkResult.shortened)
    shortened: dict[str, int] = field(default_factory=dict)

    @property
    def simulated(self) -> int:
        return sum(1 for r in self.rows if r.ok)

    @property
    def rate(self) -> float:
        """Simulated configurations per second (wall clock)."""
        return self.simulated / self.elapsed_s if self.elapsed_s > 0 else 0.0


def estimated_simulations(spec: SweepSpec) -> int:
    if spec.search is None:
        return spec.units
    # a rough guess of layouts per (GPU count, PP) unit times batches; it only sizes chunks
    return spec.units * 6 * (len(spec.search.batches) + 1)


def chunk_ranges(units: int, per_unit: float, workers: int) -> list[tuple[int, int]]:
    """Contiguous (start, stop) ranges: about CHUNK_SIMULATIONS simulations each, and at least
    four chunks per worker when the sweep is big enough to balance."""
    if units <= 0:
        return []
    size = max(1, int(CHUNK_SIMULATIONS / max(per_unit, 1e-9)))
    size = min(size, max(1, math.ceil(units / (4 * workers))))
    return [(s, min(s + size, units)) for s in range(0, units, size)]


class Progress:
    """Progress on stderr: a one-line bar redrawn in place when the stream is a terminal (or
    `enabled` is True); plain text lines every `interval_s` seconds when it is not (a log file, a
    batch job), unless `enabled` is False."""

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool | None = None,
                 delay_s: float = 0.5, unit: str = "configs", interval_s: float = 5.0) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        tty = _isatty(self.stream)
        self.enabled = tty if enabled is None else enabled
        self.lines = enabled is None and not tty
        self.start = time.perf_counter()
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.unit = unit
        self._last = 0.0
        self._drawn = False

    def _numbers(self, done: int, simulated: int, elapsed: float) -> tuple[float, float, str]:
        frac = done / self.total if self.total else 1.0
        rate = simulated / elapsed if elapsed > 0 else 0.0
        eta = (elapsed / frac - elapsed) if frac > 0 else math.inf
        return frac, rate, (f"{eta:5.0f}s left" if math.isfinite(eta) else "   ?s left")

    def update(self, done: int, simulated: int, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        if self.lines:
            if done < self.total and now - max(self._last, self.start) >= self.interval_s:
                self._last = now
                frac, rate, eta = self._numbers(done, simulated, elapsed)
                self.stream.write(f"infersim: sweep progress: {frac:.1%}, {done:,} of {self.total:,} units, "
                                  f"{simulated:,} {self.unit} ({rate:,.0f}/s), {eta.strip()} after {elapsed:,.0f} s\n")
                self.stream.flush()
            return
        if not self.enabled:
            return
        if not force and (elapsed < self.delay_s or now - self._last < 0.1):
            return
        self._last = now
        frac, rate, eta_text = self._numbers(done, simulated, elapsed)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self.stream.write(f"\r[{bar}] {frac:6.1%} {done:,}/{self.total:,} units, {simulated:,} {self.unit} "
                          f"({rate:,.0f}/s), {eta_text} ")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False


#: a sweep estimated above this many simulations gets a size estimate on stderr before it runs
LARGE_SWEEP = 100_000


class Terminated(KeyboardInterrupt):
    """SIGTERM during a sweep: stop like Ctrl-C and keep what is done."""


def _on_sigterm(_signum: int, _frame: Any) -> None:
    raise Terminated()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside: SIGTERM stops the main thread like Ctrl-C (as Terminated), so a search keeps
    what finished; outside the main thread (signals never reach it) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: Any = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def size_estimate(spec: SweepSpec, workers: int, sample_units: int = 32) -> tuple[int, float]:
    """(estimated simulations, estimated seconds) of a sweep, from timing its first units here."""
    sims = estimated_simulations(spec)
    units = min(sample_units, spec.units)
    if units <= 0:
        return sims, 0.0
    start = time.perf_counter()
    sample = Evaluator(spec).run(0, units)
    seconds = time.perf_counter() - start
    per_unit = seconds / units
    return max(sims, sample.units and len(sample.rows) * spec.units // sample.units), per_unit * spec.units / max(workers, 1)


def _payload(spec: SweepSpec) -> bytes:
    try:
        return pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # e.g. kernel tables holding closures
        raise InferSimError(f"this sweep cannot be sent to worker processes ({type(exc).__name__}: {exc}); "
                            "run it in process with --workers 1") from None


@contextmanager
def _preexisting_objects_frozen() -> Iterator[None]:
    """Spares what the process held before an in-process sweep from the sweep's full garbage
    collections (gc.freeze until it ends). The sweep allocates enough long-lived objects (its cost
    and plan memos) to set off several, and each would traverse every card, kernel table and memo
    entry alive (10^5 objects, tens of ms: a third of a DeepSeek-V3 grid's time), none of them
    garbage. Skipped when objects are frozen already: gc.unfreeze would undo someone else's freeze."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_sweep(spec: SweepSpec, executor: cf.Executor | None = None, workers: int | None = None,
              progress: bool | None = None, chunk_units: int | None = None,
              stream: IO[str] | None = None) -> SweepResult:
    """Evaluate every unit of `spec` and gather the rows in unit order.

    executor: any concurrent.futures.Executor (a Dask `client.get_executor()`, a thread or process
    pool); it is used as is and not shut down. Without one, `workers` processes run the chunks
    (default: the CPUs available), or the sweep runs in this process when workers == 1 or it is
    small (under SERIAL_BELOW simulations). progress: draw a progress bar on stderr (default: when
    stderr is a terminal). Ctrl-C returns the finished part with `interrupted` set."""
    check_sweep_size(spec)
    total = spec.units
    start = time.perf_counter()
    sims = estimated_simulations(spec)
    per_unit = sims / total if total else 1.0
    if workers is not None and workers < 1:
        raise InferSimError(f"--workers must be at least 1 (got {workers})")
    serial = executor is None and (workers == 1 or (workers is None and sims < SERIAL_BELOW))
    n_workers = 1 if serial else (workers or available_cpus())
    if executor is None and n_workers <= 1:
        serial = True
    if not serial and executor is None:
        n_workers, cut = pool_workers(workers, total)
        if cut:
            (stream or sys.stderr).write(f"infersim: {cut}\n")
    ranges = chunk_ranges(total, per_unit, n_workers)
    if chunk_units:
        ranges = [(s, min(s + chunk_units, total)) for s in range(0, total, chunk_units)]
    if not serial and executor is None:
        n_workers = min(n_workers, len(ranges))  # no worker without a chunk
    if sims > LARGE_SWEEP:
        expected, seconds = size_estimate(spec, n_workers)
        (stream or sys.stderr).write(
            f"infersim: large sweep: {total:,} units, about {expected:,} configurations; estimated "
            f"{_duration(seconds)} on {n_workers if executor is None else 'the given executor'} "
            f"{'worker' if n_workers == 1 else 'workers'} (Ctrl-C or SIGTERM stops it and keeps what is done)\n")
    bar = Progress(total, stream, progress)
    results: dict[int, ChunkResult] = {}
    done_units = simulated = 0
    interrupted = False

    def record(begin: int, chunk: ChunkResult) -> None:
        nonlocal done_units, simulated
        results[begin] = chunk
        done_units += chunk.units
        simulated += len(chunk.rows)
        bar.update(done_units, simulated)

    handles_sigterm = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous_sigterm: Any = signal.signal(signal.SIGTERM, _on_sigterm) if handles_sigterm else None
    interrupted_by = ""
    try:
        if serial:
            evaluator = Evaluator(spec)
            with _preexisting_objects_frozen():
                for begin, stop in ranges:
                    record(begin, evaluator.run(begin, stop))
        else:
            _run_on_pool(spec, executor, n_workers, ranges, record)
    except KeyboardInterrupt as exc:
        interrupted = True
        interrupted_by = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    finally:
        if handles_sigterm:
            signal.signal(signal.SIGTERM, previous_sigterm if previous_sigterm is not None else signal.SIG_DFL)
        bar.update(done_units, simulated, force=bar._drawn)
        bar.close()
    merged = ChunkResult()
    for begin in sorted(results):
        merged.merge(results[begin])
    return SweepResult(spec, merged.rows, total, merged.units, merged.rejected, merged.unfit, merged.problems,
                       interrupted, time.perf_counter() - start, 0 if executor is not None else n_workers,
                       interrupted_by, merged.by_point, merged.unlaunchable, merged.shortened)


def _run_on_pool(spec: SweepSpec, executor: cf.Executor | None, n_workers: int, ranges: list[tuple[int, int]],
                 record: Callable[[int, ChunkResult], None]) -> None:
    """The chunks on a caller's executor, or on `n_workers` local worker processes; each recorded as it
    finishes (Ctrl-C keeps those that finished meanwhile, then re-raises)."""
    payload = _payload(spec)
    own = executor is None
    pool = executor or worker_pool(n_workers)
    futures: dict[cf.Future, int] = {}
    try:
        futures = {pool.submit(evaluate_chunk, payload, begin, stop): begin for begin, stop in ranges}
        for future in cf.as_completed(futures):
            chunk = future.result()
            # dropped once recorded: a Dask future keeps its result alive on the cluster while referenced
            record(futures.pop(future), chunk)
    except KeyboardInterrupt:
        _stop(pool, own, futures)
        for future, begin in list(futures.items()):  # keep chunks that finished meanwhile
            if future.done() and not future.cancelled() and future.exception() is None:
                record(begin, future.result())
        raise
    finally:
        if own:
            pool.shutdown(cancel_futures=True)


def _stop(pool: cf.Executor, own: bool, futures: dict[cf.Future, int]) -> None:
    """Stop the work of an interrupted sweep: a pool it made, at once (its workers end in the middle
    of their chunks); a caller's executor keeps running, so only what has not started is cancelled."""
    if own:
        stop_pool(pool)
        return
    for future in futures:
        future.cancel()


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.1f} h"
