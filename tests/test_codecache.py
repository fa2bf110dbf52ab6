"""The command-line process keeps the dataclasses' compiled methods on disk; a library import does not touch dataclasses."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_importing_infersim_as_a_library_leaves_dataclasses_alone() -> None:
    import infersim.config  # noqa: F401
    from infersim import codecache

    assert getattr(dataclasses, "exec", None) is not codecache._exec


def test_the_command_prints_the_same_with_and_without_the_kept_code(tmp_path) -> None:
    env = {**os.environ, "INFERSIM_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "infersim", "--config", "qwen3-30b.yaml", "--format", "json"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert list(tmp_path.glob("dataclass-code-*.marshal"))
    second = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    off = subprocess.run(command, env={**env, "INFERSIM_CACHE": "off"}, capture_output=True, text=True, check=True)
    assert first.stdout == second.stdout == off.stdout and first.stdout.startswith("{")
