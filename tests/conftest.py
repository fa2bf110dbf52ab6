"""Shared test helpers: where the repository and the ../shared reference data are."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Under CI the property tests draw the same examples every run (a failure there reproduces locally with
# CI=true) and keep no example database between runs; elsewhere they search afresh each time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
    settings.load_profile("ci")

# the on-disk cache of indexed kernel tables goes to a directory of this test session, not ~/.cache
os.environ.setdefault("INFERSIM_CACHE_DIR", tempfile.mkdtemp(prefix="infersim-test-cache-"))
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


def shared_reference(*parts: str) -> Path:
    """Path under ../shared/reference; skips the calling test with a clear reason when absent."""
    path = SHARED_REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not available: {path} (a user's clone has no ../shared)")
    return path
