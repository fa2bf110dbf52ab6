"""InferSim and NVIDIA aiconfigurator side by side on the same deployments.

    pip install aiconfigurator            # its CLI; not a dependency of InferSim
    python benchmarks/vs_aiconfigurator.py [--backend trtllm|vllm] [--aiconfigurator PATH] [--cases NAME,...]
                                           [--format json]

For each case (dense and MoE models; TP, EP and attention DP; prefill and decode; H100, H200, B200)
it runs `aiconfigurator cli estimate` in its static modes (static_ctx: TTFT of one prefill step;
static_gen: TPOT averaged over the generation) with the TensorRT-LLM backend at its current version,
and InferSim (`config_from_mapping` + `simulate`) with the TensorRT-LLM engine card and the bundled
kernel tables chosen for the device and engine (`infersim.tables.select.bundled_tables_for(...,
"trtllm")`), i.e. the same measured kernels. `--backend vllm` runs the vLLM cases instead:
aiconfigurator's vLLM backend against InferSim's vLLM engine card and vLLM tables, at the steps of
the public vLLM serving runs (docs/validation.md: a 466-token prompt, decode batches of 12 and 48 at
about 700 tokens). Where the two differ, the difference is in how the step is composed (elementwise
kernels, collectives, scheduler overhead, MoE routing), not in the kernel data: the `ours, kernels`
column leaves out the engine card's per-step scheduler overhead, which aiconfigurator's static modes
do not charge.

Deployment mapping: aiconfigurator's batch size is per attention-DP rank; InferSim's workload is
per GPU, and an attention-TP group shares its tokens, so prefill_tokens_per_gpu = batch x ISL /
attention TP and decode_batch_per_gpu = batch / attention TP.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.run.config import config_from_mapping  # noqa: E402
from infersim.tables.select import bundled_tables_for  # noqa: E402
from infersim.run.simulate import simulate  # noqa: E402

HF_CONFIGS = REPO.parent / "shared" / "reference" / "hf_configs"
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200"}
HF_FILES = {
    "llama-2-7b": "llama-2-7b_config.json",
    "llama-2-70b": "llama-2-70b_config.json",
    "llama-3.1-8b": "llama-3.1-8b_config.json",
    "llama-3.1-70b": "llama-3.1-70b_config.json",
    "qwen3-30b-a3b": "qwen3-30B-A3B_config.json",
    "qwen3-235b-a22b": "qwen3-235B-A22B_config.json",
    "mixtral-8x7b": "mixtral-8x7b_config.json",
    "deepseek-v3": "deepseek_v3_config.json",
}


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    hardware: str
    stage: str  # prefill | decode
    tp: int  # attention TP
    dp: int = 1  # attention DP
    ep: int = 1  # MoE EP (MoE TP = tp * dp / ep)
    batch: int = 1  # sequences per attention-DP rank
    isl: int = 4096
    osl: int = 1024
    fp8: bool = False  # fp8 GEMM and weights (the checkpoint's own quantization on aiconfigurator's side)
    backend: str = "trtllm"  # aiconfigurator's backend; InferSim's tables (and, for vllm, engine card) follow it

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


CASES: tuple[Case, ...] = (
    Case("llama2-7b prefill tp1 h100", "llama-2-7b", "h100-sxm", "prefill", 1),
    Case("llama2-7b prefill tp2 h100", "llama-2-7b", "h100-sxm", "prefill", 2),
    Case("llama2-7b prefill tp1 h200", "llama-2-7b", "h200", "prefill", 1),
    Case("llama2-70b prefill tp4 h100", "llama-2-70b", "h100-sxm", "prefill", 4),
    Case("llama2-70b prefill tp8 h100", "llama-2-70b", "h100-sxm", "prefill", 8),
    Case("llama2-70b prefill tp8 h200", "llama-2-70b", "h200", "prefill", 8),
    Case("llama3.1-8b decode tp1 b64 h100", "llama-3.1-8b", "h100-sxm", "decode", 1, batch=64, isl=2048, osl=512),
    Case("llama3.1-70b decode tp8 b64 h200", "llama-3.1-70b", "h200", "decode", 8, batch=64, isl=2048, osl=512),
    Case("llama3.1-70b prefill tp4 b200", "llama-3.1-70b", "b200", "prefill", 4),
    Case("llama3.1-70b decode tp4 b128 b200", "llama-3.1-70b", "b200", "decode", 4, batch=128, isl=2048, osl=512),
    Case("qwen3-30b prefill tp1 h100", "qwen3-30b-a3b", "h100-sxm", "prefill", 1),
    Case("qwen3-30b decode dp4 ep4 b64 h100", "qwen3-30b-a3b", "h100-sxm", "decode", 1, dp=4, ep=4, batch=64),
    Case("mixtral prefill tp2 ep2 h100", "mixtral-8x7b", "h100-sxm", "prefill", 2, ep=2),
    Case("mixtral decode tp4 ep4 b64 h200", "mixtral-8x7b", "h200", "decode", 4, ep=4, batch=64, isl=2048, osl=512),
    Case("qwen3-235b prefill tp8 ep8 b200", "qwen3-235b-a22b", "b200", "prefill", 8, ep=8),
    Case("qwen3-235b decode dp8 ep8 b64 b200", "qwen3-235b-a22b", "b200", "decode", 1, dp=8, ep=8, batch=64),
    Case("deepseek-v3 prefill dp8 ep8 h200", "deepseek-v3", "h200", "prefill", 1, dp=8, ep=8, fp8=True),
    Case("deepseek-v3 decode dp8 ep8 b32 h200", "deepseek-v3", "h200", "decode", 1, dp=8, ep=8, batch=32, fp8=True),
)
#: the models of the public vLLM serving runs that have HF configs in ../shared, at their steps
VLLM_CASES: tuple[Case, ...] = (
    Case("llama3.1-70b prefill tp4 h100 vllm", "llama-3.1-70b", "h100-sxm", "prefill", 4, isl=466, backend="vllm"),
    Case("llama3.1-70b decode tp4 b12 h100 vllm", "llama-3.1-70b", "h100-sxm", "decode", 4, batch=12, isl=566,
         osl=248, backend="vllm"),
    Case("llama3.1-70b decode tp4 b48 h100 vllm", "llama-3.1-70b", "h100-sxm", "decode", 4, batch=48, isl=566,
         osl=248, backend="vllm"),
    Case("llama2-7b prefill tp1 h100 vllm", "llama-2-7b", "h100-sxm", "prefill", 1, isl=466, backend="vllm"),
    Case("llama2-7b decode tp1 b16 h100 vllm", "llama-2-7b", "h100-sxm", "decode", 1, batch=16, isl=566, osl=248,
         backend="vllm"),
    Case("qwen3-30b decode tp1 b32 h100 vllm", "qwen3-30b-a3b", "h100-sxm", "decode", 1, batch=32, isl=566, osl=248,
         backend="vllm"),
)
#: InferSim's engine card for each aiconfigurator backend: the same engine's fusions and overheads
ENGINES = {"trtllm": "trtllm", "vllm": "vllm@0.15"}


def estimate(exe: str, args: list[str], label: str, timeout: float = 300) -> float:
    """The number after `label:` in the output of `aiconfigurator cli estimate ARGS` (ARGS name the
    backend); RuntimeError with its last line when it fails or prints no such number."""
    cmd = [exe, "cli", "estimate", "--no-color", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    found = re.search(rf"^\s*{re.escape(label)}:\s+([\d.,]+)", done.stdout, re.MULTILINE)
    if done.returncode != 0 or not found:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"aiconfigurator failed: {last[0].strip()}")
    return float(found.group(1).replace(",", ""))


def aiconfigurator_ms(exe: str, case: Case, model_dir: Path) -> float:
    """TTFT (prefill) or TPOT (decode) in ms from `aiconfigurator cli estimate`."""
    mode = "static_ctx" if case.stage == "prefill" else "static_gen"
    moe_tp = case.gpus // case.ep
    return estimate(exe, ["--backend", case.backend, "--model-path", str(model_dir), "--system", SYSTEMS[case.hardware],
                          "--estimate-mode", mode, "--isl", str(case.isl),
                          "--osl", str(1 if case.stage == "prefill" else case.osl), "--batch-size", str(case.batch),
                          "--tp-size", str(case.tp), "--attention-dp-size", str(case.dp), "--moe-tp-size", str(moe_tp),
                          "--moe-ep-size", str(case.ep)], "TTFT" if case.stage == "prefill" else "TPOT")


def infersim_ms(case: Case) -> tuple[float, float, str]:
    """(step ms, step ms without the card's scheduler overhead, tables used)."""
    choice = bundled_tables_for(case.hardware, case.backend)
    raw = {
        "model": case.model, "hardware": case.hardware, "engine": ENGINES[case.backend],
        "mfu_tables": str(choice.path) if choice else None,
        "deployment": {"num_gpus": case.gpus, "attention": {"tp": case.tp, "dp": case.dp},
                       "ffn": {"tp": case.gpus // case.ep, "ep": case.ep, "dp": 1},
                       **({"precision": {"gemm": "fp8", "weights": "fp8"}} if case.fp8 else {})},
        "workload": {"isl": case.isl, "osl": case.osl if case.stage == "decode" else 2,
                     "prefill_tokens_per_gpu": max(1, -(-case.batch * case.isl // case.tp)),  # the whole prompt in one step
                     "decode_batch_per_gpu": max(1, case.batch // case.tp)},
    }
    result = simulate(config_from_mapping(raw, f"vs_aiconfigurator case {case.name}"))
    stage = result.prefill if case.stage == "prefill" else result.decode
    overhead = sum(op.time_s for op in stage.operations if op.module == "overhead")
    tables = f"{choice.path.parent.name}/{choice.path.name}" if choice else "roofline"
    return stage.step_time_s * 1e3, (stage.step_time_s - overhead) * 1e3, tables


def comparison_parser(description: str) -> argparse.ArgumentParser:
    """The options every comparison with aiconfigurator takes: its executable and the output format."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--aiconfigurator", default=shutil.which("aiconfigurator"),
                        help="the aiconfigurator executable (default: on PATH)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    return parser


def without_aiconfigurator(exe: str | None) -> bool:
    """True, having said so, when there is no aiconfigurator to compare with."""
    if exe:
        return False
    print("aiconfigurator is not installed (pip install aiconfigurator); nothing to compare", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = comparison_parser(__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(ENGINES), default="trtllm",
                        help="aiconfigurator's backend and InferSim's tables for it (default: trtllm)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all of the backend)")
    args = parser.parse_args(argv)
    if without_aiconfigurator(args.aiconfigurator):
        return 2
    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    cases = [c for c in (VLLM_CASES if args.backend == "vllm" else CASES) if not wanted or c.name in wanted]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            model_dir = Path(tmp) / case.model
            model_dir.mkdir(exist_ok=True)
            shutil.copy(HF_CONFIGS / HF_FILES[case.model], model_dir / "config.json")
            try:
                theirs: float | None = aiconfigurator_ms(args.aiconfigurator, case, model_dir)
                error = ""
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                theirs, error = None, str(exc)
            ours, kernels, tables = infersim_ms(case)
            rows.append({**asdict(case), "metric": "TTFT" if case.stage == "prefill" else "TPOT",
                         "aiconfigurator_ms": theirs, "infersim_ms": ours, "infersim_kernels_ms": kernels,
                         "diff": None if theirs is None else ours / theirs - 1,
                         "diff_kernels": None if theirs is None else kernels / theirs - 1,
                         "tables": tables, "error": error})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':36s} {'metric':6s} {'aic ms':>9s} {'ours ms':>9s} {'diff':>7s} {'kernels':>9s} {'diff':>7s}  tables")
    for r in rows:
        if r["aiconfigurator_ms"] is None:
            print(f"{r['name']:36s} {r['metric']:6s} {'-':>9s} {r['infersim_ms']:9.2f} {'':7s} "
                  f"{r['infersim_kernels_ms']:9.2f} {'':7s}  {r['tables']}  ({r['error'][:120]})")
            continue
        print(f"{r['name']:36s} {r['metric']:6s} {r['aiconfigurator_ms']:9.2f} {r['infersim_ms']:9.2f} "
              f"{100 * r['diff']:+6.1f}% {r['infersim_kernels_ms']:9.2f} {100 * r['diff_kernels']:+6.1f}%  {r['tables']}")
    print("(kernels: InferSim without the engine card's per-step scheduler overhead, which aiconfigurator's "
          "static modes do not charge)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
