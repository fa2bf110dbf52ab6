"""What one process computes and the next can read back: the on-disk cache directory.

A plain `infersim --config X.yaml` is a short process whose own work takes a few milliseconds; the
rest is work that gives the same answer every time (compiling the dataclasses' generated methods,
parsing the same YAML cards, indexing kernel tables). That work is kept here between processes.
INFERSIM_CACHE=off turns the cache off; INFERSIM_CACHE_DIR moves it (default ~/.cache/infersim,
or $XDG_CACHE_HOME/infersim). Every entry is checked against what it stands for before use, so a
stale or damaged file only costs the time it was meant to save.

The directory is bounded: after each write, when its files take more than the cap
(INFERSIM_CACHE_MAX_MB, default 256 MB; entries are ~0.1 MB of code or YAML, up to ~20 MB of
indexed kernel tables), the least recently used files are deleted, oldest first, until they take
at most three quarters of it (so that a full cache is not listed again at every write). Reading an
entry marks it used (its modification time is moved to now, at most once a day per entry).

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


DEFAULT_MAX_MB = 256.0
_TOUCH_AFTER_S = 86400.0  # an entry read is marked used at most once a day (a write per read would cost)
_STALE_PARTIAL_S = 3600.0  # a writer's partial file this old belongs to a process that died


def max_bytes() -> float:
    """The cache's size cap in bytes (INFERSIM_CACHE_MAX_MB; a value that is not a positive number:
    the default)."""
    text = os.environ.get("INFERSIM_CACHE_MAX_MB", "")
    try:
        mb = float(text) if text else DEFAULT_MAX_MB
    except ValueError:
        mb = DEFAULT_MAX_MB
    return mb * 1e6 if mb > 0 and mb == mb and mb != float("inf") else DEFAULT_MAX_MB * 1e6


def mark_used(f: Any) -> None:
    """Move an open entry's modification time to now when it is older than a day (least recently
    used entries go first when the cache is pruned)."""
    try:
        import time

        now = time.time()
        if now - os.fstat(f.fileno()).st_mtime > _TOUCH_AFTER_S:
            os.utime(f.fileno(), (now, now))
    except (OSError, NotImplementedError, ValueError):
        pass


def read_marshal(name: str) -> Any:
    """The object stored under `name` by write_marshal, or None (cache off, absent, unreadable)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()  # one read: marshal.load(file) reads piece by piece, ~5x slower
            mark_used(f)
            return marshal.loads(data)
    except Exception:  # absent, damaged, or written by another Python: the caller recomputes
        return None


def prune(root: str | None = None, cap: float | None = None) -> list[str]:
    """Delete the least recently used entries (oldest modification time first) while the cache
    directory holds more than `cap` bytes (default: max_bytes()), down to three quarters of it;
    partial files of writers that died go too. Returns the names deleted. Failures are ignored."""
    root = root or cache_dir()
    if root is None:
        return []
    cap = max_bytes() if cap is None else cap
    try:
        entries = []
        import time

        now = time.time()
        removed = []
        with os.scandir(root) as it:
            for entry in it:
                if not entry.is_file(follow_symlinks=False):
                    continue
                stat = entry.stat(follow_symlinks=False)
                if entry.name.endswith(".partial"):
                    if now - stat.st_mtime > _STALE_PARTIAL_S:
                        os.remove(entry.path)
                        removed.append(entry.name)
                    continue
                entries.append((stat.st_mtime, entry.name, stat.st_size))
        total = sum(size for _t, _n, size in entries)
        if total <= cap:
            return removed
        for _mtime, name, size in sorted(entries):
            if total <= 0.75 * cap:
                break
            try:
                os.remove(os.path.join(root, name))
                removed.append(name)
                total -= size
            except OSError:
                pass
        return removed
    except OSError:
        return []


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
        return
    prune(root)
