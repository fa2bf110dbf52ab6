"""What one process computes and the next can read back: the on-disk cache, plain data trusted nowhere.

A plain `infersim --config X.yaml` is a short process whose own work takes a few milliseconds; the
rest is work that gives the same answer every time (parsing the same YAML cards, indexing kernel
tables). Its results are kept here between processes as plain data: JSON only, never pickle and
never code, so reading an entry can build nothing but numbers, strings, lists and mappings.

Where: `platformdirs`' user cache directory for "infersim" (~/.cache/infersim on Linux);
INFERSIM_CACHE_DIR moves it; INFERSIM_CACHE=off turns it off. The directory is created mode 0700
and used only while it is a real directory (not a symbolic link) owned by this user that nobody else
can write to (no group or other write bit): anyone who can write to it could plant entries. A
directory failing that is not used, and the process says so once, on one line of stderr.

Every file is opened relative to the directory (opened once per process, without following a link)
and never through a symbolic link. An entry is written to a new file of a random name, created
exclusively (O_CREAT | O_EXCL | O_NOFOLLOW), then renamed over the entry's name, so that a reader
sees the old entry or the new one, and a link planted at either name is replaced, never followed.
Each entry starts with a header line (format, kind, a CRC-32 of its payload and the payload's length):
a torn or damaged file, or one InferSim did not write, fails that check before anything is decoded,
and its reader then checks the payload's structure and types (see the callers). Any entry failing a
check is a miss: it is deleted and computed again. The checksum finds damage, not intent: what keeps
others' files out is the directory's owner and mode.

The directory is bounded: after each write, when InferSim's files take more than the cap
(INFERSIM_CACHE_MAX_MB, default 256 MB; entries are a few KB of YAML, up to ~12 MB of indexed kernel
tables: all 27 aiconfigurator sets take ~175 MB), the least recently used are deleted, oldest first,
until they take at most three quarters of it. Reading an entry marks it used (at most once a day). Pruning and `infersim cache clear`
delete only files whose names InferSim writes (ENTRY_NAME, TEMPORARY_NAME, and EARLIER_NAME: the
names of earlier versions' entries): a user's files in a directory named by INFERSIM_CACHE_DIR stay.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

# The names InferSim writes, matched whole (compiled at the first write, prune or clear: a run that
# only reads compiles none). The entries this version reads and writes: <kind>-<64-bit checksum of
# what they stand for>.entry
ENTRY_NAME = r"(yaml|tables)-[0-9a-f]{16}\.entry"
#: a writer's file before it is renamed into place
TEMPORARY_NAME = r"\.tmp-[0-9a-f]{32}"
#: entries of earlier versions (parsed YAML and pickled tables, compiled dataclass code, and their
#: writers' files): never read, deleted by pruning and `cache clear`
EARLIER_NAME = (r"(?:yaml-[0-9a-f]{8}\.marshal|tables-[0-9a-f]{16}\.pickle"
                r"|dataclass-code-[a-z]+-[0-9a-f]+-infersim(?:\.[a-z0-9_]+)*-[0-9a-f]{8}\.marshal)"
                r"(?:\.[0-9]+\.partial)?|tables-[0-9a-f]{16}\.[0-9]+\.partial")

FORMAT = b"infersim-cache-1"
DEFAULT_MAX_MB = 256.0
_TOUCH_AFTER_S = 86400.0  # an entry read is marked used at most once a day (a write per read would cost)
_STALE_TEMPORARY_S = 3600.0  # a writer's temporary file this old belongs to a process that died
_HEADER_MAX = 128  # bytes: the header line is ~40

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOSE_ON_EXEC = getattr(os, "O_CLOEXEC", 0)
_NON_BLOCKING = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted at an entry's name must not hang the reader
#: whether this platform opens files relative to a directory and refuses links (POSIX)
SUPPORTED = bool(_NO_FOLLOW and _DIRECTORY) and os.open in os.supports_dir_fd

# The directory as this process found it, per path (a test may move it): its open descriptor, or
# None with the reason it is not used. The warning is printed once per path and process.
_OPENED: dict[str, tuple[int | None, str]] = {}


_OFF = ("0", "off", "no", "false")
_ON = ("", "1", "on", "yes", "true")
# settings already warned about in this process (a warning is said once, not once per entry)
_WARNED: set[str] = set()


def _warn_once(text: str) -> None:
    if text not in _WARNED:
        _WARNED.add(text)
        print(f"infersim: warning: {text}", file=sys.stderr)


def cache_dir() -> str | None:
    """The cache directory as configured (not checked; it may not exist yet), or None where the
    cache is turned off."""
    setting = os.environ.get("INFERSIM_CACHE", "").strip().lower()
    if setting in _OFF:
        return None
    if setting not in _ON:
        _warn_once(f"INFERSIM_CACHE={os.environ['INFERSIM_CACHE']!r} is neither off ({', '.join(_OFF)}) nor on "
                   f"({', '.join(v for v in _ON if v)}); the on-disk cache stays on")
    chosen = os.environ.get("INFERSIM_CACHE_DIR")
    if not chosen:
        import platformdirs  # here: a run whose directory is named imports none of it

        chosen = platformdirs.user_cache_dir("infersim", appauthor=False)
    return os.path.abspath(chosen)


def max_bytes() -> float:
    """The cache's size cap in bytes (INFERSIM_CACHE_MAX_MB; a value that is not a positive number:
    the default)."""
    text = os.environ.get("INFERSIM_CACHE_MAX_MB", "")
    if not text:
        return DEFAULT_MAX_MB * 1e6
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if mb > 0 and math.isfinite(mb):
        return mb * 1e6
    _warn_once(f"INFERSIM_CACHE_MAX_MB={text!r} is not a positive number of MB; the cache is held to the default "
               f"{DEFAULT_MAX_MB:g} MB")
    return DEFAULT_MAX_MB * 1e6


def _user_id() -> int:
    return os.getuid()


def check_directory(root: str, create: bool = True) -> tuple[int | None, str]:
    """(open descriptor of `root`, "") where the cache may use it, else (None, why not). Created
    mode 0700 where absent (when `create`). Refused: a symbolic link, not a directory, another
    user's, or writable by group or others."""
    if not SUPPORTED:
        return None, "this platform cannot open files without following symbolic links"
    if create:
        try:
            os.makedirs(os.path.dirname(root), exist_ok=True)
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return None, f"cannot create it ({exc.strerror})"
    try:
        fd = os.open(root, os.O_RDONLY | _DIRECTORY | _NO_FOLLOW | _CLOSE_ON_EXEC)
    except FileNotFoundError:
        return None, "it does not exist"
    except OSError as exc:
        is_link = os.path.islink(root)
        return None, "it is a symbolic link" if is_link else f"cannot open it ({exc.strerror})"
    problem = _unsafe(os.fstat(fd))
    if problem:
        os.close(fd)
        return None, problem
    return fd, ""


def _unsafe(st: os.stat_result) -> str:
    """Why a directory of this status must not hold the cache, or ""."""
    if st.st_uid != _user_id():
        return f"it belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others can write to it (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def _directory() -> int | None:
    """The open cache directory, checked once per process, or None (off, or refused: said once)."""
    root = cache_dir()
    if root is None:
        return None
    found = _OPENED.get(root)
    if found is None:
        found = _OPENED[root] = check_directory(root)
        if found[1]:
            print(f"infersim: warning: not using the cache directory {root}: {found[1]}; running without the "
                  f"on-disk cache (INFERSIM_CACHE_DIR moves it, INFERSIM_CACHE=off turns it off)", file=sys.stderr)
    return found[0]


# ---------------------------------------------------------------------------------------------
# Entries


def _wrap(kind: str, payload: bytes) -> bytes:
    return b"%s %s %08x %d\n" % (FORMAT, kind.encode(), zlib.crc32(payload), len(payload)) + payload


def _unwrap(data: bytes, kind: str) -> bytes | None:
    """The payload of an entry of `kind` whose header, length and checksum hold, else None."""
    end = data.find(b"\n", 0, _HEADER_MAX)
    if end < 0:
        return None
    fields = data[:end].split(b" ")
    payload = data[end + 1:]
    if len(fields) != 4 or fields[0] != FORMAT or fields[1] != kind.encode():
        return None
    if fields[3] != b"%d" % len(payload) or fields[2] != b"%08x" % zlib.crc32(payload):
        return None
    return payload


def _read_file(directory: int, name: str) -> bytes | None:
    """The bytes of regular file `name` (marked used), None where absent; anything else at that
    name (a link, a FIFO, a directory, a file larger than the cap) is discarded."""
    try:
        fd = os.open(name, os.O_RDONLY | _NO_FOLLOW | _NON_BLOCKING | _CLOSE_ON_EXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError:  # a symbolic link (ELOOP), or unreadable
        discard(name)
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes():
            data = None
        else:
            data = f.read()  # one read: the entry is checked whole
            if time.time() - st.st_mtime > _TOUCH_AFTER_S:
                _touch(fd)
    if data is None:
        discard(name)
    return data


def _touch(fd: int) -> None:
    """Mark an entry used now (the least recently used go first when the cache is pruned)."""
    try:
        os.utime(fd)
    except OSError:
        pass


def read_entry(name: str, kind: str) -> bytes | None:
    """The payload of entry `name` (of `kind`) whose header and checksum hold, else None (cache off,
    absent, or damaged or foreign: then deleted)."""
    directory = _directory()
    if directory is None:
        return None
    try:
        data = _read_file(directory, name)
    except OSError:
        return None
    if data is None:
        return None
    payload = _unwrap(data, kind)
    if payload is None:
        discard(name)
    return payload


def write_entry(name: str, kind: str, payload: bytes) -> None:
    """Store `payload` as entry `name` of `kind`: written to a new file of a random name, then
    renamed into place (a reader sees the old entry or the new one). Failures are ignored: only a
    later process is slower."""
    if kind_of(name) != kind:
        raise ValueError(f"not a cache entry name of kind {kind}: {name!r}")
    directory = _directory()
    if directory is None:
        return
    created = _create_temporary(directory)
    if created is None:
        return
    fd, temporary = created
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_wrap(kind, payload))
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError:
        _remove(directory, temporary)
        return
    prune()


def _create_temporary(directory: int) -> tuple[int, str] | None:
    """(descriptor, name) of a new file of a random name, created here and now (never an existing
    file or a link's target: O_EXCL | O_NOFOLLOW), or None."""
    for _attempt in range(3):  # a name taken (planted) is tried again under another
        temporary = f".tmp-{os.urandom(16).hex()}"
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW | _CLOSE_ON_EXEC, 0o600,
                           dir_fd=directory), temporary
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def discard(name: str) -> None:
    """Delete entry `name` (found damaged or foreign; a link itself, never what it points to)."""
    directory = _directory()
    if directory is not None and kind_of(name) in ("yaml", "tables"):
        _remove(directory, name)


def _remove(directory: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=directory)  # unlink removes a link, never its target
        return True
    except OSError:
        return False


def read_json(name: str, kind: str) -> Any:
    """The JSON value stored as entry `name` (of `kind`), or None (absent, damaged: then deleted)."""
    payload = read_entry(name, kind)
    if payload is None:
        return None
    import json  # here: a run with the cache off needs none of it

    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        discard(name)
        return None


def write_json(name: str, kind: str, value: Any) -> None:
    """Store plain data `value` (JSON's types) as entry `name`; a value JSON cannot hold is not kept."""
    import json

    try:
        payload = json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError):
        return
    write_entry(name, kind, payload)


def checksum_name(kind: str, text: str) -> str:
    """The entry name of `kind` standing for `text` (a key; the entry holds the key itself, so a
    name shared by two keys is only a miss). zlib's checksums: hashlib costs ~3 ms to import."""
    data = text.encode("utf-8", "surrogatepass")
    return f"{kind}-{zlib.crc32(data):08x}{zlib.adler32(data):08x}.entry"


# ---------------------------------------------------------------------------------------------
# The directory as a whole: pruning, what it holds, clearing


def kind_of(name: str) -> str | None:
    """What a file of the cache directory is by its name ("yaml", "tables", "unfinished write",
    "earlier version"), or None: not InferSim's."""
    entry = re.fullmatch(ENTRY_NAME, name)
    if entry:
        return entry.group(1)
    if re.fullmatch(TEMPORARY_NAME, name):
        return "unfinished write"
    if re.fullmatch(EARLIER_NAME, name):
        return "earlier version"
    return None


class OwnFile(NamedTuple):  # a NamedTuple: ~5x cheaper to define than a dataclass, in every process
    """One of InferSim's files in the cache directory."""

    name: str
    kind: str
    size: int  # bytes
    mtime: float  # seconds since the epoch


def own_files(directory: int) -> Iterator[OwnFile]:
    """InferSim's files in the open directory: regular files and links (never followed: a link's
    size is its own) of InferSim's names; others' files, and directories, are not listed."""
    with os.scandir(directory) as it:
        for entry in it:
            kind = kind_of(entry.name)
            if kind is not None and (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                st = entry.stat(follow_symlinks=False)
                yield OwnFile(entry.name, kind, st.st_size, st.st_mtime)


def prune(cap: float | None = None) -> list[str]:
    """Delete the least recently used of InferSim's files (oldest modification time first) while
    they take more than `cap` bytes (default: max_bytes()), down to three quarters of it; temporary
    files of writers that died go too. Returns the names deleted. Failures are ignored."""
    directory = _directory()
    if directory is None:
        return []
    cap = max_bytes() if cap is None else cap
    now = time.time()
    removed = []
    try:
        files = []
        for found in own_files(directory):
            if found.kind == "unfinished write":
                if now - found.mtime > _STALE_TEMPORARY_S and _remove(directory, found.name):
                    removed.append(found.name)
                continue
            files.append(found)
    except OSError:
        return removed
    total = sum(f.size for f in files)
    if total <= cap:
        return removed
    for found in sorted(files, key=lambda f: (f.mtime, f.name)):
        if total <= 0.75 * cap:
            break
        if _remove(directory, found.name):
            removed.append(found.name)
            total -= found.size
    return removed


class CacheState(NamedTuple):
    """What `infersim cache info` shows."""

    directory: str | None  # None: turned off (INFERSIM_CACHE=off)
    problem: str  # why the directory is not used, or ""
    cap: float  # bytes
    files: tuple[OwnFile, ...]  # InferSim's files in it


def _inspect(create: bool) -> tuple[str | None, int | None, str]:
    root = cache_dir()
    if root is None:
        return None, None, ""
    fd, problem = check_directory(root, create=create)
    return root, fd, problem


def cache_state() -> CacheState:
    """The cache directory, whether it is used, and InferSim's files in it (nothing is created)."""
    root, fd, problem = _inspect(create=False)
    files: tuple[OwnFile, ...] = ()
    if fd is not None:
        try:
            files = tuple(own_files(fd))
        finally:
            os.close(fd)
    return CacheState(root, problem, max_bytes(), files)


def clear(on_refused: Callable[[str, str], None]) -> tuple[OwnFile, ...]:
    """Delete every one of InferSim's files from the cache directory, nothing else; returns them.
    A directory refused for the cache (`on_refused(directory, why)`) is left alone."""
    root, fd, problem = _inspect(create=False)
    if root is None or fd is None:
        if root is not None and problem != "it does not exist":
            on_refused(root, problem)
        return ()
    try:
        return tuple(found for found in own_files(fd) if _remove(fd, found.name))
    finally:
        os.close(fd)
