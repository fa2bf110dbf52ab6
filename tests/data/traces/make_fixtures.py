"""Rebuild the synthesised GPU traces of this directory from the real CPU recordings beside them.

    python tests/data/traces/make_fixtures.py            # writes *-synthesised-*.json.gz here

The CPU recordings (`*-eager-cpu-*.json.gz`, with their `*.run.yaml` and `*.config.json`) were made
with `/work/venv-torch/bin/python benchmarks/gpu/record_traces.py --out tests/data/traces` on a CPU
(torch 2.13.0+cpu, transformers 5.17.0: see each file's `torch_version` / `transformers_version`).
The GPU side of every `*-synthesised-*` file is made by `tests/tracegen/synthesis.py` (its docstring
gives the cost model and what is renamed); see README.md. Deterministic: the same recordings give
the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parents[1]))  # tests/: the synthetic-trace generator

from tracegen.synthesis import write_synthesised  # noqa: E402

#: (CPU recording, synthesis mode, keep python frames, output)
FIXTURES = [
    ("llama-2-7b-2l-eager-cpu-p1x128-d2", "eager", True, "llama-2-7b-2l-eager-h100-synthesised-p1x128-d2"),
    ("llama-2-7b-2l-eager-cpu-p1x128-d2", "eager", False, "llama-2-7b-2l-eager-nostack-h100-synthesised-p1x128-d2"),
    ("llama-2-7b-2l-eager-cpu-p1x128-d2", "compiled", True, "llama-2-7b-2l-compiled-h100-synthesised-p1x128-d2"),
    ("llama-2-7b-2l-eager-cpu-p1x128-d2", "graphs", True, "llama-2-7b-2l-graphs-h100-synthesised-p1x128-d2"),
    ("llama-2-7b-2l-eager-cpu-p1x64-d4", "eager", True, "llama-2-7b-2l-eager-h100-synthesised-p1x64-d4"),
    ("mixtral-8x7b-2l-eager-cpu-p1x128-d2", "eager", True, "mixtral-8x7b-2l-eager-h100-synthesised-p1x128-d2"),
    ("mixtral-8x7b-2l-eager-cpu-p1x128-d2", "compiled", True, "mixtral-8x7b-2l-compiled-h100-synthesised-p1x128-d2"),
    ("mixtral-8x7b-2l-eager-cpu-p1x128-d2", "graphs", True, "mixtral-8x7b-2l-graphs-h100-synthesised-p1x128-d2"),
    ("mixtral-8x7b-2l-eager-cpu-p1x64-d4", "eager", True, "mixtral-8x7b-2l-eager-h100-synthesised-p1x64-d4"),
]


def main() -> int:
    for source, mode, frames, out in FIXTURES:
        path = write_synthesised(HERE / f"{source}.json.gz", HERE / f"{out}.json.gz", mode, frames)
        print(f"{path.name}: {path.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
