"""Configs simulated per second, in process (target: one config well under 10 ms).

    python benchmarks/sim_rate.py [--seconds 2]

Cards are loaded once; each iteration runs simulate() (prefill and decode, memory, warnings).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.run.config import load_run_config  # noqa: E402
from infersim.run.simulate import simulate  # noqa: E402

CASES = ("configs/qwen3-30b.yaml", "benchmarks/published/deepseek-v3-h800-prefill.yaml",
         "benchmarks/published/qwen3-8b-h20-decode.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per config")
    args = parser.parse_args()
    for case in CASES:
        config = load_run_config(str(REPO / case))
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            simulate(config)
            runs += 1
        per = (time.perf_counter() - start) / runs
        print(f"{case}: {1 / per:,.0f} configs/s ({per * 1e3:.2f} ms per config, prefill + decode)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
