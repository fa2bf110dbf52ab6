"""One rule for reading plain data from JSON text and flag values: bounded nesting, bounded length.

Every JSON document InferSim reads (an HF config.json, a bench result, a trace-replay row, a
result file for `plot`) and every structured flag value (`--set FIELD=VALUE`, `--grid`, serve's
workload values) goes through here. JSON and YAML parsers recurse once per level of nesting, so a
value of 100,000 opening brackets ends in RecursionError (or a crash) somewhere inside them; here
it is one message naming the file or flag. The depth is counted on the text before it is parsed,
in linear time, and checked again on the parsed value (a YAML alias can nest what the text does
not show).
"""

from __future__ import annotations

import json
from typing import Any

from infersim.base.errors import InferSimError, echo

#: deepest nesting of lists and mappings accepted: real configs and results are under ten levels
MAX_NESTING = 64
#: longest flag value accepted (characters): a value is a number, a name or a short list
MAX_FLAG_VALUE_CHARS = 100_000


def text_nesting(text: str) -> int:
    """The deepest bracket nesting of JSON/YAML flow text, strings skipped (linear in the text)."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def value_nesting(value: Any, limit: int = MAX_NESTING) -> int:
    """The deepest nesting of lists, tuples and mappings in a parsed value (iterative: no recursion),
    counted up to `limit` + 1 (a deeper value is refused anyway)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit or id(item) in seen:  # an alias seen again adds no new depth
                continue
            seen.add(id(item))
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth) for child in children)
    return deepest


def _too_deep(depth: int) -> str:
    return f"nested {depth:,} levels deep; at most {MAX_NESTING} levels of lists and mappings are read"


class JsonError(InferSimError):
    """JSON text that cannot be read: the message names its source and what is wrong."""

    def __init__(self, source: str, problem: str, too_deep: bool = False) -> None:
        self.too_deep = too_deep
        super().__init__(f"{source}: {problem}")


def loads_json(text: str, source: str) -> Any:
    """Parse JSON text read from `source` (a file name, or a description); one JsonError naming
    `source` for malformed JSON, nesting past MAX_NESTING, or a number Python cannot read."""
    depth = text_nesting(text)
    if depth > MAX_NESTING:
        raise JsonError(source, _too_deep(depth), too_deep=True)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonError(source, f"not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError:  # an integer of more than 4,300 digits (Python's int-from-text limit)
        raise JsonError(source, "holds a number too long to read (Python reads at most 4,300 digits)") from None
    except RecursionError:
        raise JsonError(source, _too_deep(depth), too_deep=True) from None


def parse_flag_value(raw: str, flag: str) -> Any:
    """A structured flag value (`--set FIELD=VALUE`'s VALUE) read as YAML: a number, a name, a
    list or a mapping; text YAML cannot read stays text. Over-long or over-deep values are one
    InferSimError naming the flag and the value."""
    if len(raw) > MAX_FLAG_VALUE_CHARS:
        raise InferSimError(f"{flag} {echo(raw)}: a value of {len(raw):,} characters; at most "
                            f"{MAX_FLAG_VALUE_CHARS:,}")
    depth = text_nesting(raw)
    if depth > MAX_NESTING:
        raise InferSimError(f"{flag} {echo(raw)}: {_too_deep(depth)}")
    if not raw.strip():
        return ""
    import yaml  # only for structured flag values: a plain run reads no YAML text itself

    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError):  # ValueError: an integer beyond Python's 4,300-digit limit
        return raw
    except RecursionError:
        raise InferSimError(f"{flag} {echo(raw)}: {_too_deep(depth)}") from None
    depth = value_nesting(value)
    if depth > MAX_NESTING:
        raise InferSimError(f"{flag} {echo(raw)}: {_too_deep(depth)}")
    return value
