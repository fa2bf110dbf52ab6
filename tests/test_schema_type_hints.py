"""The card loader's type-hint resolver (infersim.cards.schema.type_hints) is typing.get_type_hints
without its ForwardRef wrapping: the same hints, for every dataclass the package defines."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing

import infersim
from infersim.cards.schema import type_hints

# modules that need optional extras (matplotlib, dask, torch) to import
OPTIONAL = ("infersim.plot", "infersim.tabletools.bench.torch_backend", "infersim.sweep.cluster")


def _dataclasses() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(infersim.__path__, "infersim."):
        if info.name.startswith(OPTIONAL) or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == info.name:
                found.append(value)
    return found


def _resolved(resolve: typing.Callable[[type], dict[str, typing.Any]], cls: type) -> object:
    """resolve(cls), or the type of what it raises (a hint naming a type imported for type checking
    only: neither resolver can evaluate it)."""
    try:
        return resolve(cls)
    except NameError as exc:
        return type(exc)


def test_type_hints_equal_get_type_hints_on_every_dataclass() -> None:
    classes = _dataclasses()
    assert len(classes) > 150  # the cards, shapes, results and serving records
    differ = [cls.__qualname__ for cls in classes
              if _resolved(type_hints, cls) != _resolved(typing.get_type_hints, cls)]
    assert differ == []
    # every class the card loader builds resolves
    assert sum(isinstance(_resolved(type_hints, cls), dict) for cls in classes) > 150
