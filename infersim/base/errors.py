"""User-facing errors. Anything raised as InferSimError reaches the user as one clear line, never a traceback."""

from __future__ import annotations

import reprlib
from typing import Any


class InferSimError(Exception):
    """A problem with the user's input or environment, explained in one message."""


class NotPossible(InferSimError):
    """Valid input whose answer is "this cannot run" or "nothing to show" (a deployment that does not
    fit, nothing to compare): the command line exits with status 1, not 2 (bad input)."""

    exit_code = 1


class ConfigError(InferSimError):
    """A bad value in a card or config: names the file, the dotted field and the value."""

    def __init__(self, source: str, field: str, value: Any, problem: str) -> None:
        self.source = source
        self.field = field
        self.value = value
        self.problem = problem
        where = f"{source}: " if source else ""
        at = f"field '{field}'" if field else "top level"
        shown = "" if value is _MISSING else f" (value: {echo(value)})"
        super().__init__(f"{where}{at}{shown}: {problem}")


#: echoed values and messages are cut to this many characters (a YAML anchor can expand to megabytes)
MAX_ECHO_CHARS = 200


def shorten(text: str, limit: int = MAX_ECHO_CHARS, tail: int = 0) -> str:
    """`text`, or its first `limit` characters and how long it was (and its last `tail` characters:
    a message says what is wrong at its end)."""
    if len(text) <= limit + tail:
        return text
    return f"{text[:limit]}… ({len(text):,} chars)" + (f" …{text[-tail:]}" if tail else "")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 12, 12, 8, 8
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_ECHO_CHARS


def echo(value: Any) -> str:
    """`value` as a message shows it: its repr, cut to MAX_ECHO_CHARS. Containers are abbreviated
    while they are written (a YAML alias bomb expands to gigabytes; its repr is never built)."""
    if isinstance(value, str):
        return shorten(repr(value))
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<a whole number of {value.bit_length():,} bits>"  # repr would pass Python's digit limit
    try:
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            return shorten(_REPR.repr(value))
        return shorten(repr(value))
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
MISSING = _MISSING


class LayoutError(InferSimError):
    """A parallel layout that does not divide the model evenly."""
