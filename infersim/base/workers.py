"""Local worker processes that end when their parent ends.

A sweep or a rate sweep runs its chunks on a pool of worker processes. Stopping the parent (Ctrl-C,
SIGTERM from `timeout` or a job scheduler, SIGKILL) must not leave workers computing for minutes:

- Ctrl-C reaches every process of the terminal's foreground group, so workers ignore SIGINT and
  leave the decision to the parent, which keeps the finished results and stops the pool
  (`stop_pool`: what has not started is cancelled, running workers are terminated and reaped).
- SIGTERM sent to a worker ends it (the default action): a scheduler that signals the whole group
  stops the workers too.
- A parent that dies without a word (SIGKILL, a crash) takes its workers with it: on Linux the
  kernel sends each worker SIGKILL when its parent ends (prctl PR_SET_PDEATHSIG); everywhere, a
  daemon thread in each worker checks once a second whether its parent is still the one that
  started it and ends the worker if not.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import sys
import threading
import time

#: how often a worker checks that its parent is alive (seconds), where the kernel does not tell it
PARENT_CHECK_S = 1.0
#: how long a terminated worker gets to end before it is killed (seconds)
TERMINATE_GRACE_S = 2.0

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def available_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pool_workers(requested: int | None, tasks: int) -> tuple[int, str]:
    """Worker processes to start for `tasks` tasks, and a note when fewer than `requested`: the
    number asked for (default: the CPUs available), at most one per task and one per CPU. More
    processes than CPUs only take turns on them, each holding its own copy of the cards and tables;
    and a pool started with fork starts every worker at once, used or not."""
    cpus = available_cpus()
    chunks = max(tasks, 1)
    workers = min(requested or cpus, chunks, cpus)
    if requested is None or workers >= requested:
        return workers, ""
    limits = [f"{cpus} CPU{'s' if cpus != 1 else ''} available here"] if requested > cpus else []
    if requested > chunks and chunks < cpus:
        limits.append(f"{chunks:,} chunk{'s' if chunks != 1 else ''} of work to share")
    started = f"{workers} worker process{'es' if workers != 1 else ''} started"
    return workers, f"--workers {requested}: {'; '.join(limits)}; {started}"


def worker_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A process pool whose workers end with this process (see the module docstring)."""
    return cf.ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(os.getpid(),))


def _start_worker(parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        _ask_kernel_for_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent ended before the worker could ask
        _end_worker()
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="infersim-parent-watch", daemon=True).start()


def _ask_kernel_for_parent_death_signal() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the watching thread does it alone
        pass


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent_pid:
            _end_worker()


def _end_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def stop_pool(pool: cf.Executor) -> None:
    """Stop a pool this process made, now: terminate the running workers (then kill those still
    alive after TERMINATE_GRACE_S) and reap them; tasks not finished fail with BrokenProcessPool.
    Callers do not cancel the pool's futures themselves.

    ProcessPoolExecutor has no public way to stop a worker in the middle of a task, so this reads
    four of its attributes (present from Python 3.8 to 3.14): `_processes` (pid -> Process);
    `_call_queue`, whose feeder thread would otherwise wait at exit for dead workers to read the
    tasks still queued for them; `_result_queue`, whose writing end this process holds too: a
    worker killed while it wrote a result leaves part of a message in the pipe, and the executor's
    thread, reading the rest, would wait for it for ever (and the interpreter, joining that thread
    at exit, with it), so closing that end once every worker is gone ends the read; and
    `_executor_manager_thread`, that thread, given TERMINATE_GRACE_S to end."""
    processes = dict(getattr(pool, "_processes", None) or {})
    handles = list(processes.values())
    call_queue = getattr(pool, "_call_queue", None)
    if call_queue is not None:
        call_queue.cancel_join_thread()
    for process in handles:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in handles:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None and not any(process.is_alive() for process in handles):
        writer.close()
    # The executor's own thread now fails every task left with BrokenProcessPool; cancelling them
    # here as well would race it (it cannot fail a cancelled future and says so on stderr). Taken
    # before shutdown, which forgets it.
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False)
    if manager is not None:
        manager.join(TERMINATE_GRACE_S)
