"""Put what a GPU run measured where the project reads it, and say what to run next.

    python3 benchmarks/gpu/install_results.py FILES_AT [FILES_AT ...] [--force] [--root DIR] [--allow-smoke]

FILES_AT is a folder of files a GPU run wrote (`run_gpu.sh all`: manifest.json, run.log and the archives
tables-<card>.tar.gz, e2e-<card>.tar.gz, traces-<card>.tar.gz; loose files of the single tools are taken too):
  <card>/provenance.yaml + CSVs     -> mfu_tables/measured/<card>/torch-<version>/   (the table directory, its
                                       provenance included: device, versions, date, command, what was not measured)
  e2e-<card>-<mode>.yaml            -> infersim/validate/measured/                   (read by `validate`)
  *.json.gz traces, *.run.yaml, *.config.json -> tests/data/traces/<card>/           (`compare --trace` checks)
  manifest.json, logs, summaries, kernel-counts-*.json -> benchmarks/gpu/results/<card>/   (the record of the run)
Each table directory and validation file is loaded first (one that does not load is not installed). Smoke runs
and fake runs (a CPU, or stand-in tools) measure nothing and are refused unless --allow-smoke (for testing this
script). Nothing is overwritten without --force (a file identical to the one in place is left as it is).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from record_traces import run_config_of  # noqa: E402

from infersim.base.errors import InferSimError  # noqa: E402
from infersim.tables.format import PROVENANCE_FILE  # noqa: E402
from infersim.tables.table_files import read_table_dir  # noqa: E402
from infersim.validate.measured import load_measured  # noqa: E402

RECORD_PATTERNS = ("manifest.json", "run.log", "*.log", "summary*.json", "recorded.json", "kernel-counts-*.json",
                   "checks.md")


def torch_dir_name(version: str) -> str:
    """torch-2.11.0 for 2.11.0+cu130: the local build tag stays in the provenance."""
    return "torch-" + version.split("+")[0]


@dataclass
class Installer:
    root: Path
    force: bool
    allow_smoke: bool
    done: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def refuse_smoke(self, what: Path, smoke: bool) -> bool:
        """True where `what` is a smoke or fake run that is not to be installed (the reason is an error)."""
        if smoke and not self.allow_smoke:
            raise SystemExit(f"{what}: a smoke or fake run, not a measurement: not installed (--allow-smoke "
                             f"installs it anyway, for testing this script)")
        return False

    def place(self, source: Path, target: Path, what: str) -> None:
        """Copy a file or a directory to `target`; an existing different one only with --force."""
        if target.exists() and not self.force:
            if source.is_file() and filecmp.cmp(source, target, shallow=False):
                self.done.append(f"{what} {source.name}: already in place at {self.shown(target)}")
                return
            raise SystemExit(f"{target} exists: pass --force to replace it")
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.partial"))
        else:
            shutil.copyfile(source, target)
        self.done.append(f"{what} {source} -> {self.shown(target)}")

    def shown(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def unpacked(source: Path, scratch: Path) -> list[Path]:
    """The folders to look in: `source` itself and each of its archives, unpacked under `scratch`."""
    folders = [source]
    for archive in sorted(source.glob("*.tar.gz")):
        target = scratch / archive.name.removesuffix(".tar.gz")
        target.mkdir(parents=True)
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="data")  # no absolute paths, links out or devices
            else:  # pragma: no cover - Python < 3.11.4
                tar.extractall(target)
        folders.append(target)
    return folders


def read_manifest(source: Path) -> dict[str, Any]:
    path = source / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def install_tables(folders: list[Path], installer: Installer, smoke_run: bool) -> list[str]:
    """Table directories -> mfu_tables/measured/<card>/torch-<version>/; their cards."""
    cards = []
    for folder in folders:
        for prov in sorted(folder.glob(f"*/{PROVENANCE_FILE}")):
            table_dir = read_table_dir(prov.parent)  # refuses a directory that does not load
            provenance = table_dir.provenance
            smoke = smoke_run or "device_note" in provenance.software
            installer.refuse_smoke(prov.parent, smoke)
            card = prov.parent.name
            target = installer.root / "mfu_tables" / "measured" / card / torch_dir_name(
                provenance.software.get("torch", "unknown"))
            installer.place(prov.parent, target, "tables")
            if not provenance.complete:
                installer.warnings.append(f"{card} tables: the run stopped before its end (complete: false)")
            for note in provenance.notes:
                if note.startswith("not measured") and "not reached" in note:
                    installer.warnings.append(f"{card} tables: {note}")
            cards.append(card)
    return cards


def install_e2e(folders: list[Path], installer: Installer, smoke_run: bool) -> list[Path]:
    """Validation files -> infersim/validate/measured/ (each loaded by validate's reader first)."""
    installed = []
    for folder in folders:
        for e2e in sorted(folder.glob("e2e-*.yaml")):
            try:
                measured = load_measured([e2e])
            except InferSimError as exc:
                raise SystemExit(f"{e2e}: does not load: {exc}") from None
            installer.refuse_smoke(e2e, smoke_run or bool(measured.not_expressed and not measured.reference))
            target = installer.root / "infersim" / "validate" / "measured" / e2e.name
            installer.place(e2e, target, "validation")
            installed.append(target)
    return installed


def install_traces(folders: list[Path], installer: Installer, card: str, smoke_run: bool) -> list[Path]:
    """Traces and the run and HF configs beside them -> tests/data/traces/<card>/."""
    installed = []
    for folder in folders:
        traces = sorted(folder.glob("*.json.gz"))
        if not traces:
            continue
        installer.refuse_smoke(folder, smoke_run or any("-cpu-" in t.name or "-fake-" in t.name for t in traces))
        target_dir = installer.root / "tests" / "data" / "traces" / card
        for path in traces + sorted(folder.glob("*.run.yaml")) + sorted(folder.glob("*.config.json")):
            installer.place(path, target_dir / path.name, "trace file")
            if path.name.endswith(".json.gz"):
                installed.append(target_dir / path.name)
    return installed


def install_records(folders: list[Path], installer: Installer, card: str) -> None:
    """The record of the run (manifest, logs, summaries) -> benchmarks/gpu/results/<card>/<archive>/."""
    base = installer.root / "benchmarks" / "gpu" / "results" / card
    for index, folder in enumerate(folders):
        where = base if index == 0 else base / folder.name
        records = sorted({path for pattern in RECORD_PATTERNS for path in folder.glob(pattern) if path.is_file()})
        for path in records:
            installer.place(path, where / path.name, "record")


def install(source: Path, installer: Installer) -> dict[str, Any]:
    """Everything of one FILES_AT folder; what was installed, by kind."""
    manifest = read_manifest(source)
    smoke_run = bool(manifest.get("smoke") or manifest.get("fake"))
    with tempfile.TemporaryDirectory(prefix="infersim-install-") as scratch:
        folders = unpacked(source, Path(scratch))
        cards = install_tables(folders, installer, smoke_run)
        card = str(manifest.get("card") or (cards[0] if cards else "unknown"))
        e2e = install_e2e(folders, installer, smoke_run)
        traces = install_traces(folders, installer, card, smoke_run)
        install_records(folders, installer, card)
    for stage in manifest.get("stages", []):
        if stage.get("status") != "complete":
            installer.warnings.append(f"stage {stage.get('name')}: {stage.get('status')} ({stage.get('why', '')})")
    return {"card": card, "tables": cards, "e2e": e2e, "traces": traces}


def next_steps(results: list[dict[str, Any]], root: Path) -> list[str]:
    lines = []
    for result in results:
        card = result["card"]
        if result["tables"]:
            lines.append(f"python -m infersim mfu compare aiconfigurator/{card}/trtllm-1.3.0rc20 "
                         f"measured/{card}/torch-<version>")
        for path in result["e2e"]:
            lines.append(f"python -m infersim validate --measured {path.relative_to(root)}")
        for path in result["traces"]:
            compiled = "-compiled-" in path.name or "-graphs-" in path.name  # the engine card of what ran
            lines.append(f"python -m infersim compare --trace {path.relative_to(root)} --config "
                         f"{run_config_of(path).relative_to(root)}"
                         + (" --set engine=huggingface-compiled" if compiled else ""))
    return lines + ["git add mfu_tables/measured infersim/validate/measured tests/data/traces benchmarks/gpu/results"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, metavar="FILES_AT")
    parser.add_argument("--force", action="store_true", help="replace files and directories already installed")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository to install into (default: this one)")
    parser.add_argument("--allow-smoke", action="store_true",
                        help="install smoke and fake runs too (they measure nothing: for testing this script)")
    args = parser.parse_args(argv)
    installer = Installer(args.root.resolve(), args.force, args.allow_smoke)
    results = []
    for source in args.sources:
        if not source.is_dir():
            raise SystemExit(f"{source}: not a folder (give the folder the GPU run's files came back to)")
        results.append(install(source, installer))
    for line in installer.done:
        print(line)
    for line in installer.warnings:
        print(f"warning: {line}")
    print("\nnext:")
    for line in next_steps(results, installer.root):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
