"""Indexed kernel tables kept on disk between processes.

Reading and indexing aiconfigurator's H100 tables takes 1.6 s, unpickling them 0.2 s: indexed
tables (infersim.tables.lookup.MfuTables) are kept keyed by the directory, its files' sizes and
mtimes, and this package's table code, so an edited table or a new build is read afresh.
INFERSIM_CACHE=off turns it off; INFERSIM_CACHE_DIR moves it (infersim.base.diskcache). Each grid is
pickled on its own and unpickled when first asked for (KeptGrids), the rows the hardware check
reads only for the full check (KeptRows).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Hashable

# the code that shapes what is kept: the table format, the indexing and the kernel shapes (kernels.py:
# the bytes check_hardware compares are computed at indexing)
_CODE_FILES = ("tables/format.py", "tables/table_files.py", "tables/lookup.py", "tables/interpolation.py", "tables/grid_keys.py",
               "tables/series.py", "tables/table_cache.py", "shapes/kernels.py", "shapes/comm_shapes.py")
#: interpolations that pickle (the log-efficiency one holds a lambda)
_PICKLED_INTERPOLATIONS = ("time-in-work-convex-envelope", "time-in-work")


def cache_file(directory: Path, interpolation: str,
               stamp: tuple[tuple[str, int, int], ...]) -> tuple[Path, str] | None:
    """(cache file, its key) for a table directory indexed with `interpolation` (by name), or None
    where not cached. The file's name is a 64-bit checksum of the key (zlib's: hashlib costs ~3 ms
    to import in every process) and the file holds the key itself, so a name shared by two keys is
    only a cache miss."""
    import zlib

    from infersim.base.diskcache import cache_dir

    root = cache_dir()
    if root is None or interpolation not in _PICKLED_INTERPOLATIONS:
        return None
    package = Path(__file__).resolve().parent.parent
    try:
        code = tuple((name, (package / name).stat().st_mtime_ns, (package / name).stat().st_size)
                     for name in _CODE_FILES)
    except OSError:
        return None
    key = repr((str(directory.resolve()), interpolation, stamp, code))
    data = key.encode()
    return Path(root) / f"tables-{zlib.crc32(data):08x}{zlib.adler32(data):08x}.pickle", key


_UNSEEN = object()  # a key KeptGrids has not looked for yet


class KeptGrids(Mapping):
    """Grids as kept on disk: each one pickled on its own and unpickled when first asked for. A run
    looks up a handful of the tens of grids of a table set (82 for the H20's), and unpickling them
    all was most of reading the kept tables."""

    def __init__(self, pickled: dict[Hashable, bytes]) -> None:
        self._pickled = pickled
        self._grids: dict[Hashable, Any] = {}

    @classmethod
    def of(cls, grids: Mapping[Hashable, Any]) -> KeptGrids:
        import pickle

        return cls({k: pickle.dumps(grid, protocol=pickle.HIGHEST_PROTOCOL) for k, grid in grids.items()})

    def __getitem__(self, key: Hashable) -> Any:
        grid = self.get(key)
        if grid is None:
            raise KeyError(key)
        return grid

    def get(self, key: Hashable, default: Any = None) -> Any:
        # a lookup of a kernel no table holds asks for a key that is not there: no KeyError raised
        # and caught for it (Mapping.get's way), which cost more than the lookup; and the answer is
        # kept, so that the next such lookup hashes the key once (a sweep asks again at every point)
        grid = self._grids.get(key, _UNSEEN)
        if grid is _UNSEEN:
            pickled = self._pickled.get(key)
            grid = self._grids[key] = None if pickled is None else _unpickler().loads(pickled)
        return default if grid is None else grid

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._pickled)

    def __len__(self) -> int:
        return len(self._pickled)

    def __reduce__(self) -> tuple[type, tuple[dict[Hashable, bytes]]]:
        return KeptGrids, (self._pickled,)


class KeptRows:
    """The rows check_hardware checks, as kept on disk: unpickled only for the full check (which a
    card passing on the rows' fastest rates skips: see MfuTables._may_beat_hbm)."""

    def __init__(self, pickled: bytes) -> None:
        self._pickled = pickled

    @classmethod
    def of(cls, rows: Iterator[tuple[str, float, float, str]]) -> KeptRows:
        import pickle

        return cls(pickle.dumps(tuple(rows), protocol=pickle.HIGHEST_PROTOCOL))

    def __iter__(self) -> Iterator[tuple[str, float, float, str]]:
        return iter(_unpickler().loads(self._pickled))


def _unpickler() -> Any:
    """The C unpickler alone: the pickle module around it (its Python pickler) is ~1 ms to import."""
    try:
        import _pickle as unpickler
    except ImportError:  # a Python without it
        import pickle as unpickler
    return unpickler


def read_kept(path: Path, key: str) -> Any | None:
    """What `keep` wrote to `path` under `key`, or None (absent, unreadable, another key or build)."""
    try:
        with path.open("rb") as f:
            kept_key, kept = _unpickler().load(f)
            from infersim.base.diskcache import mark_used

            mark_used(f)
    except Exception:  # absent, unreadable or from another build: read the tables instead
        return None
    return kept if kept_key == key else None


def keep(path: Path, key: str, tables: Any) -> None:
    """Write `tables.kept()` (the copy to keep: see MfuTables.kept) to `path` under `key`; a failure
    only leaves the next process slower."""
    import os
    import pickle

    try:
        kept = tables.kept()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with partial.open("wb") as f:
            pickle.dump((key, kept), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return  # a read-only home or an unpicklable table set: only the next process is slower
    from infersim.base.diskcache import prune

    prune(str(path.parent))  # the cache directory stays under its cap (INFERSIM_CACHE_MAX_MB)
