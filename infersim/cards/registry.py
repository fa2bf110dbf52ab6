"""Where bundled cards, tables and example configs live, and how names resolve to files.

A name resolves in this order: an existing path (relative to the working directory or absolute);
then the bundled directory of that kind, with or without the `.yaml` ending. Bundled data sits at
the repository root in a checkout and under `infersim/_bundled/` in an installed wheel.
"""

from __future__ import annotations

from pathlib import Path

from infersim.errors import InferSimError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
KINDS = ("models", "hardware", "engines", "mfu_tables", "configs")


def bundled_dir(kind: str) -> Path:
    """The bundled directory for `kind` (one of KINDS), installed or in a checkout."""
    installed = _PACKAGE_DIR / "_bundled" / kind
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / kind


def display_path(path: Path | str) -> str:
    """A path as a report shows it: a bundled file as `<kind>/...` marked bundled (the same on every
    machine, whether installed or in a checkout), anything else as it was given."""
    path = Path(path)
    try:
        resolved = path.resolve()  # once, not once per kind: each resolve stats every component
    except OSError:
        return str(path)
    for kind in KINDS:
        try:
            inside = resolved.relative_to(bundled_dir(kind).resolve())
        except (ValueError, OSError):
            continue
        return f"{kind}/{inside.as_posix()} (bundled)"
    return str(path)


def bundled_names(kind: str) -> list[str]:
    directory = bundled_dir(kind)
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.yaml"))


def resolve_table_dir(name_or_path: str, relative_to: Path | None = None) -> Path | None:
    """A kernel-table directory: the path as given, else relative to `relative_to` (a config's own
    directory), else the bundled set of that name under mfu_tables/; None when none exists."""
    given = Path(name_or_path).expanduser()
    candidates = [given]
    if relative_to is not None and not given.is_absolute():
        candidates.append(relative_to / given)
    candidates.append(bundled_dir("mfu_tables") / name_or_path)
    return next((c for c in candidates if c.exists()), None)


def resolve(name_or_path: str, kind: str, relative_to: Path | None = None) -> Path:
    """Turn a bundled name or a path into an existing file path, or explain what was tried."""
    candidates = [Path(name_or_path).expanduser()]
    if relative_to is not None and not Path(name_or_path).is_absolute():
        candidates.append(relative_to / name_or_path)
    bundled = bundled_dir(kind)
    candidates += [bundled / name_or_path, bundled / f"{name_or_path}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates[:-2]:  # a path the user gave that names a directory
        if candidate.is_dir():
            raise InferSimError(f"{name_or_path}: is a directory, not a {kind[:-1] if kind.endswith('s') else kind} "
                                "file")
    known = ", ".join(bundled_names(kind)) or "none"
    raise InferSimError(
        f"{kind[:-1] if kind.endswith('s') else kind} '{name_or_path}' not found: no such file, and no bundled "
        f"{kind} entry of that name (bundled: {known})"
    )
