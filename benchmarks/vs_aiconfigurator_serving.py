"""InferSim and NVIDIA aiconfigurator beside the measured attention-DP serving points.

    pip install aiconfigurator            # its CLI; not a dependency of InferSim
    python benchmarks/vs_aiconfigurator_serving.py [--aiconfigurator PATH] [--format json]

For each TensorRT-LLM offline point of ../shared/reference/validation.yaml that runs attention
data parallelism with an MoE (the points docs/validation.md's "largest remaining errors" discusses), it
prints the measured output throughput per GPU, InferSim's prediction (`infersim validate --point`,
the request-level simulator with the bundled kernel tables) and aiconfigurator's
(`aiconfigurator cli estimate --estimate-mode agg`, TensorRT-LLM backend at its current data
version), each with its error. aiconfigurator's agg mode prices a steady state of one prompt per
rank beside a fixed decode batch; it is given the largest decode batch per rank InferSim's run of
the point reaches (the `batch` of each case below, read off the serving run's busiest step), fp8
per-tensor quantisation for Qwen3 (NVIDIA's checkpoints), fp8_block for DeepSeek (its own block
scales), NVFP4 where the point says so, and GPT-OSS's bf16 linears beside its MXFP4 experts
(aiconfigurator's own choice for that checkpoint). Both sides read the same measured kernel data, so where
they differ it is in how the run is composed, not in the kernels.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_aiconfigurator import HF_CONFIGS, comparison_parser, estimate, without_aiconfigurator  # noqa: E402  (the dense benchmark beside this file)


@dataclass(frozen=True)
class Case:
    point: str  # validation.yaml id
    model: str  # aiconfigurator --model-path: an HF id it knows, or a file under hf_configs
    system: str  # aiconfigurator system
    isl: int
    osl: int
    dp: int  # attention DP = MoE EP
    batch: int  # decode requests per rank (the largest InferSim's run of the point reaches)
    gemm: str  # aiconfigurator --gemm-quant-mode
    moe: str  # aiconfigurator --moe-quant-mode


QWEN = "qwen3-235B-A22B_config.json"
CASES: tuple[Case, ...] = (
    Case("trt10-qwen3235b-a22b-h100-tp8-1000-1000", QWEN, "h100_sxm", 1000, 1000, 8, 217, "fp8", "fp8"),
    Case("trt10-qwen3235b-a22b-h100-tp8-5000-500", QWEN, "h100_sxm", 5000, 500, 8, 78, "fp8", "fp8"),
    Case("trt10-qwen3235b-a22b-h200-tp8-1000-1000", QWEN, "h200_sxm", 1000, 1000, 8, 375, "fp8", "fp8"),
    Case("trt12-qwen3235ba22b-h200-dep4-1024-1024", QWEN, "h200_sxm", 1024, 1024, 4, 381, "fp8", "fp8"),
    Case("trt12-qwen3235ba22b-h200-dep4-8192-1024", QWEN, "h200_sxm", 8192, 1024, 4, 84, "fp8", "fp8"),
    Case("trt12-deepseekr10528-h200-dep8-1024-1024", "deepseek-ai/DeepSeek-V3", "h200_sxm", 1024, 1024, 8, 375,
         "fp8_block", "fp8_block"),
    Case("trt12-deepseekr10528-b200-dep4-1024-1024", "deepseek-ai/DeepSeek-V3", "b200_sxm", 1024, 1024, 4, 750,
         "nvfp4", "nvfp4"),
    Case("trt12-deepseekr10528-b200-dep4-8192-1024", "deepseek-ai/DeepSeek-V3", "b200_sxm", 8192, 1024, 4, 128,
         "nvfp4", "nvfp4"),
    Case("trt12-deepseekr10528-gb200-dep4-1024-1024", "deepseek-ai/DeepSeek-V3", "gb200", 1024, 1024, 4, 750,
         "nvfp4", "nvfp4"),
    Case("trt12-gptoss120b-h200-dep2-1024-1024", "openai/gpt-oss-120b", "h200_sxm", 1024, 1024, 2, 896,
         "bfloat16", "w4a16_mxfp4"),
)


def aiconfigurator_tgs(exe: str, case: Case, tmp: Path) -> float:
    """Output tokens/s per GPU from `aiconfigurator cli estimate --estimate-mode agg`."""
    model = case.model
    if model.endswith(".json"):
        model_dir = tmp / Path(model).stem
        model_dir.mkdir(exist_ok=True)
        shutil.copy(HF_CONFIGS / model, model_dir / "config.json")
        model = str(model_dir)
    return estimate(exe, ["--backend", "trtllm", "--model-path", model, "--system", case.system, "--estimate-mode", "agg",
                          "--isl", str(case.isl), "--osl", str(case.osl), "--batch-size", str(case.batch),
                          "--tp-size", "1", "--attention-dp-size", str(case.dp), "--moe-ep-size", str(case.dp),
                          "--moe-tp-size", "1", "--gemm-quant-mode", case.gemm, "--moe-quant-mode", case.moe,
                          "--kvcache-quant-mode", "fp8"], "tokens/s/gpu", timeout=600)


def infersim_point(point: str, gpus: int) -> tuple[float, float, float]:
    """(measured, predicted, unit scale to tokens/s/GPU) of one validate point run on `gpus` GPUs."""
    done = subprocess.run([sys.executable, "-m", "infersim", "validate", "--point", point, "--format", "json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"validate --point {point} failed: {done.stderr.strip()[-200:]}")
    row = json.loads(done.stdout)["points"][0]
    per_gpu = 1.0 if "GPU" in row["unit"] else 1.0 / gpus  # the v1.0 page gives totals over all GPUs
    return row["measured"], row["predicted"], per_gpu


def main(argv: list[str] | None = None) -> int:
    args = comparison_parser(__doc__.splitlines()[0]).parse_args(argv)
    if without_aiconfigurator(args.aiconfigurator):
        return 2
    if not HF_CONFIGS.is_dir():
        print(f"{HF_CONFIGS} not found (../shared/reference); nothing to compare", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            measured, ours, scale = infersim_point(case.point, case.dp)  # attention DP x TP1: one rank per GPU
            try:
                theirs: float | None = aiconfigurator_tgs(args.aiconfigurator, case, Path(tmp))
                error = ""
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                theirs, error = None, str(exc)
            measured_gpu = measured * scale
            rows.append({**asdict(case), "measured_tgs": measured_gpu, "infersim_tgs": ours * scale,
                         "infersim_error": ours / measured - 1, "aiconfigurator_tgs": theirs,
                         "aiconfigurator_error": None if theirs is None else theirs / measured_gpu - 1,
                         "error": error})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'point':44s} {'measured':>9s} {'InferSim':>9s} {'err':>7s} {'aiconf.':>9s} {'err':>7s} {'batch':>6s}")
    for r in rows:
        aic = ("-", "") if r["aiconfigurator_tgs"] is None else \
            (f"{r['aiconfigurator_tgs']:9,.0f}", f"{100 * r['aiconfigurator_error']:+6.1f}%")
        print(f"{r['point']:44s} {r['measured_tgs']:9,.0f} {r['infersim_tgs']:9,.0f} "
              f"{100 * r['infersim_error']:+6.1f}% {aic[0]:>9s} {aic[1]:>7s} {r['batch']:6d}  {r['error'][:80]}")
    compared = [r for r in rows if r["aiconfigurator_error"] is not None]
    if compared:
        ours = sum(abs(r["infersim_error"]) for r in compared) / len(compared)
        theirs = sum(abs(r["aiconfigurator_error"]) for r in compared) / len(compared)
        closer = sum(abs(r["infersim_error"]) < abs(r["aiconfigurator_error"]) for r in compared)
        print(f"mean |error| over {len(compared)}: InferSim {100 * ours:.1f}%, aiconfigurator {100 * theirs:.1f}%; "
              f"InferSim closer on {closer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
