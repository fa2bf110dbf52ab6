"""Compiled code of the dataclasses' generated methods, kept between processes.

`@dataclass` writes each class's __init__, __repr__, __eq__, __hash__, __setattr__ and __delattr__
as source text and compiles it with `exec`: for InferSim's ~60 frozen dataclasses that compiling
is about 30 ms of every process, a third of a plain run. The text is the same in every process,
so its code object (what `compile` returns for it) is kept on disk, keyed by the text itself and
the Python build, and `exec` runs the kept code instead of compiling it again: the class gets the
same methods, built by dataclasses itself from the same code.

Installed by the command-line process only (`python -m infersim`, infersim/__main__.py), never
when a program imports infersim as a library. Only classes of InferSim's own modules use the cache (the module's globals are those dataclasses
executes the text in); all others compile as before. New entries are written when the process
ends. INFERSIM_CACHE=off turns it off with the other caches (infersim.diskcache).
"""

from __future__ import annotations

import builtins
import dataclasses
import sys
from types import CodeType
from typing import Any

from infersim import diskcache

#: kept entries at most (InferSim needs ~400; classes of an older build are dropped past this)
MAX_ENTRIES = 4096
_FILE = f"dataclass-code-{sys.implementation.name}-{sys.hexversion:x}.marshal"

_codes: dict[str, CodeType] = {}
_new: dict[str, CodeType] = {}


def _exec(source: Any, globals: Any = None, locals: Any = None, /, **kwargs: Any) -> Any:
    """`exec` as dataclasses calls it, with the compiled code of InferSim's class methods kept."""
    if kwargs or not isinstance(source, str) or not isinstance(globals, dict) \
            or not str(globals.get("__name__", "")).startswith("infersim"):
        return builtins.exec(source, globals, locals, **kwargs)
    code = _codes.get(source)
    if type(code) is not CodeType:
        code = _new[source] = _codes[source] = compile(source, "<string>", "exec")  # as exec(str) would
        if len(_new) == 1:
            import atexit

            atexit.register(_save)
    return builtins.exec(code, globals, locals)


def _save() -> None:
    kept = diskcache.read_marshal(_FILE)  # what other processes added meanwhile
    merged = kept if isinstance(kept, dict) and len(kept) + len(_new) <= MAX_ENTRIES else {}
    merged.update(_new)
    diskcache.write_marshal(_FILE, merged)


def install() -> None:
    """Route dataclasses' `exec` (a global name lookup in its module) through the kept code."""
    if diskcache.cache_dir() is None or getattr(dataclasses, "exec", None) is _exec:
        return
    kept = diskcache.read_marshal(_FILE)
    if isinstance(kept, dict):
        _codes.update(kept)
    dataclasses.exec = _exec  # type: ignore[attr-defined]
