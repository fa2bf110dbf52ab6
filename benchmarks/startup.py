"""The main command as a whole process, against a bare interpreter importing InferSim's dependencies.

    python benchmarks/startup.py [--runs 15] [--config qwen3-30b.yaml]

Runs `python -c "import yaml, tabulate"` (the baseline: an interpreter with PyYAML and tabulate
loaded), `python -c pass` and `python -m infersim --config CONFIG` (this checkout's package) in turn,
after one warm-up run that fills the on-disk cache and __pycache__ as any earlier run on the
machine would have, and prints the median of each: CPU seconds of the process (user + system, what
another process's load on a shared machine does not change) and wall seconds. The target: the main
command's CPU time within 2x the baseline's, reached by importing only what a run uses (no patching
of the interpreter or the standard library); the exit status is 1 above it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0

# The checkout's package (not another one installed), timed with its bytecode in place as an
# installed package has it: with PYTHONDONTWRITEBYTECODE set, no run writes __pycache__ and every
# run compiles every module again (~45 ms more).
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


def timed(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of `cmd` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--config", default="qwen3-30b.yaml")
    args = parser.parse_args(argv)
    commands = {
        'python -c "import yaml, tabulate"': [sys.executable, "-c", "import yaml, tabulate"],
        "python -c pass": [sys.executable, "-c", "pass"],
        f"python -m infersim --config {args.config}": [sys.executable, "-m", "infersim", "--config", args.config],
    }
    timed(commands[f"python -m infersim --config {args.config}"])  # warm-up: on-disk caches, OS file cache
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            samples[name].append(timed(cmd))
    cpu = {name: statistics.median(c for c, _ in runs) for name, runs in samples.items()}
    wall = {name: statistics.median(w for _, w in runs) for name, runs in samples.items()}
    width = max(map(len, commands))
    print(f"{'median of ' + str(args.runs):<{width}}  {'CPU ms':>8}  {'wall ms':>8}")
    for name in commands:
        print(f"{name:<{width}}  {cpu[name] * 1e3:8.1f}  {wall[name] * 1e3:8.1f}")
    baseline, bare, run = commands
    ratio = cpu[run] / cpu[baseline]
    print(f"\nmain command / baseline: {ratio:.2f} CPU, {wall[run] / wall[baseline]:.2f} wall "
          f"(target <= {TARGET_RATIO}); against a bare interpreter: {cpu[run] / cpu[bare]:.2f} CPU, "
          f"InferSim's own share {(cpu[run] - cpu[bare]) * 1e3:.1f} ms CPU")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
