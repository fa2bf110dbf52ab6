"""Validated loading of YAML mappings into frozen dataclasses.

Every card and config goes through `build`: unknown keys, missing keys, wrong types and values
outside a field's declared range each raise one ConfigError naming the file, the dotted field
and the value. Field constraints are declared next to the field with `spec(...)`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from infersim.base import diskcache
from infersim.base.errors import MISSING, ConfigError
from infersim.base.plaindata import loads_yaml

T = TypeVar("T")

# YAML 1.1 reads "989e12" as a string; a number written that way is still a number.
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

# One rule for every number entering InferSim (cards, run configs, --set, sweep grids, bench
# results, HF configs, kernel tables): finite, whole where a count, and within these magnitudes,
# so that no product or quotient the simulator forms can overflow to inf or lose its meaning.
MAX_COUNT = 10**15  # largest whole number (tokens, requests, layers, widths ...)
MAX_MAGNITUDE = 1e40  # largest |value| of a real number (bytes, bytes/s, FLOP/s, seconds ...)
MIN_MAGNITUDE = 1e-40  # smallest non-zero |value| of a real number


def check_number(value: Any, source: str, path: str, *, whole: bool = False, gt: float | None = None,
                 ge: float | None = None, le: float | None = None) -> int | float:
    """The one validation rule for a number from anywhere: a number (not text, not a boolean),
    finite, whole when `whole` (a float like 4.0 is accepted as 4), within MAX_COUNT /
    MIN_MAGNITUDE..MAX_MAGNITUDE, and in the range gt/ge/le; returns it as int or float. Any
    failure is one ConfigError naming source, field and value."""
    original = value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = value.strip() if isinstance(value, str) else ""
        if len(text) > 64 and _FLOAT_TEXT.match(text):  # no count or measure needs 64 characters
            raise ConfigError(source, path, value, "too large: at most 1e+15 for a count" if whole else
                              f"out of range: magnitude must be 0 or between {MIN_MAGNITUDE:g} and {MAX_MAGNITUDE:g}")
        if _FLOAT_TEXT.match(text):
            value = int(text) if text.lstrip("+-").isdigit() else float(text)
        elif text.lower().lstrip("+-.") in ("inf", "infinity", "nan"):
            raise ConfigError(source, path, value, "must be a finite number")
        else:
            raise ConfigError(source, path, value, "expected a whole number" if whole else "expected a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(source, path, value, "must be a finite number")
    if whole:
        if isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(source, path, original, "expected a whole number")
            value = int(value)
        if abs(value) > MAX_COUNT:
            raise ConfigError(source, path, original, f"too large: at most {MAX_COUNT:.0e} for a count")
    else:
        value = float(value)
        if abs(value) > MAX_MAGNITUDE or (value != 0 and abs(value) < MIN_MAGNITUDE):
            raise ConfigError(source, path, original,
                              f"out of range: magnitude must be 0 or between {MIN_MAGNITUDE:g} and {MAX_MAGNITUDE:g}")
    check_bounds(value, source, path, original, gt=gt, ge=ge, le=le)
    return value


def check_bounds(value: int | float, source: str, path: str, shown: Any = MISSING, *, gt: float | None = None,
                 ge: float | None = None, le: float | None = None) -> None:
    """The range part of the rule; `shown` is the value to echo (default: `value`)."""
    shown = value if shown is MISSING else shown
    if gt is not None and not value > gt:
        raise ConfigError(source, path, shown, f"must be greater than {gt:g}")
    if ge is not None and not value >= ge:
        raise ConfigError(source, path, shown, f"must be at least {ge:g}")
    if le is not None and not value <= le:
        raise ConfigError(source, path, shown, f"must be at most {le:g}")


_KEPT_HASH = "_kept_hash"


def hash_kept(cls: type[T]) -> type[T]:
    """A frozen dataclass whose hash is computed once and kept on the instance (apply above
    @dataclass). Why: the deployment keys the sweep's memo of completed layouts at every point, and
    the generated __hash__ hashes every field, nested dataclasses recursively, on every call (for a
    shallow dataclass hashed once or twice, the generated one costs less than this wrapper). The
    instance is immutable, so its hash cannot change; it is kept in the instance's __dict__ (a
    frozen dataclass's own fields are not there only when slotted, and these are not), which
    __eq__, fields() and asdict() never read. It is not pickled: str hashes differ between
    processes (a worker computes its own)."""
    generated = cls.__hash__

    def __hash__(self: Any) -> int:
        kept = self.__dict__.get(_KEPT_HASH)
        if kept is None:
            kept = self.__dict__[_KEPT_HASH] = generated(self)
        return kept

    def __getstate__(self: Any) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop(_KEPT_HASH, None)
        return state

    cls.__hash__ = __hash__  # type: ignore[method-assign,assignment]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls


def spec(
    default: Any = dataclasses.MISSING,
    *,
    doc: str = "",
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with a range constraint and a one-line description (used in docs and errors)."""
    metadata = {"doc": doc, "gt": gt, "ge": ge, "le": le}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def safe_load_yaml(text: str, source: str = "YAML text") -> Any:
    """yaml.safe_load (the same safe tag set, through libyaml's parser where PyYAML has it), one
    ConfigError naming `source` for malformed YAML, a key given twice in one mapping, nesting past
    infersim.base.plaindata.MAX_NESTING or a number too long to read."""
    return loads_yaml(text, source)


def load_yaml(path: Path, what: str = "file") -> Any:
    """Read a YAML file; a missing file, text that is not UTF-8 or not YAML, a key given twice or
    nesting too deep is one clear error naming the file. `what` names the kind of file in the
    messages (e.g. "rules file")."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), "", MISSING, f"{what} not found") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "", MISSING, f"is a directory, not a {what}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", MISSING, f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start:,}); a {what} is read as UTF-8 YAML") from None
    except OSError as exc:
        raise ConfigError(str(path), "", MISSING, f"cannot read {what}: {exc.strerror or exc}") from None
    kept = _parsed_yaml(path, text)
    if kept is not None:
        return kept
    data = loads_yaml(text, str(path))
    _keep_parsed_yaml(path, text, data)
    return data


# Parsed YAML files are kept on disk between processes (infersim.base.diskcache): one entry per YAML
# file's path, holding the path, its whole text and the parsed data as JSON, used only while the text
# is the same (so an edit is seen at once, whatever the file's mtime says, and rewrites that one
# entry). Each entry names the checks its text passed (_PARSED_YAML_RULES), and is used only under
# the same checks: data that passed other checks (a key given twice let through, `010` read as
# octal) is parsed afresh.
# Kept only where JSON gives back exactly what PyYAML parsed (a file holding e.g. a date, or a mapping
# with a number for a key, is parsed every time), and read back only when its structure holds:
# anything else is a damaged entry, deleted. A plain run then reads its config and three cards
# without importing PyYAML, reading only their own entries. What the data then says is checked by
# `build`, as for a file parsed afresh.
_PARSED_YAML_MAX_TEXT = 16_384  # characters: cards and configs are a few KB; bigger files are parsed
_PARSED_YAML_RULES = "unique keys, bounded nesting, one reading of numbers"


def _parsed_yaml_entry(path: Path) -> tuple[str, str]:
    """(entry name, absolute path) of a YAML file's parsed data."""
    where = os.path.abspath(path)
    return diskcache.checksum_name("yaml", where), where


def _parsed_yaml(path: Path, text: str) -> Any:
    """The data kept for `path` while its text is `text` (a fresh copy: callers may change it), or None."""
    if len(text) > _PARSED_YAML_MAX_TEXT:
        return None
    name, where = _parsed_yaml_entry(path)
    kept = diskcache.read_json(name, "yaml")
    if kept is None:
        return None
    if not (isinstance(kept, dict) and set(kept) == {"path", "text", "data", "rules"} and isinstance(kept["path"], str)
            and isinstance(kept["text"], str) and kept["rules"] == _PARSED_YAML_RULES):
        diskcache.discard(name)  # not what _keep_parsed_yaml writes
        return None
    if kept["path"] == where and kept["text"] == text:
        return kept["data"]
    return None  # another text (edited, or another path of the same checksum): parsed, then rewritten


def _written_out_within(data: Any, limit: int) -> bool:
    """Whether `data` has at most `limit` values counted as JSON writes them out: a YAML alias repeats
    what it names, so a few lines of nested aliases (an alias bomb) would write out billions, and a
    recursive one forever. Walked without recursion."""
    stack, count = [data], 0
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return False
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _keep_parsed_yaml(path: Path, text: str, data: Any) -> None:
    # each value takes at least a character of the text unless an alias repeats it
    if len(text) > _PARSED_YAML_MAX_TEXT or diskcache.cache_dir() is None or not _written_out_within(data, 2 * len(text) + 16):
        return
    import json

    try:
        exact = json.loads(json.dumps(data)) == data
    except (TypeError, ValueError, RecursionError):  # not JSON's types (a date, a binary)
        return
    if exact:  # not where a key is a number (JSON's keys are text) or a value is NaN
        name, where = _parsed_yaml_entry(path)
        diskcache.write_json(name, "yaml", {"path": where, "text": text, "data": data, "rules": _PARSED_YAML_RULES})


def build(cls: type[T], data: Any, source: str, prefix: str = "") -> T:
    """Construct dataclass `cls` from a mapping, validating keys, types and ranges."""
    if not isinstance(data, dict):
        raise ConfigError(source, prefix, data, f"expected a mapping of {cls.__name__} fields")
    hints, fields = _schema_of(cls)
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        name = _join(prefix, unknown[0])
        known = ", ".join(sorted(fields))
        import difflib  # here: only a bad key needs it

        close = difflib.get_close_matches(unknown[0], sorted(fields), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(source, name, data[unknown[0]], f"unknown key{hint} (known keys: {known})")
    kwargs: dict[str, Any] = {}
    for name, fld in fields.items():
        path = _join(prefix, name)
        if name not in data:
            if fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
                raise ConfigError(source, path, MISSING, "required field is missing")
            continue
        value = _convert(hints[name], data[name], source, path)
        _check_range(fld, value, source, path)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(source, prefix, MISSING, str(exc)) from None


_SCHEMAS: dict[type, tuple[dict[str, Any], dict[str, dataclasses.Field]]] = {}


def _schema_of(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """(type hints, init fields by name) of a dataclass, worked out once per class: a plain run
    builds 33 sections of 18 classes (a hardware card's memory tiers, for one), and evaluating the
    hints' text takes a compile per field."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        schema = _SCHEMAS[cls] = (type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init})
    return schema


def type_hints(cls: type) -> dict[str, Any]:
    """typing.get_type_hints(cls) for a class whose annotations are text (`from __future__ import
    annotations`): each evaluated in its defining class's module and namespace, as get_type_hints does,
    without the ForwardRef it wraps each in (a run evaluates some 400 of them; tests hold the two
    equal on every dataclass of the package)."""
    hints: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        annotations = base.__dict__.get("__annotations__")
        if not annotations:
            continue
        module = sys.modules.get(base.__module__)
        module_names = module.__dict__ if module is not None else {}
        # the module's names before the class's own, the order get_type_hints looks them up in
        class_names = dict(vars(base))
        for name, value in annotations.items():
            hints[name] = eval(value, class_names, module_names) if isinstance(value, str) else value  # noqa: S307 - a class's own annotation text
    return hints


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_range(fld: dataclasses.Field, value: Any, source: str, path: str) -> None:
    if value is None or isinstance(value, bool):
        return
    values = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else (value,)
    meta = fld.metadata
    for item in values:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            check_bounds(item, source, path, value, gt=meta.get("gt"), ge=meta.get("ge"), le=meta.get("le"))


def _numeric(value: Any) -> bool:
    """A number, or text that reads as one ("1e30", as YAML 1.1 leaves it)."""
    if isinstance(value, str):
        return bool(_FLOAT_TEXT.match(value.strip()))
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _convert(hint: Any, value: Any, source: str, path: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return _convert_union(hint, value, source, path)
    if origin is Literal:
        return _convert_literal(hint, value, source, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, path, value, "expected a list")
        (item_hint, *_rest) = get_args(hint)
        return tuple(_convert(item_hint, v, source, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        key_hint, value_hint = get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(source, path, value, "expected a mapping")
        return {str(k): _convert(value_hint, v, source, f"{path}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, source, path)
    return _convert_scalar(hint, value, source, path)


def _convert_union(hint: Any, value: Any, source: str, path: str) -> Any:
    """The first option of `hint` the value converts to; else every option's problem, named once."""
    options = get_args(hint)
    if value is None and type(None) in options:
        return None
    non_none = [o for o in options if o is not type(None)]
    errors = []
    for option in non_none:
        try:
            return _convert(option, value, source, path)
        except ConfigError as exc:
            if _numeric(value) and option in (int, float):
                raise  # a number for a numeric option: its own problem is the one to name
            if exc.field != path and exc.field.startswith(f"{path}."):
                raise  # a section of the right shape with one bad field inside: name that field
            errors.append(exc.problem)
    raise ConfigError(source, path, value, " or ".join(dict.fromkeys(errors)))


def _convert_literal(hint: Any, value: Any, source: str, path: str) -> Any:
    allowed = get_args(hint)
    if value not in allowed:
        import difflib  # here: only a bad value needs it

        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
        suggestion = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(source, path, value, f"must be one of {', '.join(map(str, allowed))}{suggestion}")
    return value


def _convert_scalar(hint: Any, value: Any, source: str, path: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, path, value, "expected true or false")
        return value
    if hint is int:
        return check_number(value, source, path, whole=True)
    if hint is float:
        return check_number(value, source, path)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(source, path, value, "expected text")
        return value
    if hint is Any:
        return value
    raise TypeError(f"schema: unsupported field type {hint!r} at {path}")  # a bug in a card class


def field_docs(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, type, description) of every field, recursively, for documentation."""
    rows = []
    hints = get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        hint = hints[fld.name]
        name = _join(prefix, fld.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows.extend(field_docs(hint, name))
        else:
            rows.append((name, typing_name(hint), fld.metadata.get("doc", "")))
    return rows


def typing_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
