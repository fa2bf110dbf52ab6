"""Grid axes: `--grid FIELD=VALUES` parsed, expanded and checked against the config and card schemas.

Syntax of VALUES (one `--grid` per field; the sweep runs the cross product of all of them):

    v1,v2,v3        a list; each item is read as YAML (16, 2.5e12, max, fp8, true)
    a..b            a range of numbers: a, 2a, 4a, ... up to b (doubling; b itself is included
                    when the doubling reaches it), e.g. 16..256 -> 16,32,64,128,256 and
                    1..512 -> the powers of two from 1 to 512
    a..b:s          an arithmetic range a, a+s, a+2s, ... up to b inclusive, e.g. 16..64:16 -> 16,32,48,64
    list items may themselves be ranges: 1,3..12:3 -> 1,3,6,9,12

FIELD is a dotted path as `--set` takes it: `deployment.ffn.ep`, `workload.decode_batch_per_gpu`,
any model card field (`model.num_key_value_heads`), any hardware card field
(`hardware.peak.hbm_bandwidth`, `hardware.peak.flops.fp8`), a field of the config's speculative
section (`speculative.acceptance_rate`, `speculative.lookahead`, `speculative.draft_model`), or a
whole card (`model=qwen3-8b,llama-3.1-8b`, `hardware=h20,h800`). Every path is checked against
the schema before anything runs, and every value is converted and range-checked by the same
schema code the config loader uses, so a typo or an out-of-range value is reported at once with
the field named.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints


from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.cards.schema import build, check_number
from infersim.run.config import Speculative
from infersim.cards.deployment import Deployment, Workload
from infersim.base.plaindata import parse_flag_value
from infersim.base.errors import ConfigError, InferSimError, echo, shorten

MAX_VALUES_PER_AXIS = 100_000

#: dotted fields the layout search (`--gpus`) chooses itself; they cannot also be grid axes then
SEARCHED_FIELDS = frozenset({
    "deployment.num_gpus", "deployment.num_nodes", "deployment.pp", "deployment.attention.tp",
    "deployment.attention.dp", "deployment.ffn.tp", "deployment.ffn.ep", "deployment.ffn.dp",
    "workload.decode_batch_per_gpu",
})

#: dotted fields that describe *how* a design is deployed, not the design: rows that differ only in
#: these are alternative deployments of one variant (the "best deployment" is chosen among them)
DEPLOYMENT_FIELDS = SEARCHED_FIELDS | {"deployment.overlap", "deployment.moe_comm", "workload.prefill_tokens_per_gpu"}

_ROOTS: dict[str, type] = {"model": ModelCard, "hardware": HardwareCard, "deployment": Deployment, "workload": Workload,
                           "speculative": Speculative}


@dataclass(frozen=True)
class GridAxis:
    """One swept field: its dotted path and the values it takes, already converted to the field's type."""

    path: str
    values: tuple[Any, ...]

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    @property
    def is_deployment(self) -> bool:
        return self.path in DEPLOYMENT_FIELDS

    @property
    def label(self) -> str:
        """Short column name: the path without its first part (model., deployment., ...)."""
        parts = self.parts
        return self.path if len(parts) == 1 else ".".join(parts[1:])


def grid_size(axes: typing.Sequence[GridAxis]) -> int:
    return math.prod(len(a.values) for a in axes)


def grid_point(axes: typing.Sequence[GridAxis], index: int) -> tuple[Any, ...]:
    """Values of the index-th point of the cross product (the last axis varies fastest)."""
    values = []
    for axis in reversed(axes):
        index, i = divmod(index, len(axis.values))
        values.append(axis.values[i])
    return tuple(reversed(values))


def grid_points(axes: typing.Sequence[GridAxis], start: int, stop: int) -> typing.Iterator[tuple[Any, ...]]:
    """The values of points start..stop-1 in grid_point's order, made at C speed (a sweep's chunk
    takes its points' values from here rather than dividing each index by every axis)."""
    return itertools.islice(itertools.product(*(axis.values for axis in axes)), start, stop)


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_grid(texts: typing.Iterable[str], searched: bool = False) -> list[GridAxis]:
    """Parse `FIELD=VALUES` strings into axes; raises InferSimError with one clear message.

    `searched`: the layout search is on, so fields it chooses (SEARCHED_FIELDS) are refused.
    Values are expanded and checked for the field's type here; card-level cross-field checks
    (e.g. KV heads dividing query heads) run per variant, and failing variants are reported."""
    axes: list[GridAxis] = []
    seen: set[str] = set()
    for text in texts:
        if "=" not in text:
            raise InferSimError(f"--grid '{text}': expected FIELD=VALUES, e.g. deployment.ffn.ep=8,16,32 "
                                "or workload.decode_batch_per_gpu=16..256")
        field, raw = (s.strip() for s in text.split("=", 1))
        if not field or any(not p for p in field.split(".")):
            raise InferSimError(f"--grid '{text}': empty part in field name '{field}'")
        if field in seen:
            raise InferSimError(f"--grid '{text}': field '{field}' is given twice; put all its values in one --grid")
        seen.add(field)
        if searched and field in SEARCHED_FIELDS:
            raise InferSimError(f"--grid '{text}': {field} is chosen by the layout search (--gpus, --batch); "
                                "drop it from --grid")
        hint = field_hint(field)
        items = expand_values(raw, text)
        fast = _fast_converter(field, hint)
        values = tuple(fast(item, text) if fast else convert_value(field, hint, item, text) for item in items)
        axes.append(GridAxis(field, _dedupe(values)))
    return axes


def _dedupe(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop repeated values, keeping the first (2 and 2.0 stay distinct; so do 1 and true)."""
    seen: set[tuple[type, Any]] = set()
    out: list[Any] = []
    for v in values:
        key = (type(v), v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return tuple(out)


def expand_values(raw: str, text: str = "") -> list[Any]:
    """The raw items of a VALUES string (YAML-read, ranges expanded), before type conversion."""
    text = text or raw
    if not raw.strip():
        raise InferSimError(f"--grid '{text}': no values after '='")
    out: list[Any] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            raise InferSimError(f"--grid '{text}': empty value in the list (two commas, or a trailing comma)")
        if ".." in item:
            out.extend(expand_range(item, text))
        else:
            out.append(parse_flag_value(item, f"--grid {text.split('=', 1)[0]}="))
        if len(out) > MAX_VALUES_PER_AXIS:
            raise InferSimError(f"--grid '{text}': more than {MAX_VALUES_PER_AXIS:,} values")
    return out


def _number(token: str, text: str, what: str) -> int | float:
    token = token.strip()
    try:
        return int(token)
    except ValueError:
        pass
    try:
        value = float(token)
    except ValueError:
        raise InferSimError(f"--grid '{text}': range {what} '{token}' is not a number") from None
    if not math.isfinite(value):
        raise InferSimError(f"--grid '{text}': range {what} '{token}' is not a finite number")
    return value


def expand_range(item: str, text: str = "") -> list[int | float]:
    """`a..b` (doubling from a, up to b) or `a..b:s` (step s, b included when reached)."""
    text = text or item
    head, _, step_text = item.partition(":")
    a_text, sep, b_text = head.partition("..")
    if not sep or not a_text.strip() or not b_text.strip() or (_ and not step_text.strip()):
        raise InferSimError(f"--grid '{text}': bad range '{item}' (expected a..b or a..b:step)")
    a, b = _number(a_text, text, "start"), _number(b_text, text, "end")
    if b < a:
        raise InferSimError(f"--grid '{text}': range '{item}' ends ({b}) before it starts ({a})")
    values: list[int | float] = []
    if step_text:
        step = _number(step_text, text, "step")
        if step <= 0:
            raise InferSimError(f"--grid '{text}': range step must be positive (got {step})")
        count = int(math.floor((b - a) / step + 1e-9)) + 1
        if count > MAX_VALUES_PER_AXIS:
            raise InferSimError(f"--grid '{text}': range '{item}' has {count:,} values (at most {MAX_VALUES_PER_AXIS:,})")
        exact = all(isinstance(x, int) for x in (a, b, step))
        values = [a + i * step if exact else _tidy(a + i * step) for i in range(count)]
    else:
        if a <= 0:
            raise InferSimError(f"--grid '{text}': doubling range '{item}' needs a positive start "
                                "(use a..b:step for an arithmetic range)")
        x = a
        while x <= b * (1 + 1e-12):
            values.append(x if isinstance(x, int) else _tidy(x))
            x = x * 2
    return values


def _tidy(x: float) -> float:
    """Round float steps to 12 significant digits so 0.1+0.2 style noise does not show up."""
    return float(f"{x:.12g}")


# ---------------------------------------------------------------------------------------------
# Field paths and values


def field_hint(path: str) -> Any:
    """The type hint of a dotted field, or an InferSimError naming the unknown part and the known ones."""
    parts = path.split(".")
    root = parts[0]
    if root not in _ROOTS:
        if root == "mfu_tables":
            raise InferSimError("--grid mfu_tables: kernel tables cannot be swept; use --mfu-tables")
        raise _unknown(path, root, list(_ROOTS))
    if len(parts) == 1:
        if root in ("model", "hardware"):
            return str  # a whole card: a bundled name or a path
        raise InferSimError(f"--grid {path}: '{root}' is a section; vary one of its fields "
                            f"({', '.join(_field_names(_ROOTS[root]))})")
    hint: Any = _ROOTS[root]
    for i, part in enumerate(parts[1:], start=1):
        so_far = ".".join(parts[:i])
        if dataclasses.is_dataclass(hint):
            names = _field_names(hint)
            if part not in names:
                raise _unknown(path, part, names, so_far)
            hint = get_type_hints(hint)[part]
        elif get_origin(hint) is dict:
            hint = get_args(hint)[1]
        else:
            raise InferSimError(f"--grid {path}: '{so_far}' is a value, not a section")
    if dataclasses.is_dataclass(hint):
        raise InferSimError(f"--grid {path}: '{path}' is a section; vary one of its fields "
                            f"({', '.join(_field_names(hint))})")
    if get_origin(hint) is dict:
        raise InferSimError(f"--grid {path}: '{path}' is a mapping; vary one entry, e.g. {path}.bf16")
    return hint


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _unknown(path: str, part: str, known: list[str], parent: str = "") -> InferSimError:
    close = difflib.get_close_matches(part, known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    where = f" in '{parent}'" if parent else ""
    return InferSimError(f"--grid {path}: unknown field '{part}'{where}{hint} (known: {', '.join(known)})")


_SAMPLES: dict[str, Any] = {}


def convert_value(path: str, hint: Any, value: Any, text: str = "") -> Any:
    """Convert and range-check one value for a dotted field by building the enclosing schema class
    with it (the exact checks and messages of config loading)."""
    parts = path.split(".")
    if len(parts) == 1:  # a whole card by name or path
        if not isinstance(value, str):
            raise InferSimError(f"--grid '{shorten(text or path)}': a {parts[0]} card is given by name or path "
                                f"(got {echo(value)})")
        return value
    root_cls = _ROOTS[parts[0]]
    cls, data, leaf_parts = _enclosing(root_cls, parts[1:])
    node = data
    for p in leaf_parts[:-1]:
        node = node.setdefault(p, {})
    node[leaf_parts[-1]] = value
    prefix = ".".join(parts[: len(parts) - len(leaf_parts)])
    try:
        built = build(cls, data, f"--grid {path}", prefix)
    except ConfigError as exc:
        raise InferSimError(f"--grid '{shorten(text or path)}': value {echo(value)} {exc.problem}") from None
    out: Any = built
    for p in leaf_parts:
        out = out[p] if isinstance(out, dict) else getattr(out, p)
    return out


def _fast_converter(path: str, hint: Any) -> Any:
    """For numeric fields: a converter doing what the schema does to a plain number (int fields
    take integral numbers, float fields any number; the field's gt/ge/le range) without building
    a dataclass per value, so a 100,000-value range parses in well under a second. Anything that
    is not a plain number goes through convert_value."""
    parts = path.split(".")
    if len(parts) < 2:
        return None
    options = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    kind = int if int in options else float if float in options else None
    if kind is None:
        return None
    meta = _leaf_metadata(parts)

    def convert(value: Any, text: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return convert_value(path, hint, value, text)
        try:  # the one number rule of the schema (finite, whole for counts, magnitudes, range)
            return check_number(value, "", path, whole=kind is int, gt=meta.get("gt"), ge=meta.get("ge"),
                                le=meta.get("le"))
        except ConfigError as exc:
            raise InferSimError(f"--grid '{shorten(text or path)}': value {shorten(repr(value))} {exc.problem}") from None

    return convert


def _leaf_metadata(parts: list[str]) -> dict[str, Any]:
    """The range metadata that applies to a leaf: its own field's, or its mapping field's."""
    hint: Any = _ROOTS[parts[0]]
    meta: dict[str, Any] = {}
    for part in parts[1:]:
        if dataclasses.is_dataclass(hint):
            fld = next(f for f in dataclasses.fields(hint) if f.name == part)
            meta = dict(fld.metadata)
            hint = get_type_hints(hint)[part]
        else:  # a mapping entry keeps the mapping field's metadata
            hint = get_args(hint)[1]
    return meta


def _enclosing(cls: type, parts: list[str]) -> tuple[type, dict[str, Any], list[str]]:
    """The innermost dataclass holding the leaf, a valid sample of it as a mapping, and the path
    from it to the leaf (through dict entries)."""
    hint: Any = cls
    owner, rest = cls, list(parts)
    for i, part in enumerate(parts):
        if dataclasses.is_dataclass(hint):
            owner, rest = hint, parts[i:]
            hint = get_type_hints(hint)[part]
        else:  # a dict entry
            hint = get_args(hint)[1]
    return owner, _sample(owner), rest


def _sample(cls: type) -> dict[str, Any]:
    """A minimal valid mapping for `cls`: required fields filled with in-range placeholders, so
    that building it with one field replaced checks only that field."""
    data: dict[str, Any] = {}
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        data[f.name] = _placeholder(hints[f.name])
    return data


def _placeholder(hint: Any) -> Any:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _sample(hint)
    if origin is dict:
        return {}
    if origin is typing.Literal:
        return get_args(hint)[0]
    if origin in (typing.Union, types.UnionType):
        return _placeholder([a for a in get_args(hint) if a is not type(None)][0])
    if hint is bool:
        return False
    if hint is str:
        return "x"
    return 1  # ints and floats: 1 satisfies every gt=0 / ge=0 / le=1 range in the schemas
