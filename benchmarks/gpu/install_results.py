"""Put what a GPU session measured where the project reads it, and say what to run next.

    python3 benchmarks/gpu/install_results.py FILES_AT [FILES_AT ...] [--force]

FILES_AT is a folder the device tool returned (the files a command wrote under $OUT):
  <card>/provenance.yaml + CSVs   (run_gpu.sh bench)    -> mfu_tables/measured/<card>/torch-<version>/
  e2e-<card>-<mode>.yaml           (run_gpu.sh eager/compiled) -> infersim/validate/measured/
  kernel-counts-*.json, *.log      -> benchmarks/gpu/results/<card>/ (the record of the run)
Each table directory is loaded first (a directory that does not load is not installed), and smoke files
are refused. Nothing is overwritten without --force.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from infersim.tables.format import PROVENANCE_FILE  # noqa: E402
from infersim.tables.table_files import read_table_dir  # noqa: E402


def torch_dir_name(version: str) -> str:
    """torch-2.11.0 for 2.11.0+cu130: the local build tag stays in the provenance."""
    return "torch-" + version.split("+")[0]


def install(source: Path, force: bool) -> list[str]:
    done: list[str] = []
    for prov in sorted(source.glob(f"*/{PROVENANCE_FILE}")):
        table_dir = read_table_dir(prov.parent)  # refuses a directory that does not load
        card = prov.parent.name
        version = table_dir.provenance.software.get("torch", "unknown")
        target = REPO / "mfu_tables" / "measured" / card / torch_dir_name(version)
        if target.exists() and not force:
            raise SystemExit(f"{target} exists: pass --force to replace it")
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(prov.parent, target, ignore=shutil.ignore_patterns("*.partial"))
        done.append(f"tables {prov.parent} -> {target.relative_to(REPO)} (complete: {table_dir.provenance.complete})")
    for e2e in sorted(source.glob("e2e-*.yaml")):
        if "smoke" in e2e.name:
            raise SystemExit(f"{e2e}: a smoke run, not a measurement: not installed")
        target = REPO / "infersim" / "validate" / "measured" / e2e.name
        if target.exists() and not force:
            raise SystemExit(f"{target} exists: pass --force to replace it")
        shutil.copyfile(e2e, target)
        done.append(f"validation {e2e} -> {target.relative_to(REPO)}")
    for record in sorted(list(source.glob("kernel-counts-*.json")) + list(source.glob("*.log"))):
        card = next((p.name for p in source.iterdir() if (p / PROVENANCE_FILE).is_file()), "")
        if not card and record.name.startswith("e2e-"):
            card = record.name.split("-")[1] if record.name.count("-") >= 2 else ""
        target = REPO / "benchmarks" / "gpu" / "results" / (card or "unknown") / record.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, target)
        done.append(f"record {record} -> {target.relative_to(REPO)}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    for source in args.sources:
        for line in install(source, args.force):
            print(line)
    print("\nnext: python -m infersim mfu compare aiconfigurator/<card>/trtllm-1.3.0rc20 measured/<card>/torch-<version>; "
          "python -m infersim validate (the measured files are read beside the public reference); "
          "git add mfu_tables/measured infersim/validate/measured benchmarks/gpu/results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
