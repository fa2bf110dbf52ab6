"""One rule for reading plain data from JSON and YAML text and flag values: bounded nesting, bounded
length, each key once per mapping.

Every JSON document InferSim reads (an HF config.json, a bench result, a trace-replay row), every
YAML file of the user's (infersim.cards.schema.load_yaml: configs, cards, reference files) and every
structured flag value (`--set FIELD=VALUE`, `--grid`, serve's workload values) goes through here.
JSON and YAML parsers recurse once per level of nesting, so a value of 100,000 opening brackets ends
in RecursionError (or a crash) somewhere inside them; here it is one message naming the file or
flag. The depth is bounded on the text before it is parsed, in linear time, and checked again on
the parsed value (a YAML alias can nest what the text does not show). Both parsers keep the last of
two equal keys in one mapping; here a key given twice is one message naming it and where each is.
"""

from __future__ import annotations

import json
import re
from typing import Any

from infersim.base.errors import MISSING, ConfigError, InferSimError, echo

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


def _too_deep(depth: int, more_than: bool = False) -> str:
    shown = f"more than {MAX_NESTING}" if more_than else f"{depth:,}"
    return f"nested {shown} levels deep; at most {MAX_NESTING} levels of lists and mappings are read"


def _twice(first: tuple[int, int], second: tuple[int, int], lines: bool = True, spelled: str = "") -> str:
    """The problem of a key given twice, at (line, column) `first` and `second` (1-based; columns
    alone where the text is one line, a JSONL row); `spelled` says how where the two texts differ."""
    if not lines:
        where = f"at columns {first[1]} and {second[1]}"
    elif first[0] == second[0]:
        where = f"on line {first[0]} (columns {first[1]} and {second[1]})"
    else:
        where = f"on lines {first[0]} and {second[0]}"
    return f"key given twice in one mapping{spelled}, {where}: which value is meant is not guessed; keep one"


def _dotted(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


class JsonError(InferSimError):
    """JSON text that cannot be read: the message names its source and what is wrong."""

    def __init__(self, source: str, problem: str, too_deep: bool = False) -> None:
        self.too_deep = too_deep
        super().__init__(f"{source}: {problem}")


class _DuplicateJsonKey(Exception):
    """Raised inside the JSON decoder (not a ValueError: loads_json reads those as numbers too long)."""

    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateJsonKey(key)
            seen.add(key)
    return mapping


# built once: json.loads with a hook builds a decoder per call
_JSON_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs)
_JSON_STRUCTURE = re.compile(r'["{}\[\],]')


def _json_duplicate(text: str) -> tuple[str, tuple[int, int], tuple[int, int]] | None:
    """(path, (line, column) of its first, of its second) of the first key given twice in one
    object of JSON `text`, or None where the text cannot be walked. Walked without recursion; only
    when the decoder has found a key given twice, which it cannot say where."""
    scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]  # public, untyped in typeshed

    def at(pos: int) -> tuple[int, int]:
        return text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)

    # per open object or list: (the keys seen and where, or None in a list; the current child's key or index)
    frames: list[list[Any]] = []
    key_next = False
    pos = 0
    try:
        while match := _JSON_STRUCTURE.search(text, pos):
            char, pos = match.group(), match.end()
            if char == '"':
                string, pos = scanstring(text, pos)
                if key_next:
                    seen = frames[-1][0]
                    if string in seen:
                        path = ""
                        for _, part in frames[:-1]:
                            path = _dotted(path, part)
                        return _dotted(path, string), at(seen[string]), at(match.start())
                    seen[string], frames[-1][1], key_next = match.start(), string, False
            elif char in "{[":
                frames.append([{}, ""] if char == "{" else [None, 0])
                key_next = char == "{"
            elif char in "}]":
                frames.pop()
            elif frames[-1][0] is None:  # a comma between list items
                frames[-1][1] += 1
            else:
                key_next = True
    except (ValueError, IndexError):  # the decoder stopped at the duplicate: what follows is unchecked
        return None
    return None


def loads_json(text: str, source: str) -> Any:
    """Parse JSON text read from `source` (a file name, or a description); one JsonError naming
    `source` for malformed JSON, a key given twice in one object, nesting past MAX_NESTING, or a
    number Python cannot read."""
    # fewer brackets than the limit cannot nest past it: most rows and files skip the slower count
    depth = text_nesting(text) if text.count("[") + text.count("{") > MAX_NESTING else 0
    if depth > MAX_NESTING:
        raise JsonError(source, _too_deep(depth), too_deep=True)
    if text.startswith("\ufeff"):  # refused as json.loads refuses it
        raise JsonError(source, "not JSON (a byte-order mark at line 1, column 1: save the file as UTF-8 without one)")
    try:
        return _JSON_DECODER.decode(text)
    except _DuplicateJsonKey as exc:
        found = _json_duplicate(text)
        if found is None:
            raise JsonError(source, f"key {exc.key!r} given twice in one object: which value is meant is not "
                            "guessed; keep one") from None
        path, first, second = found
        problem = _twice(first, second, lines="\n" in text.strip())  # a JSONL row is one line: columns alone
        raise JsonError(source, f"field '{path}': {problem}") from None
    except json.JSONDecodeError as exc:
        raise JsonError(source, f"not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError:  # an integer of more than 4,300 digits (Python's int-from-text limit)
        raise JsonError(source, "holds a number too long to read (Python reads at most 4,300 digits)") from None
    except RecursionError:
        raise JsonError(source, _too_deep(text_nesting(text)), too_deep=True) from None


# -- YAML

#: YAML text with more of these characters (each collection of YAML text starts at one of its own:
#: a bracket, a sequence's dash, a key's colon or question mark) than the gate is nested at most that
#: deep. Deeper text is first read as events, before libyaml's composer, which recurses in C once
#: per level (past ~25,000 levels it overflows an 8 MB stack: a crash, not an exception). Flow
#: collections have their own gate: libyaml reads N nested brackets in time ~N^2.
_YAML_INDICATOR_GATE = 10_000
_YAML_BRACKET_GATE = 1_000


class _TooDeep(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem


_UNIQUE_KEY_LOADER: Any = None

# Numbers in YAML text have one meaning, whichever YAML version its writer had in mind. PyYAML reads
# YAML 1.1, where `010` is octal 8 and `1:30` is 90 (base 60); YAML 1.2, Python's int() and the
# direct flags (`--isl 010`) read `010` as 10 and `1:30` is no number at all. So: digits alone are
# decimal, leading zeros or not; a base is only ever said by a prefix (0b, 0o, 0x: no YAML reads
# those otherwise); `_` groups digits (1_000, as YAML 1.1 and Python read it); a colon never makes a
# number: `1:30` stays text, which a number field refuses naming the value. Floats are PyYAML's,
# less the base-60 form (an exponent without a dot or sign stays text, read by the schema's rule).
_YAML_INT = re.compile(r"""^[-+]?(?:0b[0-1_]*[0-1][0-1_]*
                          |0o[0-7_]*[0-7][0-7_]*
                          |0x[0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*
                          |[0-9][0-9_]*)$""", re.X)
_YAML_FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?
                            |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                            |[-+]?\.(?:inf|Inf|INF)
                            |\.(?:nan|NaN|NAN))$""", re.X)
_YAML_INT_TAG = "tag:yaml.org,2002:int"
_YAML_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_BASES = {"0b": 2, "0o": 8, "0x": 16}


def _yaml_number_resolvers(inherited: dict[Any, list[tuple[str, Any]]]) -> dict[Any, list[tuple[str, Any]]]:
    """A copy of a loader's implicit resolver table (the inherited lists are PyYAML's own, shared by
    every SafeLoader: never changed in place) with the int and float forms above."""
    forms = {_YAML_INT_TAG: _YAML_INT, _YAML_FLOAT_TAG: _YAML_FLOAT}
    return {first: [(tag, forms.get(tag, regexp)) for tag, regexp in entries] for first, entries in inherited.items()}


def _not_a_number(yaml: Any, node: Any, what: str) -> Exception:
    return yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not {what}", node.start_mark)


def _construct_int(loader: Any, node: Any) -> int:
    """An integer by the rule above; also for an explicit `!!int`, whose text no resolver checked."""
    import yaml

    text = loader.construct_scalar(node)
    if not _YAML_INT.match(text):
        raise _not_a_number(yaml, node, "an integer (decimal digits, or 0b, 0o or 0x and digits)")
    digits = text.replace("_", "")
    sign = -1 if digits[0] == "-" else 1
    digits = digits.lstrip("+-")
    base = _INT_BASES.get(digits[:2], 10)
    # ValueError past Python's 4,300-digit limit passes through: the caller words it
    return sign * int(digits if base == 10 else digits[2:], base)


def _construct_float(loader: Any, node: Any) -> float:
    """A float by PyYAML's rule, refusing the base-60 form an explicit `!!float` could still give."""
    import yaml

    text = loader.construct_scalar(node)
    if ":" in text:
        raise _not_a_number(yaml, node, "a number (base-60 forms such as 1:30 are not read)")
    try:
        value: float = yaml.constructor.SafeConstructor.construct_yaml_float(loader, node)
    except (ValueError, IndexError):  # `!!float abc`, `!!float ""`
        raise _not_a_number(yaml, node, "a number") from None
    return value


def _unique_key_loader() -> Any:
    """PyYAML's safe loader (libyaml's parser where PyYAML has it: ~10x faster; the same safe tag
    set) reading numbers by the rule above, refusing a key given twice in one mapping with a
    ConfigError naming the loader's `source`, the key's path and the lines of both."""
    global _UNIQUE_KEY_LOADER
    if _UNIQUE_KEY_LOADER is not None:
        return _UNIQUE_KEY_LOADER
    import yaml  # here: importing PyYAML is ~10 ms, and a plain run finds its files parsed already

    merge_tag = "tag:yaml.org,2002:merge"
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class UniqueKeyLoader(base):  # type: ignore[misc,valid-type]
        source = ""
        # resolving and constructing run in Python even under libyaml's parser: the speed is kept
        yaml_implicit_resolvers = _yaml_number_resolvers(base.yaml_implicit_resolvers)
        yaml_constructors = {**base.yaml_constructors, _YAML_INT_TAG: _construct_int, _YAML_FLOAT_TAG: _construct_float}

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.root: Any = None
            self.checked: set[Any] = set()  # mapping nodes checked (flattened: merged keys are no duplicates)

        def construct_document(self, node: Any) -> Any:
            self.root = node  # where a duplicate's path starts
            return super().construct_document(node)

        def flatten_mapping(self, node: Any) -> None:
            # every mapping is flattened (its `<<:` merges resolved) before it is built: its own keys
            # are those before the first flattening; keys a merge brings in may be given again
            if node in self.checked:
                return super().flatten_mapping(node)
            own = [key for key, _ in node.value if key.tag != merge_tag]
            super().flatten_mapping(node)
            self.checked.add(node)
            seen: dict[Any, Any] = {}
            for key_node in own:
                key = self.construct_object(key_node)  # built once: construct_mapping gets it back from the memo
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: construct_mapping says so
                    continue
                if first is not key_node:
                    self.twice(node, first, key_node)

        def twice(self, mapping: Any, first: Any, second: Any) -> None:
            texts = [k.value if isinstance(k, yaml.ScalarNode) else str(self.construct_object(k)) for k in (first, second)]
            path = _dotted(_node_path(self.root, mapping, yaml), texts[1])
            marks = [(k.start_mark.line + 1, k.start_mark.column + 1) for k in (first, second)]
            # YAML reads e.g. 1, 0x1 and true as keys Python holds equal
            spelled = f" ({texts[0]!r} and {texts[1]!r} are the same key)" if texts[0] != texts[1] else ""
            raise ConfigError(self.source, path, MISSING, _twice(marks[0], marks[1], spelled=spelled))

    _UNIQUE_KEY_LOADER = UniqueKeyLoader
    return UniqueKeyLoader


def _node_path(root: Any, target: Any, yaml: Any) -> str:
    """The shortest dotted path from YAML node `root` to node `target` ("" where not found), the
    first in the text of those as short (an anchored node has one more path per alias), walked
    breadth first without recursion."""
    from collections import deque

    queue: deque[tuple[Any, str]] = deque([(root, "")])
    seen: set[int] = set()
    while queue:
        node, path = queue.popleft()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            queue.extend((value, _dotted(path, key.value if isinstance(key, yaml.ScalarNode) else "?"))
                         for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            queue.extend((child, _dotted(path, index)) for index, child in enumerate(node.value))
    return ""


def _yaml_event_depth(text: str, limit: int) -> int:
    """How deep YAML `text` nests, read from its parser's events (the parser keeps its own stack:
    no recursion), counted up to `limit` + 1. YAMLError where the text is not YAML."""
    import yaml

    loader = _unique_key_loader()(text)
    depth = deepest = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
                if depth > limit:
                    break
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        if not _past_parser_depth(exc):
            raise
        return limit + 1  # libyaml's own limit lies far beyond ours
    finally:
        loader.dispose()
    return deepest


def _past_parser_depth(exc: Exception) -> bool:
    """Whether a YAML error is libyaml's own nesting limit (PyYAML 6.0.4 on), which its scanner can
    meet while reading ahead of the events counted."""
    return "nesting depth" in str(getattr(exc, "problem", "") or "")


def _parse_yaml(text: str, source: str) -> Any:
    """YAML text parsed with the safe tag set. ConfigError for a key given twice (naming `source`),
    _TooDeep past MAX_NESTING; PyYAML's YAMLError and ValueError (an integer of more than 4,300
    digits) pass through for the caller to word."""
    import yaml

    brackets = text.count("[") + text.count("{")
    if (brackets > _YAML_BRACKET_GATE
            or brackets + text.count("-") + text.count(":") + text.count("?") > _YAML_INDICATOR_GATE):
        depth = _yaml_event_depth(text, MAX_NESTING)
        if depth > MAX_NESTING:
            raise _TooDeep(_too_deep(depth, more_than=True))
    loader = _unique_key_loader()(text)
    loader.source = source
    try:
        data = loader.get_single_data()
    except RecursionError:  # PyYAML's own composer (without libyaml) recurses in Python
        raise _TooDeep(_too_deep(_yaml_event_depth(text, MAX_NESTING), more_than=True)) from None
    except yaml.YAMLError as exc:
        if not _past_parser_depth(exc):
            raise
        raise _TooDeep(_too_deep(MAX_NESTING + 1, more_than=True)) from None
    finally:
        loader.dispose()
    depth = value_nesting(data)
    if depth > MAX_NESTING:
        raise _TooDeep(_too_deep(depth, more_than=True))  # counted only that far
    return data


def loads_yaml(text: str, source: str) -> Any:
    """Parse YAML text read from `source` (a file name, or a description) with PyYAML's safe tag
    set; one ConfigError naming `source` for malformed YAML, a key given twice in one mapping,
    nesting past MAX_NESTING, or a number Python cannot read."""
    import yaml

    try:
        return _parse_yaml(text, source)
    except _TooDeep as exc:
        raise ConfigError(source, "", MISSING, exc.problem) from None
    except ValueError:  # an integer of more than 4,300 digits (Python's int-from-text limit)
        raise ConfigError(source, "", MISSING, "holds a number too long to read (Python reads at most 4,300 digits)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, "", MISSING, f"malformed YAML{where}: {problem}") from None


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
        return _parse_yaml(raw, f"{flag} {echo(raw)}")
    except (yaml.YAMLError, ValueError):  # ValueError: an integer beyond Python's 4,300-digit limit
        return raw
    except _TooDeep as exc:
        raise InferSimError(f"{flag} {echo(raw)}: {exc.problem}") from None
