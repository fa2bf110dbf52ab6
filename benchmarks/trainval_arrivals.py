"""What the spacing of arrivals does to the public vLLM serving runs' TTFT (a what-if, not a setting).

    python benchmarks/trainval_arrivals.py [--shape 1000]

Each run of infersim/validate/public/vllm_serving_trainval.yaml is simulated as `validate --source
trainval-vllm` simulates it (inference-perf's `constant` timer: exponential gaps rescaled to the
stage, as its ConstantLoadTimer draws them) and again with nearly even gaps: gamma-distributed with
shape `--shape` (1000: a coefficient of variation of 3%), the same rate. Per stage it prints the
measured mean and p99 TTFT and the error of each simulation, then the median |error| of both over
the second stages of the two-stage runs (their server warm, no start-up requests in the stage).
docs/validation.md tells what this shows and why the timer stays as its source reads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infersim.run.config import config_from_mapping  # noqa: E402
from infersim.serve.api import simulate_serving  # noqa: E402
from infersim.validate.trainval import experiment_options, experiment_run, shipped_file  # noqa: E402


def stage_ttfts(experiment: dict, shape: float | None) -> list[tuple[float, float]]:
    """(mean, p99) TTFT in ms of each simulated stage; `shape`: gamma gaps of that shape instead of the timer's."""
    options = experiment_options(experiment)
    if shape is not None:
        options["workload"]["load"].update(timer="poisson", burstiness=shape)
    out = simulate_serving(config_from_mapping(experiment_run(experiment), "trainval"), options)
    return [(stage["mean_ttft_ms"], stage["p99_ttft_ms"]) for stage in out["stages"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=float, default=1000.0, help="gamma shape of the even gaps (default 1000)")
    args = parser.parse_args()
    runs = yaml.safe_load(shipped_file().read_text())["experiments"]
    print(f"{'run':>9} {'stage':>5}  {'mean TTFT ms':>12} {'timer':>7} {'even':>7}  {'p99 TTFT ms':>11} {'timer':>7} "
          f"{'even':>7}")
    warm: dict[str, list[float]] = {"mean timer": [], "mean even": [], "p99 timer": [], "p99 even": []}
    for experiment in runs:
        measured = experiment.get("measured")
        if not isinstance(measured, dict):
            continue
        stages = len(experiment["workload"]["stages"])
        for index, (timer, even) in enumerate(zip(stage_ttfts(experiment, None), stage_ttfts(experiment, args.shape))):
            m = measured[f"stage_{index}"]
            errors = [sim[k] / m[key] - 1 for key, k in (("ttft_mean_ms", 0), ("ttft_p99_ms", 1)) for sim in (timer, even)]
            print(f"{experiment['exp_id']:>9} {index:>5}  {m['ttft_mean_ms']:>12.1f} {errors[0]:>+7.0%} {errors[1]:>+7.0%}  "
                  f"{m['ttft_p99_ms']:>11.1f} {errors[2]:>+7.0%} {errors[3]:>+7.0%}")
            if stages == 2 and index == 1:
                for name, error in zip(warm, errors):
                    warm[name].append(abs(error))
    print("second stages of the two-stage runs, median |error|: "
          + ", ".join(f"{name} {statistics.median(v):.0%}" for name, v in warm.items()) + f" (n={len(warm['p99 even'])})")


if __name__ == "__main__":
    main()
