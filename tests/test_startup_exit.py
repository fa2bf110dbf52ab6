"""The command-line process ends without the interpreter's teardown, yet exits as a normal exit would."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from conftest import REPO_ROOT
from infersim.cli import exit_now


def run(args: list[str], cache: os.PathLike[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "INFERSIM_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "infersim", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_exit_status_output_and_atexit_writes_survive_the_fast_exit(tmp_path, capsys) -> None:
    from infersim.cli import main

    assert main(["--config", "qwen3-30b.yaml"]) == 0
    whole = capsys.readouterr().out
    ok = run(["--config", "qwen3-30b.yaml"], tmp_path)
    assert ok.returncode == 0 and ok.stdout == whole and whole.count("\n") > 40  # flushed to the last line
    # the caches are written by atexit callbacks, which still run
    assert list(tmp_path.glob("dataclass-code-*.marshal")) and list(tmp_path.glob("yaml-*.marshal"))
    unfit = run(["--config", "qwen3-30b.yaml", "--set", "workload.decode_batch_per_gpu=100000"], tmp_path)
    assert unfit.returncode == 1 and unfit.stderr.startswith("infersim: does not fit")
    bad = run(["--config", "no-such-config.yaml"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_a_running_thread_gets_the_normal_exit() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(SystemExit) as exc:
            exit_now(3)
        assert exc.value.code == 3
    finally:
        release.set()
        worker.join()


def test_a_profiled_run_keeps_its_profile(tmp_path) -> None:
    env = {**os.environ, "INFERSIM_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    profile = tmp_path / "run.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "infersim", "--config",
                    "qwen3-30b.yaml"], env=env, capture_output=True, check=True, timeout=120)
    assert profile.stat().st_size > 0
