"""Cheaper construction for the frozen records a sweep builds and copies by the million.

A sweep prices each configuration from fresh small records: kernel shapes, their costs, a step's
operations, context and plan. dataclass(frozen=True) stores every field in `__init__` through
`object.__setattr__`, looked up per field past the class's frozen guard; that call chain is most of
a record's construction. `cheap_init` gives such a class an `__init__` that stores each field
through its slot's own descriptor instead: the same store, the same signature and defaults, and the
record stays frozen (assigning a field afterwards still raises FrozenInstanceError). With the
costing records built this way a sweep configuration costs 11-15% fewer interpreter instructions
(`benchmarks/sweep_rate.py --instructions`, docs/speed.md).

Only plain fields are supported (positional-or-keyword, with or without a default): a class with
keyword-only fields, default factories, InitVars, fields left out of `__init__` or a
`__post_init__` is refused at import, where its dataclass `__init__` would do more than store.

`evolve` is `dataclasses.replace` for a dataclass of plain fields: a sweep copies a deployment or a
workload with a field or two changed for every layout it searches, and `replace` checks each
field's kind before copying it (about four times the work of copying it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def _refusal(field: dataclasses.Field[Any]) -> str | None:
    if not field.init:
        return "is left out of __init__"
    if field.kw_only:
        return "is keyword-only"
    if field.default_factory is not dataclasses.MISSING:
        return "has a default factory"
    if field._field_type is not dataclasses._FIELD:  # type: ignore[attr-defined]  # an InitVar or ClassVar
        return "is not a plain field"
    return None


def cheap_init(cls: type[T]) -> type[T]:
    """`cls` (a dataclass(frozen=True, slots=True)) with an `__init__` that stores each field through
    its slot descriptor (see the module's docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"cheap_init: {cls.__qualname__} is not a dataclass(frozen=True, slots=True)")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"cheap_init: {cls.__qualname__} has a __post_init__")
    names: dict[str, Any] = {}
    signature, body = [], []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        why = _refusal(field)
        if why is not None:
            raise TypeError(f"cheap_init: {cls.__qualname__}.{field.name} {why}")
        names[f"_store_{field.name}"] = cls.__dict__[field.name].__set__
        if field.default is dataclasses.MISSING:
            signature.append(field.name)
        else:
            names[f"_default_{field.name}"] = field.default
            signature.append(f"{field.name}=_default_{field.name}")
        body.append(f"    _store_{field.name}(self, {field.name})")
    source = f"def __init__(self, {', '.join(signature)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, names)  # noqa: S102 - built from the class's own field names, as dataclasses does
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def evolve(obj: T, /, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)` for a dataclass whose fields are all plain (each in
    `__init__`, none an InitVar or ClassVar: what tests/test_records.py checks of the classes this is
    used on): its fields' values, `changes` over them, through the class's `__init__` (which
    validates as it always does, and refuses a name that is not a field)."""
    values = {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]
    values.update(changes)
    return type(obj)(**values)
