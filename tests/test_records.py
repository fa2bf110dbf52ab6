"""cheap_init and evolve: the records keep every behaviour of their dataclass constructor and replace()."""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import pkgutil
from dataclasses import dataclass, field

import pytest

import infersim
from infersim.base.records import cheap_init, evolve
from infersim.base.errors import InferSimError
from infersim.cards.deployment import AttentionLayout, Deployment, FfnLayout
from infersim.sweep.evaluate import Search
from infersim.shapes.kernels import AttentionShape, Bound, Cost, Source
from infersim.shapes.plan import Operation


@cheap_init
@dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 2
    label: str = "p"


def test_constructs_as_the_dataclass_would() -> None:
    assert _Point(1) == _Point(1, 2, "p") == _Point(x=1, label="p")
    assert (_Point(1, 3).x, _Point(1, 3).y, _Point(1, 3).label) == (1, 3, "p")
    assert repr(_Point(5, label="q")) == "_Point(x=5, y=2, label='q')"
    assert hash(_Point(1)) == hash(_Point(1, 2, "p"))
    assert _Point.__init__.__qualname__ == "_Point.__init__"


def test_arguments_are_checked_as_python_checks_them() -> None:
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        _Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        _Point(1, z=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        _Point(1, x=2)  # type: ignore[misc]


def test_stays_frozen_and_replaceable_and_picklable() -> None:
    point = _Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    assert dataclasses.replace(point, y=7) == _Point(1, 7)
    assert pickle.loads(pickle.dumps(point)) == point


def test_the_costing_records_use_it() -> None:
    shape = AttentionShape("mha", "decode", 4, 1, 1000, 32, 8, 128, 128)
    assert shape.kv_len == 1000 and shape.window == 0 and shape.dtype == "bf16"
    assert Operation("attn_core", "attention", shape).count == 1
    cost = Cost(1.0, 2.0, 3.0, Bound.MEMORY, Source.ROOFLINE)
    assert cost.detail == "" and cost == Cost(1.0, 2.0, 3.0, Bound.MEMORY, Source.ROOFLINE, "")
    assert Cost.__init__.__qualname__ == "Cost.__init__"


@pytest.mark.parametrize("make, why", [
    (lambda: dataclass(frozen=True)(type("Plain", (), {"__annotations__": {"x": "int"}})), "is not a dataclass"),
    (lambda: dataclass(slots=True)(type("Thawed", (), {"__annotations__": {"x": "int"}})), "is not a dataclass"),
])
def test_refuses_what_is_not_a_frozen_slotted_dataclass(make, why) -> None:
    with pytest.raises(TypeError, match=why):
        cheap_init(make())


def test_refuses_fields_whose_constructor_does_more_than_store() -> None:
    with pytest.raises(TypeError, match="Listed.items has a default factory"):
        @cheap_init
        @dataclass(frozen=True, slots=True)
        class Listed:
            items: tuple[int, ...] = field(default_factory=tuple)
    with pytest.raises(TypeError, match="Named.name is keyword-only"):
        @cheap_init
        @dataclass(frozen=True, slots=True, kw_only=True)
        class Named:
            name: str
    with pytest.raises(TypeError, match="Derived has a __post_init__"):
        @cheap_init
        @dataclass(frozen=True, slots=True)
        class Derived:
            x: int

            def __post_init__(self) -> None:
                pass
    with pytest.raises(TypeError, match="Hidden.x is left out of __init__"):
        @cheap_init
        @dataclass(frozen=True, slots=True)
        class Hidden:
            x: int = field(init=False, default=0)


def test_evolve_is_replace() -> None:
    point = _Point(1, 3, "q")
    assert evolve(point, y=7) == dataclasses.replace(point, y=7) == _Point(1, 7, "q")
    assert evolve(point) == point and evolve(point) is not point
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        evolve(point, z=1)


def test_evolve_validates_and_keeps_no_cached_value() -> None:
    dep = Deployment(num_gpus=2, attention=AttentionLayout(tp=2), ffn=FfnLayout(tp=2))
    assert evolve(dep, num_gpus=4) == dataclasses.replace(dep, num_gpus=4) != dep
    search = Search((1, 2), (8,))
    assert search.units == ((1, 1), (2, 1), (2, 2))  # a cached property, kept in the instance's dict
    assert evolve(search, max_pp=1).units == ((1, 1), (2, 1))
    with pytest.raises(InferSimError, match="GPU counts must be whole numbers"):
        evolve(search, gpus=(0,))  # __post_init__ runs


def _package_dataclasses() -> list[type]:
    found: dict[str, type] = {}
    for module in pkgutil.walk_packages(infersim.__path__, "infersim."):
        if module.name.endswith("__main__"):  # runs the CLI
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:  # an optional extra (plots, Dask) that is not installed
            continue
        for value in vars(loaded).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.name:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_dataclass_of_the_package_has_plain_fields_only() -> None:
    """evolve (the sweep's deployment and workload copies, set_path over any card section) copies
    `__dataclass_fields__` through `__init__`: a field left out of `__init__`, an InitVar or a
    ClassVar would break it (or be copied where replace would not)."""
    classes = _package_dataclasses()
    assert len(classes) > 100  # the walk found the package's records
    odd = [f"{cls.__qualname__}.{name}" for cls in classes for name, f in cls.__dataclass_fields__.items()
           if not f.init or f._field_type is not dataclasses._FIELD]  # type: ignore[attr-defined]
    assert odd == []
