"""What one process computes and the next can read back: the on-disk cache directory.

A plain `infersim --config X.yaml` is a short process whose own work takes a few milliseconds; the
rest is work that gives the same answer every time (compiling the dataclasses' generated methods,
parsing the same YAML cards, indexing kernel tables). That work is kept here between processes.
INFERSIM_CACHE=off turns the cache off; INFERSIM_CACHE_DIR moves it (default ~/.cache/infersim,
or $XDG_CACHE_HOME/infersim). Every entry is checked against what it stands for before use, so a
stale or damaged file only costs the time it was meant to save.

This module is imported first by every process (infersim/__init__.py): stdlib `os` and `marshal`
only, both already loaded by the interpreter's own start.
"""

from __future__ import annotations

import marshal
import os
from typing import Any


def cache_dir() -> str | None:
    """The cache directory (it may not exist yet), or None where the cache is turned off."""
    if os.environ.get("INFERSIM_CACHE", "").strip().lower() in ("0", "off", "no", "false"):
        return None
    return os.environ.get("INFERSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "infersim")


def read_marshal(name: str) -> Any:
    """The object stored under `name` by write_marshal, or None (cache off, absent, unreadable)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        with open(os.path.join(root, name), "rb") as f:
            return marshal.loads(f.read())  # one read: marshal.load(file) reads piece by piece, ~5x slower
    except Exception:  # absent, damaged, or written by another Python: the caller recomputes
        return None


def write_marshal(name: str, value: Any) -> None:
    """Store `value` (marshal's types only) under `name`, atomically: a concurrent reader sees the
    old file or the new one. Failures are ignored: only a later process is slower."""
    root = cache_dir()
    if root is None:
        return
    try:
        os.makedirs(root, exist_ok=True)
        path = os.path.join(root, name)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "wb") as f:
            marshal.dump(value, f)
        os.replace(partial, path)
    except (OSError, ValueError):
        pass
