"""A public vLLM serving run's stated workload (../shared/reference/vllm_serving_trainval.yaml) as serve options.

Each experiment of that file was driven by inference-perf with a shared_prefix data generator and
staged rates; its `workload:` stanza keeps what the run's profile.yaml stated: system_prompt_len,
question_len, output_len (single values), num_unique_system_prompts, num_users_per_system_prompt,
enable_multi_turn_chat and stages of {rate_rps, duration_s}. Its `vllm:` stanza gives the server's
max_num_seqs, max_num_batched_tokens, the KV pool it measured (gpu_kv_cache_blocks of 16 tokens)
and its CPU offload capacity (cpu_kv_offload_blocks, 0: none). The load type the runs used is
inference-perf's `constant` (the file's test fixture, sim-to-real-accuracy-validation
tests/test_ground_truth.py). max_model_len is not stated: vLLM's default is the model's
max_position_embeddings (hf_config), and a server only starts when its KV pool holds one such
request, so the smaller of the two is taken, and said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infersim.base.errors import InferSimError, echo

BLOCK_TOKENS = 16  # the file's KV blocks are vLLM's 16-token blocks
#: seconds of each load stage that count when a run is cut short (the runs' stages: 600-1200 s): long
#: against the runs' requests (up to 40 s for 1,448-token outputs), so that a window holds a few of
#: their lifetimes; `validate` and `calibrate` cut the runs so
STAGE_WINDOW_S = 120.0


def _stanza(experiment: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = experiment.get(key)
    if not isinstance(value, Mapping):
        raise InferSimError(f"trainval experiment {experiment.get('id', '?')}: no '{key}' stanza (got {echo(value)})")
    return value


#: how inference-sim, whose project ran these experiments, expands their multi-turn profiles:
#: fixed-length rounds, no context accumulated ("real inference-perf sends constant input tokens per
#: request ... context is NOT accumulated across turns", inference-sim/inference-sim
#: sim/workload/inference_perf.go computeReasoningSpec, commit 0c75d49a)
FIXED_ROUNDS_NOTE = ("multi-turn rounds as fixed-length requests: the group's system prompt and a question of "
                     "its own, no context accumulated (inference-sim's expansion of these profiles, "
                     "sim/workload/inference_perf.go: 'real inference-perf sends constant input tokens per request')")


def _margin(duration: float, window: float) -> float:
    """Seconds of a cut stage's load simulated before its counted window and after it: half the
    window (the window is then the middle of a stage twice as long), at most half of what was cut."""
    return min(window, duration - window) / 2


def trainval_workload(workload: Mapping[str, Any], max_stage_s: float | None = None,
                      session_context: bool = True) -> dict[str, Any]:
    """The workload form (infersim.serve.workload_spec) of a trainval `workload:` stanza; with
    `max_stage_s`, every stage is cut to at most that long (a shorter run at the same rates).
    Multi-turn chat (enable_multi_turn_chat) is upstream inference-perf's by default: each round
    sends the user's conversation so far before its question; `session_context=False` sends
    fixed-length rounds instead (FIXED_ROUNDS_NOTE)."""
    stages = workload.get("stages")
    if not isinstance(stages, list) or not stages:
        raise InferSimError(f"trainval workload {workload.get('name', '?')}: no stages")
    out_stages = []
    for stage in stages:
        duration = float(stage["duration_s"])
        out_stage: dict[str, Any] = {"rate": stage["rate_rps"], "duration_s": duration}
        if max_stage_s is not None and duration > max_stage_s:
            out_stage.update(duration_s=max_stage_s, **dict.fromkeys(("lead_s", "tail_s"), _margin(duration, max_stage_s)))
        out_stages.append(out_stage)
    notes = [f"trainval workload {workload.get('name', '?')}: inference-perf shared_prefix, load type constant"]
    if max_stage_s is not None and any(float(s["duration_s"]) > max_stage_s for s in stages):
        notes.append(f"stages cut to at most {max_stage_s:g} s each (the run's stages: "
                     + ", ".join(f"{s['rate_rps']:g}/s for {float(s['duration_s']):g} s" for s in stages)
                     + "); a cut stage is the middle of one twice as long: its load runs half as long again "
                     "before it and after it, not counted, so that its requests meet the server as most of the "
                     "long stage's did, neither starting empty nor draining")
    multi_turn = bool(workload.get("enable_multi_turn_chat", False))
    if multi_turn and not session_context:
        notes.append(FIXED_ROUNDS_NOTE)
    return {"load": {"timer": "constant", "stages": out_stages, "interval_s": 1.0},
            "data": {"type": "shared_prefix", "num_groups": workload["num_unique_system_prompts"],
                     "prompts_per_group": workload["num_users_per_system_prompt"],
                     "system_prompt_len": workload["system_prompt_len"], "question_len": workload["question_len"],
                     "output_len": workload["output_len"],
                     "multi_turn": multi_turn and session_context,
                     "order": "fresh" if multi_turn and not session_context else "cycle"},
            "notes": notes}


def trainval_options(experiment: Mapping[str, Any], max_stage_s: float | None = None,
                     session_context: bool = True) -> dict[str, Any]:
    """Serve options (infersim.serve.api) of one trainval experiment: its workload, the server's
    running cap, token budget and measured KV pool, its CPU offload tier and context limit."""
    workload = _stanza(experiment, "workload")
    vllm = _stanza(experiment, "vllm")
    form = trainval_workload(workload, max_stage_s, session_context)
    pool = int(vllm["gpu_kv_cache_blocks"]) * BLOCK_TOKENS
    options: dict[str, Any] = {"workload": form, "max_running_requests": int(vllm["max_num_seqs"]),
                               "max_num_tokens": int(vllm["max_num_batched_tokens"]), "kv_capacity_tokens": pool}
    host = int(vllm.get("cpu_kv_offload_blocks") or 0) * BLOCK_TOKENS
    if host:
        options["host_kv_tokens"] = host
    positions = (experiment.get("hf_config") or {}).get("max_position_embeddings")
    if positions:
        limit = min(int(positions), pool)
        form["max_model_len"] = limit
        form["notes"].append(f"max_model_len {limit:,}: not stated; the smaller of max_position_embeddings "
                             f"({int(positions):,}) and the measured KV pool ({pool:,} tokens)")
    return options
