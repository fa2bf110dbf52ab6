"""The public vLLM serving runs of public/vllm_serving_trainval.yaml as `validate` points.

Each experiment of that file ran vLLM 0.15.1 online under inference-perf's staged constant-rate
load and measured, per load stage, client-side mean/p90/p99 TTFT and E2E and a mean ITL. Here each
experiment x stage becomes one reference point whose sub-metrics are those numbers (id
"trainval-<exp>-<workload>-stage<N>/<metric>"), and one serving mapping entry: the model card the
experiment's HF id names, the hardware card of its GPU, the vllm@0.15 engine card, TP over its
GPUs, and the serve options infersim.serve.trainval makes of its `workload:` and `vllm:` stanzas
(staged rates, shared system prompts, max_num_seqs, max_num_batched_tokens, the measured KV pool,
the CPU offload tier). All stages of an experiment run in one serving simulation (the evaluator
keeps it), each point reads its stage.

How the points stay affordable: every stage is cut to `STAGE_WINDOW_S` seconds (infersim.serve.trainval) at its rate (the
measured stages ran 600-1200 s); a stage's latencies settle within that when the server keeps up.
How multi-turn sessions are expressed is `SESSION_CONTEXT` below. An experiment whose model or GPU
has no card is listed as not expressed, with the reason; none is guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infersim.base.errors import MISSING, ConfigError, InferSimError
from infersim.cards.schema import load_yaml
from infersim.serve.trainval import BLOCK_TOKENS, STAGE_WINDOW_S
from infersim.validate.evaluate import NotExpressed, ReferencePoint
from infersim.validate.mapping import Conversion, PointMapping
from infersim.validate.measured import MeasuredSet

SOURCE = "TRAINVAL_VLLM"
#: the shipped copy of ../shared/reference/vllm_serving_trainval.yaml
FILE_NAME = "vllm_serving_trainval.yaml"
#: the engine card of the runs: vLLM 0.15.1 (the file's header: the design doc and simulator-limitations)
ENGINE = "vllm@0.15"
#: multi-turn chat as fixed-length rounds (infersim.serve.trainval.FIXED_ROUNDS_NOTE): inference-sim,
#: whose project ran these experiments, expands their profiles so; upstream inference-perf's
#: accumulated context would grow a user's prompt by question + answer every round (tens of
#: thousands of tokens over a 600 s stage), which the measured stages, flat from stage to stage,
#: do not show
SESSION_CONTEXT = False
#: GPU names of the file's `hardware.gpu` -> hardware card
GPU_CARDS = {"NVIDIA H100 80GB HBM3 (SXM)": "h100-sxm"}
#: measured key -> (sub-metric id, key of a stage of the serving result)
METRICS = {"ttft_mean_ms": ("ttft_mean", "mean_ttft_ms"), "ttft_p90_ms": ("ttft_p90", "p90_ttft_ms"),
           "ttft_p99_ms": ("ttft_p99", "p99_ttft_ms"), "itl_mean_ms": ("itl_mean", "itl_of_means_ms"),
           "e2e_mean_ms": ("e2e_mean", "mean_e2el_ms"), "e2e_p90_ms": ("e2e_p90", "p90_e2el_ms"),
           "e2e_p99_ms": ("e2e_p99", "p99_e2el_ms")}


def shipped_file() -> Path:
    from infersim.validate import public_file

    return public_file(FILE_NAME)


def _hardware(experiment: dict[str, Any]) -> tuple[str | None, int, str]:
    """(hardware card or None, GPU count, the GPU's name as the file gives it)."""
    hardware = experiment.get("hardware") or {}
    gpu = str(hardware.get("gpu", "")) if isinstance(hardware, dict) else ""
    count = hardware.get("count") if isinstance(hardware, dict) else None
    return GPU_CARDS.get(gpu), int(count or experiment.get("tp") or 1), gpu


def experiment_run(experiment: dict[str, Any]) -> dict[str, Any]:
    """The inline run config of one experiment: its model (by HF id), GPU, vLLM 0.15 and TP."""
    card, gpus, gpu = _hardware(experiment)
    if card is None:
        raise InferSimError(f"no hardware card for GPU {gpu or MISSING!r}")
    tp = int(experiment.get("tp") or 1)
    dp = int(experiment.get("dp") or 1)
    if tp * dp != gpus:
        raise InferSimError(f"tp {tp} x dp {dp} is not its {gpus} GPUs")
    return {"model": experiment["model"], "hardware": card, "engine": ENGINE,
            "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}},
            # a run config needs lengths; the serving options' workload gives every request's own
            "workload": {"isl": 1024, "osl": 256}}


def experiment_options(experiment: dict[str, Any], max_stage_s: float | None = STAGE_WINDOW_S) -> dict[str, Any]:
    """Serve options of one experiment (infersim.serve.trainval), its stages cut to `max_stage_s`."""
    from infersim.serve.trainval import trainval_options

    options = trainval_options(experiment, max_stage_s, session_context=SESSION_CONTEXT)
    options["seed"] = 0
    dp = int(experiment.get("dp") or 1)
    if dp > 1:  # data-parallel copies of the TP deployment behind one endpoint
        options["replicas"] = dp
    return options


def _why(experiment: dict[str, Any], run: dict[str, Any], options: dict[str, Any], stage: int) -> list[str]:
    vllm = experiment["vllm"]
    workload = experiment["workload"]
    rates = [f"{s['rate_rps']:g}/s for {s['duration_s']:g} s" for s in workload["stages"]]
    return [f"{experiment['model']} on {run['deployment']['num_gpus']} x {run['hardware']}, TP "
            f"{run['deployment']['attention']['tp']}, engine {ENGINE} (the runs' vLLM 0.15.1)",
            f"server: max_num_seqs {vllm['max_num_seqs']}, max_num_batched_tokens {vllm['max_num_batched_tokens']}, "
            f"KV pool {vllm['gpu_kv_cache_blocks']} blocks of 16 tokens (measured), CPU offload "
            f"{vllm.get('cpu_kv_offload_blocks') or 0} blocks",
            f"workload {workload['name']}: {workload['num_unique_system_prompts']} system prompts of "
            f"{workload['system_prompt_len']} tokens x {workload['num_users_per_system_prompt']} users, questions of "
            f"{workload['question_len']}, outputs of {workload['output_len']} tokens; stages " + ", ".join(rates),
            f"stage {stage} of the run; " + "; ".join(options["workload"]["notes"])]


def is_serving_runs_file(path: Path) -> bool:
    """Whether `path` holds serving runs in this format (a mapping with an `experiments` list and no
    `data_points` list), rather than points in the format of validation.yaml."""
    data = load_yaml(Path(path), "reference file")
    return isinstance(data, dict) and isinstance(data.get("experiments"), list) and "data_points" not in data


def load_trainval(path: Path | None = None, max_stage_s: float | None = STAGE_WINDOW_S) -> MeasuredSet:
    """Reference points and serving mappings of every measured experiment x stage of the file."""
    path = path or shipped_file()
    source = str(path)
    data = load_yaml(Path(path), "trainval serving file")
    experiments = data.get("experiments") if isinstance(data, dict) else None
    if not isinstance(experiments, list):
        raise ConfigError(source, "experiments", MISSING, "expected a list of experiments")
    out = MeasuredSet(files=[source])
    for index, experiment in enumerate(experiments):
        if not isinstance(experiment, dict):
            raise ConfigError(source, f"experiments[{index}]", experiment, "expected a mapping (one experiment)")
        measured = experiment.get("measured")
        if not isinstance(measured, dict):
            continue  # listed without measurements (the file's missing_training_experiments)
        _add_experiment(out, experiment, measured, source, max_stage_s)
    _add_pool_points(out, [e for e in experiments if isinstance(e, dict) and isinstance(e.get("measured"), dict)])
    return out


def _pool_run(experiment: dict[str, Any]) -> dict[str, Any]:
    """The run of an experiment's server as it sized its KV pool: its activations profiled over one
    step of max_num_batched_tokens, shared by the GPUs of its TP group."""
    run = experiment_run(experiment)
    tp = run["deployment"]["attention"]["tp"]
    step = int(experiment["vllm"]["max_num_batched_tokens"])
    return {**run, "workload": {**run["workload"], "prefill_tokens_per_gpu": -(-step // tp)}}


def _add_pool_points(out: MeasuredSet, experiments: list[dict[str, Any]]) -> None:
    """One memory point per distinct server of the file (model, GPUs, TP, max_num_seqs and
    max_num_batched_tokens): the KV pool vLLM reported at start against the one InferSim predicts
    (servers run again under other workloads are one point, named after the first)."""
    servers: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for experiment in experiments:
        vllm = experiment.get("vllm") or {}
        key = (experiment.get("model"), json.dumps(experiment.get("hardware"), sort_keys=True), experiment.get("tp"),
               experiment.get("dp"), vllm.get("max_num_seqs"), vllm.get("max_num_batched_tokens"))
        servers.setdefault(key, []).append(experiment)
    for same in servers.values():
        first = same[0]
        pid = f"trainval-{first['exp_id']}-kv-pool"
        try:
            run = _pool_run(first)
        except InferSimError as exc:
            out.not_expressed.append(NotExpressed(pid, SOURCE, "memory", f"refused: {exc}"))
            continue
        blocks = {int(e["vllm"]["gpu_kv_cache_blocks"]) for e in same}
        pool = min(blocks) * BLOCK_TOKENS
        vllm = first["vllm"]
        why = [f"{first['model']} on {run['deployment']['num_gpus']} x {run['hardware']}, TP "
               f"{run['deployment']['attention']['tp']}, engine {ENGINE} (the runs' vLLM 0.15.1) at its "
               "gpu_memory_utilization default, 0.9 (not stated for these runs)",
               f"max_num_batched_tokens {vllm['max_num_batched_tokens']}: the step whose activations vLLM profiles",
               f"measured: gpu_kv_cache_blocks {' / '.join(str(b) for b in sorted(blocks))} of {BLOCK_TOKENS} tokens "
               "(vllm.log 'GPU KV cache size' // 16)"
               + (f", the server of experiments {', '.join(str(e['exp_id']) for e in same)}" if len(same) > 1 else "")]
        out.reference[pid] = ReferencePoint(pid, SOURCE, float(pool), "tokens",
                                            "KV pool the server reported at start (GPU KV cache size)")
        # the server's token budget is its own, not the card's: vLLM profiles a step of it before sizing KV
        budget = f"engine.scheduler.chunked_prefill_tokens=[{{min_gpu_bytes: 0, value: {vllm['max_num_batched_tokens']}}}]"
        out.mapping[pid] = PointMapping(pid, "memory", "; ".join(why), {"": Conversion("kv_pool_tokens", unit="tokens")},
                                        run=run, overrides=(budget,))


def point_id(experiment: dict[str, Any], stage: int) -> str:
    return f"trainval-{experiment['exp_id']}-{experiment['workload']['name']}-stage{stage}"


def _add_experiment(out: MeasuredSet, experiment: dict[str, Any], measured: dict[str, Any], source: str,
                    max_stage_s: float | None) -> None:
    stages = [int(s.get("stage", i)) for i, s in enumerate(experiment["workload"]["stages"])]
    try:
        run = experiment_run(experiment)
        options = experiment_options(experiment, max_stage_s)
        refused = ""
    except InferSimError as exc:
        run, options, refused = {}, {}, f"refused: {exc}"
    for stage in stages:
        values = measured.get(f"stage_{stage}")
        if not isinstance(values, dict):
            continue
        pid = point_id(experiment, stage)
        if refused:
            out.not_expressed.append(NotExpressed(pid, SOURCE, "serving", refused))
            continue
        value = {METRICS[key][0]: float(v) for key, v in values.items() if key in METRICS}
        out.reference[pid] = ReferencePoint(pid, SOURCE, value, "ms", "client-side latency per load stage")
        metrics = {sub: Conversion(key, unit="ms") for sub, key in METRICS.values() if sub in value}
        out.mapping[pid] = PointMapping(pid, "serving", "; ".join(_why(experiment, run, options, stage)), metrics,
                                        run=run, serving={**options, "stage": stage})
