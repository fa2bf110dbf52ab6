"""InferSim and NVIDIA aiconfigurator beside the public vLLM serving runs (the trainval file).

    pip install aiconfigurator            # its CLI; not a dependency of InferSim
    python benchmarks/vs_aiconfigurator_trainval.py [--aiconfigurator PATH] [--format json]

For each load stage of each run of infersim/validate/public/vllm_serving_trainval.yaml (vLLM 0.15.1
on H100 SXM under inference-perf's staged load), it prints the measured mean TTFT and mean ITL,
InferSim's (`infersim validate --source trainval-vllm`: the request-level simulator with the bundled
vLLM tables) and aiconfigurator's (`aiconfigurator cli estimate --estimate-mode agg`, vLLM backend
at its current data version), each with its error. aiconfigurator's agg mode prices a steady state
of one prompt beside a fixed decode batch; it is given the stage's measured mean concurrency
(Little's law: rate x measured mean E2E, rounded), the prompt (system prompt + question) and the
output length, and the run's TP (experts TP-sharded for an MoE, as vLLM shards them without expert
parallelism), fp8 GEMMs and experts for the FP8 checkpoint (Llama-4-Scout: aiconfigurator's
per-tensor fp8; the checkpoint's are per channel, its attention projections bf16); its TPOT stands
beside the measured ITL. The model configuration is the run's
`hf_config` stanza written as config.json; Mistral-Nemo's MistralForCausalLM, which aiconfigurator
does not list, is given as LlamaForCausalLM (vLLM runs Mistral's decoder as Llama's: the same
modules); a model aiconfigurator cannot build is listed with its error. The summary compares the
two on the stages both predict. The concurrency comes from the measurement, which InferSim is not given:
the comparison favours aiconfigurator there.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_aiconfigurator import SYSTEMS, comparison_parser, estimate, without_aiconfigurator  # noqa: E402  (the static-step benchmark beside this file)

from infersim.validate.trainval import GPU_CARDS, point_id, shipped_file  # noqa: E402
#: architectures aiconfigurator does not list, as the one they are built like
SAME_AS = {"MistralForCausalLM": "LlamaForCausalLM"}


def stages(experiment: dict[str, Any]) -> list[tuple[int, float, dict[str, float]]]:
    """(stage, rate, measured metrics) of each measured load stage of one run."""
    rates = {f"stage_{s['stage']}": (int(s["stage"]), float(s["rate_rps"])) for s in experiment["workload"]["stages"]}
    return [(*rates[key], metrics) for key, metrics in experiment["measured"].items() if key in rates]


def config_dir(experiment: dict[str, Any], tmp: Path) -> Path:
    """The run's hf_config stanza as an HF model directory (config.json)."""
    config = dict(experiment["hf_config"])
    if isinstance(config.get("architectures"), str):
        config["architectures"] = [config["architectures"]]
    config["architectures"] = [SAME_AS.get(a, a) for a in config.get("architectures", [])]
    directory = tmp / experiment["exp_id"]
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def aiconfigurator_agg(exe: str, experiment: dict[str, Any], concurrency: int, tmp: Path) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of aiconfigurator's agg mode at `concurrency` requests."""
    work = experiment["workload"]
    args = ["--backend", "vllm", "--model-path", str(config_dir(experiment, tmp)),
            "--system", SYSTEMS[GPU_CARDS[experiment["hardware"]["gpu"]]], "--estimate-mode", "agg",
            "--isl", str(int(work["system_prompt_len"]) + int(work["question_len"])),
            "--osl", str(int(work["output_len"])), "--batch-size", str(concurrency),
            "--tp-size", str(int(experiment["tp"]))]
    if experiment["hf_config"].get("num_local_experts") or experiment["hf_config"].get("num_experts"):
        args += ["--moe-tp-size", str(int(experiment["tp"])), "--moe-ep-size", "1"]
    if str(experiment.get("precision", "")).lower() == "fp8":  # Llama-4-Scout FP8-dynamic: fp8 weights
        args += ["--gemm-quant-mode", "fp8", "--moe-quant-mode", "fp8"]
    return estimate(exe, args, "TTFT", timeout=600), estimate(exe, args, "TPOT", timeout=600)


def infersim_points() -> dict[str, float]:
    """Point id (trainval-<exp>-<workload>-stage<N>/<metric>) -> InferSim's prediction."""
    done = subprocess.run([sys.executable, "-m", "infersim", "validate", "--source", "trainval-vllm",
                           "--format", "json"], capture_output=True, text=True, timeout=1200, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"validate --source trainval-vllm failed: {done.stderr.strip()[-200:]}")
    return {p["id"]: p["predicted"] for p in json.loads(done.stdout)["points"]}


def rows(exe: str) -> list[dict[str, Any]]:
    experiments = yaml.safe_load(shipped_file().read_text())["experiments"]
    ours = infersim_points()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for experiment in experiments:
            for stage, rate, measured in stages(experiment):
                point = point_id(experiment, stage)
                concurrency = max(1, round(rate * measured["e2e_mean_ms"] / 1e3))
                try:
                    ttft, tpot = aiconfigurator_agg(exe, experiment, concurrency, Path(tmp))
                    error = ""
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    ttft = tpot = None
                    error = str(exc)
                out.append({"point": point, "concurrency": concurrency,
                            "ttft_measured": measured["ttft_mean_ms"], "ttft_infersim": ours.get(f"{point}/ttft_mean"),
                            "ttft_aiconfigurator": ttft, "itl_measured": measured["itl_mean_ms"],
                            "itl_infersim": ours.get(f"{point}/itl_mean"), "tpot_aiconfigurator": tpot,
                            "error": error})
    return out


def _err(predicted: float | None, measured: float) -> str:
    return "-" if predicted is None else f"{100 * (predicted / measured - 1):+.1f}%"


def _median_abs(pairs: list[tuple[float | None, float]]) -> str:
    errors = [abs(p / m - 1) for p, m in pairs if p is not None]
    return f"{100 * statistics.median(errors):.1f}% (n={len(errors)})" if errors else "-"


def main(argv: list[str] | None = None) -> int:
    args = comparison_parser(__doc__.splitlines()[0]).parse_args(argv)
    if without_aiconfigurator(args.aiconfigurator):
        return 2
    table = rows(args.aiconfigurator)
    if args.format == "json":
        print(json.dumps(table, indent=2))
        return 0
    print(f"{'point':36s} {'conc':>4s} {'TTFT ms':>8s} {'ours':>7s} {'aic':>7s} {'ITL ms':>7s} {'ours':>7s} {'aic':>7s}")
    for r in table:
        print(f"{r['point']:36s} {r['concurrency']:4d} {r['ttft_measured']:8.1f} "
              f"{_err(r['ttft_infersim'], r['ttft_measured']):>7s} {_err(r['ttft_aiconfigurator'], r['ttft_measured']):>7s} "
              f"{r['itl_measured']:7.2f} {_err(r['itl_infersim'], r['itl_measured']):>7s} "
              f"{_err(r['tpot_aiconfigurator'], r['itl_measured']):>7s}" + (f"  ({r['error'][:100]})" if r["error"] else ""))
    both = [r for r in table if r["ttft_aiconfigurator"] is not None]
    print(f"median |error| over the {len(both)} stages both predict: mean TTFT InferSim "
          + _median_abs([(r["ttft_infersim"], r["ttft_measured"]) for r in both]) + ", aiconfigurator "
          + _median_abs([(r["ttft_aiconfigurator"], r["ttft_measured"]) for r in both]) + "; mean ITL InferSim "
          + _median_abs([(r["itl_infersim"], r["itl_measured"]) for r in both]) + ", aiconfigurator (TPOT) "
          + _median_abs([(r["tpot_aiconfigurator"], r["itl_measured"]) for r in both]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
