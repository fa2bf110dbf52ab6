"""Shared test helpers: where the repository and the ../shared reference data are."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Under CI the property tests draw the same examples every run (a failure there reproduces locally with
# CI=true) and keep no example database between runs; elsewhere they search afresh each time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
    settings.load_profile("ci")

# tests of the cache expect it on unless they turn it off themselves: a user's INFERSIM_CACHE=off in
# the shell does not reach them
os.environ.pop("INFERSIM_CACHE", None)
# the on-disk cache of indexed kernel tables goes to a directory of this test session, not ~/.cache;
# the process that made it (pytest-xdist's controller, whose workers inherit it) removes it at exit
if "INFERSIM_CACHE_DIR" not in os.environ:
    os.environ["INFERSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="infersim-test-cache-")
    atexit.register(shutil.rmtree, os.environ["INFERSIM_CACHE_DIR"], ignore_errors=True)
#: for the environment of a test's subprocess: the session's cache (tables indexed once for all
#: tests, pytest-xdist's workers included), not the user's
TEST_CACHE_DIR = os.environ["INFERSIM_CACHE_DIR"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = REPO_ROOT.parent / "shared" / "reference"


#: the public measurements the package ships (infersim/validate/public): tests read them there, and
#: tests/test_validate_public.py holds them equal to ../shared/reference where that exists
PUBLIC_REFERENCE = REPO_ROOT / "infersim" / "validate" / "public"


def public_reference(name: str) -> Path:
    """A shipped public measurement file (validation.yaml, published.yaml)."""
    return PUBLIC_REFERENCE / name


#: the pytest-xdist group of the tests that share `commands_run_once` (one worker runs them all)
COMMANDS_RUN_ONCE = "commands-run-once"


@pytest.fixture(scope="session")
def commands_run_once() -> Any:
    """The docs' command runner (scripts/refresh_readme_example.py): each distinct command line runs
    once per session (several pages and tests show the same ~10 s `validate`); what it returns is
    standard output and error in the order written, and the exit status. Tests using it carry
    `pytest.mark.xdist_group(COMMANDS_RUN_ONCE)`."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import refresh_readme_example

    return refresh_readme_example.Runner()


def shared_reference(*parts: str) -> Path:
    """Path under ../shared/reference; skips the calling test with a clear reason when absent."""
    path = SHARED_REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not available: {path} (a user's clone has no ../shared)")
    return path
