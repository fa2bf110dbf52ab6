"""The kept dataclass code is one file per module, holding only the code its classes now use."""

from __future__ import annotations

import pytest

from infersim import codecache, diskcache


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A process's codecache state, with its cache files in tmp_path."""
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path))

    def restart() -> None:
        for name, value in (("_modules", {}), ("_used", {}), ("_changed", set())):
            monkeypatch.setattr(codecache, name, value)

    restart()
    return restart


def define(*sources: str) -> dict[str, object]:
    module: dict[str, object] = {"__name__": "infersim.fake", "__file__": "/somewhere/infersim/fake.py"}
    for source in sources:
        codecache._exec(source, module)
    return module


def kept_files(tmp_path) -> dict[str, dict]:
    return {p.name: diskcache.read_marshal(p.name) for p in tmp_path.glob("dataclass-code-*infersim.fake-*.marshal")}


def test_an_edited_module_keeps_only_its_current_code(fresh, tmp_path) -> None:
    assert define("def a(): return 1", "def b(): return 2")["b"]() == 2
    codecache._save()
    (name, kept), = kept_files(tmp_path).items()
    assert sorted(kept) == ["def a(): return 1", "def b(): return 2"]

    fresh()  # a later process: all kept, nothing compiled or written
    assert define("def a(): return 1", "def b(): return 2")["a"]() == 1
    assert not codecache._changed

    fresh()  # the module now defines b differently: a is kept, the old b is dropped
    assert define("def a(): return 1", "def b(): return 3")["b"]() == 3
    codecache._save()
    assert list(kept_files(tmp_path)) == [name]
    assert sorted(kept_files(tmp_path)[name]) == ["def a(): return 1", "def b(): return 3"]


def test_other_code_is_compiled_as_before(fresh, tmp_path) -> None:
    module = {"__name__": "someone.else"}
    codecache._exec("def c(): return 4", module)
    assert module["c"]() == 4 and not codecache._changed and not list(tmp_path.iterdir())


def test_an_annotation_text_is_compiled_once() -> None:
    first = codecache._compile("tuple[int, ...]", "<string>", "eval")
    assert codecache._compile("tuple[int, ...]", "<string>", "eval") is first
    assert eval(first) == tuple[int, ...]
    assert codecache._compile("x = 1", "<string>", "exec", dont_inherit=True) is not \
        codecache._compile("x = 1", "<string>", "exec", dont_inherit=True)  # other uses: compiled as asked
