"""A stopped sweep stops its workers: SIGTERM and SIGKILL to the parent leave no worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")

#: a sweep of many minutes on two workers (each grid point is a whole decode simulation)
LONG_SWEEP = ["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.isl=1..99999:1", "--grid", "workload.osl=1..4:1",
              "--workers", "2",
              "--no-progress", "--rows", "1"]


def children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            living.add(pid)
    return living


def start_sweep(tmp_path: Path) -> tuple[subprocess.Popen, set[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "INFERSIM_CACHE_DIR": str(tmp_path / "cache")}
    parent = subprocess.Popen([sys.executable, "-m", "infersim", *LONG_SWEEP], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        time.sleep(0.2)
        workers = children(parent.pid)
        assert parent.poll() is None, parent.communicate()
    assert len(workers) >= 2, "the sweep did not start two workers within a minute"
    time.sleep(1.0)  # the workers are computing their chunks now
    return parent, workers


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_sigterm_to_the_parent_stops_every_worker_and_keeps_what_is_done(tmp_path: Path) -> None:
    parent, workers = start_sweep(tmp_path)
    parent.send_signal(signal.SIGTERM)
    try:
        out, err = parent.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        parent.kill()  # a parent that hangs is the failure: it does not outlive the test
        parent.communicate()
        raise
    assert parent.returncode == 128 + signal.SIGTERM, err  # the shell's convention for a run stopped by SIGTERM
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert not wait_gone(workers, 10), "workers outlived a parent stopped by SIGTERM"


def test_sigkill_to_the_parent_takes_its_workers_with_it(tmp_path: Path) -> None:
    parent, workers = start_sweep(tmp_path)
    parent.kill()
    parent.wait(timeout=30)
    parent.stdout.close()  # type: ignore[union-attr]
    parent.stderr.close()  # type: ignore[union-attr]
    assert not wait_gone(workers, 10), "workers outlived a parent killed with SIGKILL"


TORN_RESULT = """
import os, struct, time
from infersim.base.workers import stop_pool, worker_pool
pool = worker_pool(1)
assert pool.submit(abs, -1).result(timeout=60) == 1  # the worker and the executor's thread are running
# what a worker killed while writing a result leaves: a message's length, and only part of the message
os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1000) + b"part")
time.sleep(0.5)  # the executor's thread is reading the rest
manager = pool._executor_manager_thread
stop_pool(pool)
print("stopped", manager.is_alive())
"""


def test_a_pool_stopped_with_part_of_a_result_in_its_pipe_lets_the_interpreter_exit() -> None:
    """A worker killed while it wrote a result left the executor's thread waiting for the rest of the
    message, and the interpreter, joining that thread at exit, waiting with it: a sweep stopped by
    SIGTERM printed what it kept and never ended. stop_pool closes this process's end of the pipe."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", TORN_RESULT], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "stopped False\n"), done.stderr
