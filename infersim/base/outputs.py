"""Where a command may write a file, checked before the work that fills it starts.

A command that finds out only after a long search that its output path names a directory, a
missing directory or one of its own input files has either lost the work or, worse, replaced the
input with its answer; these checks run first and answer in one line naming the flag and the value.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

from infersim.base.errors import InferSimError, shorten

PathLike = Union[str, "os.PathLike[str]"]

#: the run flags that may name a file the command reads (cards and configs are paths or bundled names)
RUN_INPUT_FLAGS = {"--config": "config", "--model": "model", "--hardware": "hardware", "--engine": "engine",
                   "--calibration": "calibration", "--mfu-tables": "mfu_tables"}

#: what a 'wrote' line says where a default-named output replaced a file the user did not name
REPLACING = "replacing the file there"


def inputs_of(args: Any, flags: Mapping[str, str] = RUN_INPUT_FLAGS) -> dict[str, Any]:
    """The values of `args` under `flags` (flag -> attribute), for check_output_path's `inputs`."""
    return {flag: getattr(args, attr, None) for flag, attr in flags.items()}


def _named_files(value: Any) -> list[str]:
    """The existing paths an input value names: one path, a list of them, or a glob (a trace
    option takes one); names that are not paths (a bundled card name) name nothing."""
    if value is None or value == "":
        return []
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if os.path.exists(text):
            return [text]
        return sorted(glob.glob(text)) if glob.has_magic(text) else []
    if isinstance(value, Iterable):
        return [path for item in value for path in _named_files(item)]
    return []


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_input_overwrite(path: PathLike, flag: str, inputs: Mapping[str, Any]) -> None:
    """Refuse an output that is, through any link, one of the files the command reads."""
    text = os.fspath(path)
    if not os.path.exists(text):
        return
    for label, value in inputs.items():
        for named in _named_files(value):
            if _same_file(text, named):
                shown = f" {shorten(named)}"
                raise InferSimError(f"{flag} {shorten(text)}: is the same file as {label}{shown}, an input of this "
                                    f"command; writing it would replace that input: give another {flag}")


def check_output_path(path: PathLike, flag: str, inputs: Mapping[str, Any] | None = None) -> Path:
    """Refuse, in one line naming `flag` and `path`, an output file that cannot or must not be
    written: an empty name, a directory, a symbolic link to nothing, a parent that is missing or not
    a directory, or one of the command's `inputs` (label -> path, paths or glob). An existing
    regular file is accepted: the caller decides whether it may be replaced."""
    text = os.fspath(path)
    if not text:
        raise InferSimError(f"{flag} '': give a file name")
    if "\0" in text:
        raise InferSimError(f"{flag} {shorten(repr(text))}: a file name cannot hold a NUL character")
    try:
        _check_place(text, flag)
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise InferSimError(f"{flag} {shorten(text)}: cannot be written ({exc.strerror or exc})") from None
    refuse_input_overwrite(text, flag, inputs or {})
    return Path(text)


def _check_place(text: str, flag: str) -> None:
    target = Path(text)
    if target.is_symlink() and not target.exists():
        raise InferSimError(f"{flag} {shorten(text)}: a symbolic link to {shorten(os.readlink(text))}, which does not "
                            "exist; give the file itself")
    if target.is_dir():
        raise InferSimError(f"{flag} {shorten(text)}: is a directory; give a file name")
    parent = target.parent
    if not parent.exists():
        raise InferSimError(f"{flag} {shorten(text)}: directory {shorten(str(parent))} does not exist")
    if not parent.is_dir():
        raise InferSimError(f"{flag} {shorten(text)}: {shorten(str(parent))} is not a directory")


def replacing(path: PathLike, what: str = "") -> str:
    """What a 'wrote' line adds after `path` (asked before writing it): `what`, and where a file is
    there now, REPLACING, in one parenthesis ('' where there is neither)."""
    parts = [part for part in (what, REPLACING if os.path.lexists(os.fspath(path)) else "") if part]
    return f" ({'; '.join(parts)})" if parts else ""
