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

Annotations are compiled too: `typing.get_type_hints` compiles each field's annotation text (a
card's `float`, `tuple[MemoryTier, ...]`) anew for every class, 153 compiles of 38 texts in a plain
run; this process compiles each text once (in memory only: the 38 take 0.3 ms).

One file per module (and per checkout of it: the file's name holds the module's path), read when
the module defines its first class: a process reads only the code of the modules it imports, and
when a module is edited, its file is rewritten with the code its classes now use, so code of
classes that no longer exist does not pile up and slow every later read.
"""

from __future__ import annotations

import builtins
import dataclasses
import sys
import typing
import zlib
from types import CodeType
from typing import Any

from infersim import diskcache

_PREFIX = f"dataclass-code-{sys.implementation.name}-{sys.hexversion:x}"

#: module name -> (its cache file's name, or None where not cached; source text -> code)
_modules: dict[str, tuple[str | None, dict[str, CodeType]]] = {}
#: cache file name -> the code this process used from it (kept or compiled)
_used: dict[str, dict[str, CodeType]] = {}
#: the cache files with code compiled by this process, written when it ends
_changed: set[str] = set()


def _exec(source: Any, globals: Any = None, locals: Any = None, /, **kwargs: Any) -> Any:
    """`exec` as dataclasses calls it, with the compiled code of InferSim's class methods kept."""
    if kwargs or not isinstance(source, str) or not isinstance(globals, dict) \
            or not str(globals.get("__name__", "")).startswith("infersim"):
        return builtins.exec(source, globals, locals, **kwargs)
    name, kept = _module_cache(globals)
    code = kept.get(source)
    if type(code) is not CodeType:
        code = kept[source] = compile(source, "<string>", "exec")  # as exec(str) would
        if name is not None:
            if not _changed:
                import atexit

                atexit.register(_save)
            _changed.add(name)
    if name is not None:
        _used.setdefault(name, {})[source] = code
    return builtins.exec(code, globals, locals)


def _module_cache(globals: dict[str, Any]) -> tuple[str | None, dict[str, CodeType]]:
    module = globals["__name__"]
    found = _modules.get(module)
    if found is None:
        path = globals.get("__file__")
        name = f"{_PREFIX}-{module}-{zlib.crc32(str(path).encode()):08x}.marshal" if path else None
        kept = diskcache.read_marshal(name) if name else None
        found = _modules[module] = (name, kept if isinstance(kept, dict) else {})
    return found


def _save() -> None:
    # what this process used, not merged with what the file held: a module's classes are all
    # defined when it is imported, so the code of a module that compiled anything new is exactly
    # what it used, and what the file held besides is the code of classes since edited away
    for name in _changed:
        diskcache.write_marshal(name, _used[name])


_annotations: dict[tuple[str, str, str], CodeType] = {}


def _compile(source: Any, filename: Any, mode: Any, *args: Any, **kwargs: Any) -> Any:
    """`compile` as typing calls it for an annotation's text: the code of a text compiled before."""
    if args or kwargs or not isinstance(source, str) or not isinstance(filename, str):
        return builtins.compile(source, filename, mode, *args, **kwargs)
    key = (source, filename, mode)
    code = _annotations.get(key)
    if code is None:
        code = _annotations[key] = builtins.compile(source, filename, mode)
    return code


def install() -> None:
    """Route dataclasses' `exec` and typing's `compile` (global name lookups in their modules)
    through the kept code."""
    typing.compile = _compile  # type: ignore[attr-defined]
    if diskcache.cache_dir() is None or getattr(dataclasses, "exec", None) is _exec:
        return
    dataclasses.exec = _exec  # type: ignore[attr-defined]
