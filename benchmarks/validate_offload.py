"""Predicted vs measured total throughput of the seven single-RTX-A6000 ZeRO-Inference runs.

    python benchmarks/validate_offload.py [--format json] [--reference PATH]

Measured values come from ../shared/reference/zero_inference.yaml (read by path; not copied into
the project). Each model's run config is benchmarks/offload/<model>.yaml; the script sets only what
the reference gives per run: batch, prompt and generation length, weight format (fp16 or 4-bit)
and whether the KV cache is offloaded (weights always stream from CPU memory). Nothing is fitted
per case. Targets: median absolute error <= 25%, every case within a factor of 1.5.

Two sensitivity lines follow the table (not part of the targets): every case with one-layer-ahead
prefetch instead of ZeRO-Inference's back-to-back fetches, and BLOOM-176B with its weights read
from NVMe instead of CPU memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.base.errors import InferSimError  # noqa: E402
from infersim.generate.simulate import simulate_generation  # noqa: E402
from infersim.generate.spec import load_generate_config  # noqa: E402

DEFAULT_REFERENCE = REPO.parent / "shared" / "reference" / "zero_inference.yaml"
CONFIG_DIR = Path(__file__).resolve().parent / "offload"
WEIGHT_FORMATS = {"4-bit": "int4", "fp16": "fp16"}
FACTOR = 1.5
MEDIAN_TARGET = 0.25


def case_id(run: dict[str, Any]) -> str:
    kv = "+kv-offload" if run["kv_offload"] else ""
    return f"{run['model']} {run['weights']}{kv} bs{run['batch']}"


def predict(run: dict[str, Any], prompt_len: int, gen_len: int, extra: list[str] | None = None) -> dict[str, Any]:
    """Simulate one reference run; `extra` overrides are for the sensitivity lines only."""
    weights = WEIGHT_FORMATS.get(str(run["weights"]))
    if weights is None:
        raise InferSimError(f"{case_id(run)}: unknown weight format '{run['weights']}' (known: {', '.join(WEIGHT_FORMATS)})")
    config_path = CONFIG_DIR / f"{str(run['model']).lower()}.yaml"
    flags = {"batch": int(run["batch"]), "prompt_len": prompt_len, "gen_len": gen_len,
             "offload": "weights,kv" if run["kv_offload"] else "weights"}
    config, gen = load_generate_config(config_path, [f"deployment.precision.weights={weights}", *(extra or [])],
                                       flags=flags)
    result = simulate_generation(config, gen)
    measured = float(run["total_throughput_tok_s"])
    predicted = result.total_throughput
    return {
        "case": case_id(run),
        "measured_tok_s": measured,
        "predicted_tok_s": predicted,
        "error": predicted / measured - 1.0,
        "factor": max(predicted / measured, measured / predicted),
        "prefill_s": result.prefill_latency_s,
        "decode_s": result.decode_latency_s,
        "decode_step_bound": result.decode_steps[-1].bound if result.decode_steps else "-",
        "peak_gpu_gb": result.memory.peak_gpu_bytes / 1e9,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in rows]
    return {"median_abs_error": statistics.median(errors), "max_factor": max(r["factor"] for r in rows),
            "all_within_factor": all(r["factor"] <= FACTOR for r in rows)}


def validate(reference: Path) -> dict[str, Any]:
    data = yaml.safe_load(reference.read_text())
    prompt_len, gen_len = int(data["prompt_len"]), int(data["gen_len"])
    runs = data["runs"]
    rows = [predict(run, prompt_len, gen_len) for run in runs]
    prefetch_rows = [predict(run, prompt_len, gen_len, ["generate.prefetch=true"]) for run in runs]
    bloom = [run for run in runs if str(run["model"]).lower().startswith("bloom")]
    nvme_rows = [predict(run, prompt_len, gen_len, ["generate.offload_device=nvme"]) for run in bloom]
    return {
        "reference": str(reference),
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "cases": rows,
        **summary(rows),
        "targets": {"median_abs_error": MEDIAN_TARGET, "factor": FACTOR},
        "sensitivity": {
            "prefetch_one_layer_ahead": {"cases": prefetch_rows, **summary(prefetch_rows)},
            "bloom_weights_on_nvme": nvme_rows,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--reference", default=str(DEFAULT_REFERENCE), help="zero_inference.yaml path")
    args = parser.parse_args(argv)
    reference = Path(args.reference)
    if not reference.is_file():
        print(f"validate_offload: {reference} not found (it lives in ../shared/reference; pass --reference PATH)",
              file=sys.stderr)
        return 2
    try:
        report = validate(reference)
    except InferSimError as exc:
        print(f"validate_offload: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    from tabulate import tabulate

    rows = [[r["case"], f"{r['measured_tok_s']:.2f}", f"{r['predicted_tok_s']:.2f}", f"{100 * r['error']:+.1f}%",
             f"{r['prefill_s']:.1f}", f"{r['decode_s']:.1f}", r["decode_step_bound"], f"{r['peak_gpu_gb']:.1f}"]
            for r in report["cases"]]
    print(f"ZeRO-Inference on one RTX A6000, prompt {report['prompt_len']}, generate {report['gen_len']} "
          f"(measured: {report['reference']})")
    print(tabulate(rows, headers=["case", "measured tok/s", "predicted tok/s", "error", "prefill s", "decode s",
                                  "decode bound", "peak GPU GB"], disable_numparse=True))
    ok_median = report["median_abs_error"] <= MEDIAN_TARGET
    print(f"median absolute error {100 * report['median_abs_error']:.1f}% (target <= {100 * MEDIAN_TARGET:.0f}%: "
          f"{'met' if ok_median else 'NOT met'}); largest factor {report['max_factor']:.2f} "
          f"(every case within {FACTOR}x: {'yes' if report['all_within_factor'] else 'NO'})")
    sens = report["sensitivity"]
    pre = sens["prefetch_one_layer_ahead"]
    print(f"sensitivity, prefetch one layer ahead: median {100 * pre['median_abs_error']:.1f}%, largest factor "
          f"{pre['max_factor']:.2f} (" + ", ".join(f"{r['case']} {100 * r['error']:+.0f}%" for r in pre["cases"]) + ")")
    for r in sens["bloom_weights_on_nvme"]:
        print(f"sensitivity, {r['case']} with weights on NVMe: predicted {r['predicted_tok_s']:.2f} tok/s, "
              f"error {100 * r['error']:+.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
