"""The package's shape: imports run down the declared layers only, no import cycle, no god-module.

Every `import` and `from ... import` of every module of infersim/ counts, wherever it stands: at
the top, inside a function (a lazy import is still a dependency, only a later one), under `if
TYPE_CHECKING:`. Importing `infersim.a.b` also runs `infersim/a/__init__.py`, so that package is an
import too. The layers, lowest first, are the ones docs/architecture.md draws; a module belongs to
the layer of the longest prefix that names it. A module may import its own layer's modules and any
lower layer's, never a higher layer's, and the imports of the whole package form no cycle. When
something above is needed below, it moves down (docs/architecture.md says how the last ones did).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "infersim"

#: (layer, what it holds, the folders (packages) of infersim/ that are the layer), lowest first. A
#: driver's command line and its report (`serve/cli.py`, `sweep/output.py`) sit in the driver's folder
#: and belong to the presentation layer: PRESENTATION_IN_DRIVERS lists them.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("foundation", "errors, units, sharding checks, caches, text tables: nothing about models or GPUs",
     ("infersim", "infersim.base")),
    ("cards", "facts: model, hardware and engine cards, a run's deployment and workload, the names of modules "
              "and operations",
     ("infersim.cards",)),
    ("shapes", "what a step runs: kernel shapes and the cost record, the plan of operations",
     ("infersim.shapes",)),
    ("costing", "what a kernel costs (measured tables, roofline, collectives, host transfers) and the "
                "operations of each module (attention, FFN/MoE, linear attention, communication)",
     ("infersim.tables", "infersim.costing", "infersim.modules")),
    ("engine", "the stage engine: a plan's costs composed into a step",
     ("infersim.engine",)),
    ("run", "one run: its config loaded, memory, prefill and decode, speculative decoding",
     ("infersim.run",)),
    ("drivers", "runs put to work: serving, sweeps, generation, validation, traces, launch commands; tables "
                "measured, imported, learned or compared",
     ("infersim.serve", "infersim.sweep", "infersim.generate", "infersim.validate", "infersim.trace",
      "infersim.tabletools", "infersim.launch", "infersim.calibrate")),
    ("presentation", "reports, figures and the command line",
     ("infersim.cli", "infersim.plot", "infersim.__main__")),
)

#: the command-line and report modules inside a driver's folder (presentation layer)
PRESENTATION_IN_DRIVERS = ("infersim.tabletools.cli", "infersim.trace.cli", "infersim.trace.report",
                           "infersim.serve.cli", "infersim.serve.report", "infersim.sweep.cli",
                           "infersim.sweep.output", "infersim.generate.cli", "infersim.generate.report",
                           "infersim.validate.cli", "infersim.validate.report", "infersim.launch.report",
                           "infersim.calibrate.cli")

#: imports allowed against the layers, "importer -> imported": reason. None today; an entry must
#: say why the import cannot go down instead.
ALLOWED_UPWARD: dict[str, str] = {}

#: the most lines a module may have: a file of 800-1,100 lines is too big to hold in one's head, and
#: god-modules grow back where nothing checks their size. A module that
#: reaches it is split where its sections already are, not given a larger budget.
MAX_MODULE_LINES = 600


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported dotted name is (or lives in): `infersim.shapes.kernels.GemmShape` -> infersim.shapes.kernels."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def package_imports() -> list[Import]:
    """Every import of one infersim module by another, top-level or lazy, with its file and line."""
    modules = module_files()
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # `from infersim.modules import eager` imports a module; `from infersim.shapes.kernels import Cost` a name
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            for name in names:
                target = _resolve(name, modules) if name.startswith("infersim") else None
                if target is None:
                    continue
                if target != module:
                    found.append(Import(module, target, where))
                # importing infersim.a.b runs infersim/a/__init__.py first (unless the importer is inside infersim.a)
                parts = target.split(".")
                for parent in (".".join(parts[:i]) for i in range(2, len(parts))):
                    if parent != module and not module.startswith(parent + "."):
                        found.append(Import(module, parent, where))
    return found


#: the tests that read every module's imports run in one pytest-xdist worker and read them once
READS_THE_IMPORTS = pytest.mark.xdist_group("package-imports")


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return package_imports()


def layer_of(module: str) -> int:
    """Index in LAYERS of the layer naming `module` by its longest prefix (-1: none does)."""
    if module in PRESENTATION_IN_DRIVERS:
        return len(LAYERS) - 1
    best, best_length = -1, -1
    for index, (_name, _what, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # the package itself ("infersim": its __init__) names no module below it
            covers = module == prefix or (prefix != "infersim" and module.startswith(prefix + "."))
            if covers and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def test_the_package_root_holds_only_folders() -> None:
    # every module lives in the folder of its layer; the root keeps the package and its entry point
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the package root (move them into their layer's folder): {loose}"


def test_each_folder_is_one_layer() -> None:
    # a folder's modules share its layer, but for the command-line and report modules of a driver
    for module in module_files():
        parts = module.split(".")
        if len(parts) < 3 or module in PRESENTATION_IN_DRIVERS:
            continue
        folder = ".".join(parts[:2])
        assert layer_of(module) == layer_of(folder), f"{module} is not in the layer of its folder {folder}"


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in module_files() if layer_of(m) < 0]
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


@READS_THE_IMPORTS
def test_imports_run_down_the_layers(imports: list[Import]) -> None:
    upward = []
    for imp in imports:
        low, high = layer_of(imp.importer), layer_of(imp.imported)
        if high > low and f"{imp.importer} -> {imp.imported}" not in ALLOWED_UPWARD:
            upward.append(f"{imp} ({LAYERS[low][0]} imports {LAYERS[high][0]})")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(set(upward)))


@READS_THE_IMPORTS
def test_no_import_cycle(imports: list[Import]) -> None:
    edges: dict[str, dict[str, str]] = {}
    for imp in imports:
        edges.setdefault(imp.importer, {}).setdefault(imp.imported, imp.where)
    cycle = _find_cycle(edges)
    assert cycle is None, "import cycle:\n" + "\n".join(
        f"{edges[a][b]}: {a} imports {b}" for a, b in zip(cycle, cycle[1:]))


def _find_cycle(edges: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(edges):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(edges.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


@READS_THE_IMPORTS
def test_the_checks_see_lazy_imports_and_cycles(imports: list[Import]) -> None:
    # the import reader counts an import inside a function, and the cycle search finds a cycle of three
    assert any(i.importer == "infersim.cli.main" and i.imported == "infersim.run.simulate" for i in imports)  # lazy there
    assert _find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": ""}, "b": {"c": ""}}) is None
    assert layer_of("infersim.tabletools.bench.runner") > layer_of("infersim.tables.lookup") > layer_of("infersim.shapes.kernels")


def test_no_module_past_the_line_budget() -> None:
    too_long = {str(path.relative_to(REPO_ROOT)): n for path in module_files().values()
                if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them along their sections): {too_long}"


def layer_table() -> str:
    """The layers, lowest first, each with its modules (`python scripts/layers.py`)."""
    files = module_files()
    out = []
    for index, (name, what, _prefixes) in enumerate(LAYERS):
        members = sorted(m for m in files if layer_of(m) == index)
        out.append(textwrap.fill(f"{index + 1}. {name}: {what}", width=100, subsequent_indent="   "))
        out.append(textwrap.fill(", ".join(m.removeprefix("infersim.") or "infersim" for m in members), width=100,
                                 initial_indent="   ", subsequent_indent="   "))
    return "\n".join(out)
