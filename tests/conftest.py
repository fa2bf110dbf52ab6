"""Shared test helpers: where the repository and the ../shared reference data are."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = REPO_ROOT.parent / "shared" / "reference"


def shared_reference(*parts: str) -> Path:
    """Path under ../shared/reference; skips the calling test with a clear reason when absent."""
    path = SHARED_REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not available: {path} (a user's clone has no ../shared)")
    return path
