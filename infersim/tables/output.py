"""Writing a kernel-table directory without touching what InferSim did not write.

A table directory is something people download and share, so nothing in it is trusted: the table
list of a `provenance.yaml` found there names files to replace only when the provenance is one
InferSim writes (its header line, its format version, a schema that loads) and only for names that
are plain CSV (or .csv.gz) file names inside the directory (no separator, no `..`, no absolute path), and only
files that are regular files, never a symlink. Everything else in the directory is left alone.

Rules for an output directory `--out DIR`:
  - DIR, or a directory above it, is a regular file: refused.
  - DIR does not exist or is empty: written.
  - DIR holds anything: refused unless `force`; with `force`, InferSim's own files there (the
    provenance and the tables it lists, checked as above) are replaced and every other file stays
    where it is. A CSV or a `provenance.yaml` that is not InferSim's is refused even then, under
    whatever name (a table the new set also writes included): a table directory holds only listed
    tables, and that file is not InferSim's to replace or delete.
Tables are written first into a temporary directory beside DIR and read back through the same
checks a run applies (the number rule, efficiencies against peaks); only a set that passes is moved
into place, so a failed write leaves the old tables as they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from infersim.base.errors import ConfigError, InferSimError
from infersim.tables.format import FORMAT_VERSION, PROVENANCE_FILE, PROVENANCE_HEADER, TableDirectory


def is_plain_table_name(name: str) -> bool:
    """A name InferSim may have written as a table: a CSV (or gzip-compressed CSV) file name, nothing
    that leaves the directory."""
    return (isinstance(name, str) and name.endswith((".csv", ".csv.gz")) and name not in (".", "..")
            and "/" not in name and "\\" not in name and "\0" not in name and not name.startswith(".")
            and not os.path.isabs(name) and len(name) <= 255)


def _regular_file(path: Path) -> bool:
    try:
        return path.is_file() and not path.is_symlink()
    except OSError:
        return False


def owned_tables(directory: Path) -> set[str] | None:
    """The table files InferSim wrote in `directory`, as its own provenance lists them (plain CSV
    names of regular files in the directory only), or None where the directory holds no provenance
    of InferSim's."""
    path = directory / PROVENANCE_FILE
    if not _regular_file(path):
        return None
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if first != PROVENANCE_HEADER:
        return None
    from infersim.tables.table_files import read_provenance

    try:
        provenance = read_provenance(directory)
    except (ConfigError, InferSimError):
        return None
    if provenance.format_version != FORMAT_VERSION:
        return None
    return {name for name in provenance.tables if is_plain_table_name(name) and _regular_file(directory / name)}


def check_output_dir(directory: Path, force: bool, flag: str = "--out") -> None:
    """Refuse an output directory that is a file, or that holds anything, unless `force`."""
    if directory.is_symlink() and not directory.exists():
        raise InferSimError(f"{flag} {directory}: a broken symbolic link; give a directory")
    if directory.exists() and not directory.is_dir():
        raise InferSimError(f"{flag} {directory}: is a file, not a directory; give a directory for the tables")
    _check_ancestors(directory, flag)
    if not directory.exists():
        return
    if force:
        refuse_foreign_tables(directory, flag)  # before any work: --force replaces only what InferSim wrote
        return
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        raise InferSimError(f"{flag} {directory}: cannot be read ({exc.strerror})") from None
    if not entries:
        return
    owned = owned_tables(directory)
    if owned is not None:
        raise InferSimError(f"{flag} {directory}: already holds kernel tables ({len(owned)} tables); give --force "
                            f"to replace them, or another {flag}")
    raise InferSimError(f"{flag} {directory}: is not empty and is not a kernel-table directory (it holds "
                        f"{entries[0]!r}{' and more' if len(entries) > 1 else ''}); give an empty or new "
                        f"directory, or --force to write the tables beside what is there")


def write_table_dir(directory: Path, table_dir: TableDirectory, force: bool = False) -> None:
    """Write `table_dir` (provenance and CSVs) to `directory` under the rules of this module."""
    from infersim.tables.table_files import read_table_dir, write_table_files

    directory = Path(directory)
    check_output_dir(directory, force)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.writing-", dir=parent))
    try:
        write_table_files(staging, table_dir)
        try:
            read_table_dir(staging)  # the run's own checks: a set that would not load is not installed
        except (ConfigError, InferSimError) as exc:
            raise InferSimError(f"{directory}: the tables to write do not pass the table checks, nothing was "
                                f"written: {exc}") from None
        _install(staging, directory, set(table_dir.tables))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_ancestors(directory: Path, flag: str) -> None:
    """The nearest existing directory above `directory` must be one: the tables cannot go under a file."""
    for parent in directory.parents:
        if parent.is_symlink() or parent.exists():
            if not parent.is_dir():
                raise InferSimError(f"{flag} {directory}: {parent} is not a directory; give a directory for the tables")
            return


def refuse_foreign_tables(directory: Path, flag: str = "--out") -> None:
    """A CSV in the directory that InferSim did not write would make the directory fail to load
    (every CSV there must be a listed table), and neither it nor a `provenance.yaml` InferSim did
    not write is InferSim's to replace or delete, even with --force and even where a new table
    has its name."""
    owned = owned_tables(directory)
    foreign = sorted(p.name for p in [*directory.glob("*.csv"), *directory.glob("*.csv.gz")]
                     if p.name not in (owned or ()))
    if foreign:
        raise InferSimError(f"{flag} {directory}: holds {foreign[0]!r}, a CSV InferSim did not write (a table directory holds "
                            f"only the tables its provenance lists); move it away or write to another directory")
    if owned is None and os.path.lexists(directory / PROVENANCE_FILE):
        raise InferSimError(f"{flag} {directory}: holds {PROVENANCE_FILE!r}, a file InferSim did not write (not a kernel-table "
                            f"provenance of this format); move it away or write to another directory")


def _install(staging: Path, directory: Path, new_tables: set[str]) -> None:
    """Move the staged files into `directory`: the whole staging directory where `directory` does
    not exist, else file by file (each replacement atomic), then remove the tables the old
    provenance listed that the new one does not."""
    if not directory.exists():
        os.replace(staging, directory)
        staging.mkdir()  # the caller removes it
        return
    old = owned_tables(directory) or set()
    for name in sorted(new_tables | {PROVENANCE_FILE}):
        target = directory / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise InferSimError(f"{target}: is a link or a directory, not a table InferSim wrote; it was left "
                                f"alone and nothing was written")
    for name in sorted(new_tables):
        os.replace(staging / name, directory / name)
    os.replace(staging / PROVENANCE_FILE, directory / PROVENANCE_FILE)
    for name in sorted(old - new_tables):
        stale = directory / name
        if _regular_file(stale):
            stale.unlink()


def clear_own_tables(directory: Path, force: bool) -> None:
    """Prepare `directory` for a writer that fills it file by file (`mfu bench`): refused as
    check_output_dir refuses; the tables an earlier InferSim provenance there lists are removed
    (regular files with plain names only), and a CSV InferSim did not write is refused."""
    check_output_dir(directory, force)
    if not directory.exists():
        return
    for name in sorted(owned_tables(directory) or ()):
        (directory / name).unlink()
