"""All reporting lives here: results to JSON-ready data and to readable text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


from infersim.run.config import RunConfig, weights_origin
from infersim.run.confidence import confidence_json, operation_grade, stage_confidence, table_origin
from infersim.run.memory import MemoryResult, logged_pool_tokens
from infersim.engine.stage import OperationResult, StageResult, combined_source
from infersim.shapes.kernels import Bound
from infersim.modules.step import lm_head_gathered_dp
from infersim.run.simulate import SimulationResult
from infersim.base.texttable import counted, simple_table
from infersim.costing.timing import IMBALANCE_FROM_TABLE
from infersim.base.units import GB, MS, US
from infersim.cli.energy import energy_json, energy_text


def _operation(op: OperationResult, grade: str) -> dict[str, Any]:
    return {
        "name": op.name,
        "module": op.module,
        "group": op.group,
        "layers": op.layers,
        "time_us": op.time_s / US,
        "time_per_layer_us": op.time_per_layer_s / US,
        "flops": op.flops,
        "bytes": op.bytes,
        "bound": op.bound.value,
        "source": op.source.value,
        "grade": grade,
        "detail": op.detail,
    }


def stage_moe_balance(result: SimulationResult, stage: StageResult) -> Any:
    """The expert-load balance (infersim.modules.load_balance.MoeBalance) the stage's MoE layers
    were sized with, or None for a dense model (under speculative decoding: the verification
    step's, lookahead + 1 tokens per request)."""
    cfg = result.config
    if not cfg.model.is_moe:
        return None
    from infersim.modules.ffn import stage_moe_balance as balance_of
    from infersim.modules.step import stage_context

    q_len = result.speculative.lookahead + 1 if result.speculative and stage.stage == "decode" else 1
    ctx = stage_context(stage.stage, cfg.model, cfg.deployment, cfg.workload, stage.tokens_per_gpu,  # type: ignore[arg-type]
                        stage.micro_batches, q_len)
    return balance_of(cfg.model, cfg.deployment, ctx)


def _balance_json(balance: Any) -> dict[str, Any] | None:
    if balance is None:
        return None
    return {"policy": balance.policy, "factor": balance.token_factor, "weight_factor": balance.weight_factor,
            "active_experts": balance.active_experts, "mean_active_experts": balance.mean_active_experts,
            "tokens_per_rank": balance.tokens_per_rank, "ep": balance.ep, "experts": balance.experts,
            "slots": balance.slots, "redundant_experts": balance.slots - balance.experts,
            "routing_skew": balance.routing_skew, "dataset_skew": balance.dataset_skew,
            "sequence_length": balance.sequence_length,
            "placement_factor": balance.placement_factor, "derivation": balance.derivation()}


def _stage(result: SimulationResult, stage: StageResult, balance: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    confidence = stage_confidence(stage, result.config)
    origin = table_origin(result.config)
    if stage.stage == "prefill":
        out["step_time_ms"] = stage.step_time_s / MS
        out["ttft_ms"] = stage.step_time_s / MS  # the prefill step (all its prompts together); see single_request_ttft_ms
        out["single_request_ttft_ms"] = result.single_request_ttft_s / MS
        out["prompts_per_step"] = result.prompts_per_prefill_step
        out["tokens_per_gpu"] = stage.tokens_per_gpu
        out["chunks"] = stage.chunks
    else:
        out["tpot_ms"] = stage.tpot_s / MS
        out["step_time_ms"] = stage.step_time_s / MS
        out["tokens_per_step"] = stage.tokens_per_step
        out["batch_per_gpu"] = stage.tokens_per_gpu
        out["graph_padded_batch"] = stage.padded_batch or stage.tokens_per_gpu
    out.update({
        "tgs": stage.tgs,
        "num_layers": stage.num_layers,
        "micro_batches": stage.micro_batches,
        "overlap_saved_ms": stage.overlap_saved_s / MS,
        "sm_slowdown": stage.sm_slowdown,
        "bound": stage.bound.value,
        "source": stage.source.value,
        "module_totals_us": {k: v / US for k, v in stage.module_times().items()},
        "moe_load_balance": _balance_json(balance),
        "confidence": confidence_json(confidence),
        "modules": [_operation(op, operation_grade(op, origin)) for op in stage.operations],
    })
    return out


def _deployment_json(dep: Any) -> dict[str, Any]:
    data = dataclasses.asdict(dep)
    if data.get("weight_offload") == "none":
        del data["weight_offload"]  # runs without offload report exactly what they did before the field existed
    return data


def _offload_json(mem: Any) -> dict[str, Any] | None:
    """deployment.weight_offload auto: what stays in host memory and how fast it streams (None: nothing)."""
    off = mem.weight_offload
    if off is None:
        return None
    return {"offloaded_gb": off.bytes_per_gpu / GB, "resident_weights_gb": mem.resident_weights_bytes / GB,
            "pool": off.pool, "pool_gb": off.pool_bytes_per_gpu / GB, "fraction_of_pool": off.fraction,
            "bytes_per_layer": list(off.bytes_per_layer), "host_link_gb_per_s": off.link_bytes_per_s / GB,
            "host_memory_gb": off.host_memory_bytes / GB, "fits_host_memory": off.fits_host,
            "fits_pool": off.fits_pool}


def _window_pool_text(engine: str, mem: MemoryResult) -> str:
    """How the engine's hybrid sliding-window pool holds a request (MemoryResult.window_pool)."""
    pool = mem.window_pool
    assert pool is not None
    tokens = "token" if pool.ratio == 1 else "tokens"
    return (f"  KV pool: {engine} sizes it in tokens of the full-attention layers, each with {pool.ratio:g} {tokens} "
            f"of the sliding-window layers' KV beside it (engine card memory.sliding_window_pool_ratio): "
            f"{mem.pool_token_bytes_per_gpu:,.0f} bytes per pool token on each GPU; a request of "
            f"{mem.request_context:,} tokens takes {mem.request_bytes_per_gpu:,.0f} bytes of it on each GPU")


def _state_pool_text(engine: str, mem: MemoryResult) -> str:
    """How the engine's pool of recurrent-state slots holds running requests (MemoryResult.state_pool)."""
    pool = mem.state_pool
    assert pool is not None
    return (f"  recurrent-state pool: {engine} sets {pool.held_bytes_per_gpu / GB:,.2f} GB apart before the KV cache space "
            f"(engine card memory.recurrent_state_pool): {counted(pool.slots, 'state slot')} per scheduler, "
            f"{pool.slot_bytes_per_gpu:,.0f} bytes each on each of its GPUs; a running request holds "
            f"{counted(pool.slots_per_request, 'slot')}, so a scheduler runs at most {counted(pool.requests, 'request')}")


def _logged_pool(result: SimulationResult) -> int | None:
    """The KV pool the run's engine logs as it starts (run.memory.logged_pool_tokens)."""
    cfg = result.config
    return logged_pool_tokens(result.memory, cfg.model, cfg.deployment, cfg.engine, cfg.hardware)


def _logged_pool_lines(result: SimulationResult) -> list[str]:
    """The MEMORY line of the KV pool the engine logs as it starts, named as its log names it."""
    logged = _logged_pool(result)
    if logged is None:
        return []
    engine = result.config.engine
    line = _LOG_LINES[engine.memory.logged_kv_cache_size]
    return [f"  KV pool as {engine.name} logs it at start (\"{line}\"): {logged:,} tokens"]


#: how each engine's start-up log names the KV pool it allotted (engine card memory.logged_kv_cache_size)
_LOG_LINES = {"pool": "GPU KV cache size", "max_model_len_requests": "GPU KV cache size",
              "max_total_num_tokens": "max_total_num_tokens",
              "max_tokens_in_paged_kv_cache": "max tokens in paged KV cache"}


def _memory_json(result: SimulationResult) -> dict[str, Any]:
    mem = result.memory
    data = {
        "weights_gb": mem.weights_bytes / GB,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": mem.kv_bytes_per_token_per_gpu,
        "hbm_gb": mem.hbm_bytes / GB,
        "reserved_gb": mem.reserved_bytes / GB,
        "kv_capacity_gb": mem.kv_capacity_bytes / GB,
        "request_context_tokens": mem.request_context,
        "max_batch_per_gpu": mem.max_batch_per_gpu,
        "kv_fit_batch_per_gpu": mem.kv_fit_batch_per_gpu,
        "running_cap_per_gpu": mem.running_cap_per_gpu,
        "binding_limit": mem.binding_limit,
        "activation_gb": mem.activation_bytes / GB,
        "prefill_step_tokens": mem.prefill_step_tokens,
        "fits": mem.fits,
        "bounded_bytes_per_request": mem.bounded_bytes_per_request,
        "bounded_bytes_per_request_per_gpu": mem.bounded_bytes_per_request_per_gpu,
        "draft_weights_gb": mem.draft_weights_bytes / GB,
        "encoder_weights_gb": mem.encoder_weights_bytes / GB,
        "draft_kv_bytes_per_token_per_gpu": mem.draft_kv_bytes_per_token_per_gpu,
    }
    logged = _logged_pool(result)
    if logged is not None:
        data["logged_kv_pool_tokens"] = logged
    if result.config.deployment.weight_offload != "none":
        data["weight_offload"] = _offload_json(mem)
    if mem.state_pool is not None:
        data["recurrent_state_pool"] = {"slots": mem.state_pool.slots,
                                        "slot_bytes_per_gpu": mem.state_pool.slot_bytes_per_gpu,
                                        "slots_per_request": mem.state_pool.slots_per_request,
                                        "held_gb": mem.state_pool.held_bytes_per_gpu / GB,
                                        "requests_per_scheduler": mem.state_pool.requests}
    if mem.window_pool is not None:
        data["sliding_window_pool"] = {"ratio": mem.window_pool.ratio,
                                       "pool_token_bytes_per_gpu": mem.pool_token_bytes_per_gpu,
                                       "request_bytes_per_gpu": mem.request_bytes_per_gpu}
    return data


def _workload_json(result: SimulationResult) -> dict[str, Any]:
    """The workload as run: a decode batch asked for as 'max' is the number it resolved to (every
    field stays a number for machines), with what was asked for beside it."""
    data = dataclasses.asdict(result.config.workload)
    if data["decode_batch_per_gpu"] == "max":
        data["decode_batch_per_gpu"] = result.decode.tokens_per_gpu
        data["decode_batch_requested"] = "max: the largest batch that fits"
    return data


def to_json_data(result: SimulationResult) -> dict[str, Any]:
    cfg = result.config
    return {
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "hardware_peaks": _hardware_peaks(cfg.hardware),
        "deployment": _deployment_json(cfg.deployment),
        "weights_format": weights_origin(cfg),
        "workload": _workload_json(result),
        "engine": {"name": cfg.engine.name, "framework": cfg.engine.framework, "version": cfg.engine.version,
                   "source": cfg.engine_source, "attention_backend": _attention_backend(cfg)},
        "mfu_tables": cfg.tables.describe(),
        "notes": list(cfg.notes),
        "prefill": _stage(result, result.prefill, stage_moe_balance(result, result.prefill)),
        "decode": _stage(result, result.decode, stage_moe_balance(result, result.decode)),
        "memory": _memory_json(result),
        "server": server_figures(result),
        "energy": energy_json(result),
        "speculative": _speculative(result.speculative) if result.speculative else None,
        "warnings": list(result.warnings),
        # false: the stage numbers above are what the model computes, not a speed that can happen
        "fits": result.fits,
        "unfit_reasons": list(result.unfit),
    }


def _hardware_peaks(hw: Any) -> dict[str, Any]:
    """The card's ceilings (SI: FLOP/s, bytes/s) and derates, so a saved result can be drawn as a roofline."""
    return {
        "flops": dict(hw.peak.flops),
        "hbm_bandwidth": hw.peak.hbm_bandwidth,
        "compute_efficiency": dict(hw.derates.compute_efficiency),
        "attention_compute_efficiency": hw.derates.attention_compute_efficiency,
        "memory_efficiency": hw.derates.memory_efficiency,
        "elementwise_memory_efficiency": hw.derates.elementwise_memory_efficiency,
    }


def _speculative(spec: Any) -> dict[str, Any]:
    data = dataclasses.asdict(spec)
    for key in [k for k in data if k.endswith("_s")]:
        data[key[:-2] + "_ms"] = data.pop(key) / MS
    data["search"] = [{"lookahead": p.lookahead, "expected_tokens": p.expected_tokens,
                       "step_time_ms": p.step_time_s / MS, "tpot_ms": p.tpot_s / MS} for p in spec.search]
    return data


def _speculative_text(spec: Any) -> list[str]:
    k = f"{spec.lookahead}" + (f" (auto: best of 1..{max(p.lookahead for p in spec.search)})" if spec.lookahead_auto else "")
    lines = [
        f"SPECULATIVE DECODING  {spec.method} with {spec.drafter}; lookahead k = {k}; acceptance rate {spec.acceptance_rate:g}",
        f"  expected tokens per step (1 - a^(k+1)) / (1 - a) = {spec.expected_tokens_per_step:.3f}",
        f"  step = draft {spec.draft_time_s / MS:,.2f} ms ({spec.lookahead} x {spec.draft_step_time_s / MS:,.2f} ms) "
        f"+ verify {spec.verify_time_s / MS:,.2f} ms = {spec.step_time_s / MS:,.2f} ms",
        f"  effective TPOT {spec.tpot_s / MS:,.2f} ms vs {spec.baseline_tpot_s / MS:,.2f} ms without speculation "
        f"(x{spec.speedup:.2f}); throughput {spec.tgs:,.0f} tokens/GPU/s",
        f"  TTFT includes the drafter's prefill: {spec.prefill_draft_time_s / MS:,.2f} ms",
    ]
    if spec.lookahead_auto:
        rows = [[p.lookahead, f"{p.expected_tokens:.3f}", f"{p.step_time_s / MS:,.2f}", f"{p.tpot_s / MS:,.2f}"]
                for p in spec.search]
        table = simple_table(rows, ["k", "tokens/step", "step (ms)", "TPOT (ms)"])
        lines += ["  " + line for line in table.splitlines()]
    return lines


def _module_rows(stage: StageResult, grades: dict[str, str]) -> list[list[Any]]:
    """One row per module category: per-layer and per-step time, share, bound, source and grade."""
    by_module: dict[str, list[OperationResult]] = {}
    for op in stage.operations:
        by_module.setdefault(op.module, []).append(op)
    rows = []
    total = sum(op.time_s for op in stage.operations)
    for module, ops in sorted(by_module.items(), key=lambda kv: -sum(o.time_s for o in kv[1])):
        seconds = sum(o.time_s for o in ops)
        layer_ops = [o for o in ops if o.group != "per step"]
        per_layer = (sum(o.time_s for o in layer_ops) / stage.num_layers) if layer_ops else None
        bounds: dict[Bound, float] = {}
        for o in ops:
            bounds[o.bound] = bounds.get(o.bound, 0.0) + o.time_s
        rows.append([
            module,
            f"{per_layer / US:,.1f}" if per_layer is not None else "-",
            f"{seconds / MS:,.3f}",
            f"{100 * seconds / total:.1f}%" if total else "-",
            max(bounds, key=bounds.__getitem__).value,
            combined_source(o.source for o in ops).value,
            grades.get(module, ""),
        ])
    return rows


def _operation_rows(stage: StageResult) -> list[list[Any]]:
    return [[op.group, op.name, op.module, op.layers, f"{op.time_per_layer_s / US:,.2f}", f"{op.time_s / MS:,.3f}",
             f"{op.flops / 1e12:,.3f}", f"{op.bytes / GB:,.3f}", op.bound.value, op.source.value, _short(op.detail)]
            for op in stage.operations]


def _short(detail: str, width: int = 90) -> str:
    """Where a number came from (table file, collective algorithm), shortened to keep rows on one line."""
    detail = detail.replace(str(Path.cwd()) + "/", "")
    return detail if len(detail) <= width else detail[: width - 3] + "..."


def server_figures(result: SimulationResult) -> dict[str, Any]:
    """The run seen from the whole server rather than one GPU: the requests decoding at once on
    all its GPUs and in one scheduler (an attention-TP group, times the pipeline stages: the batch
    vLLM's max_num_seqs or SGLang's max_running_requests of one instance caps), and the tokens/s
    of every GPU together."""
    dep = result.config.deployment
    per_gpu = result.decode.tokens_per_gpu
    return {"gpus": dep.num_gpus,
            "decode_requests": per_gpu * dep.num_gpus,
            "scheduler_gpus": dep.attention.tp * dep.pp,
            "requests_per_scheduler": per_gpu * dep.attention.tp * dep.pp,
            "schedulers": dep.attention.dp,
            "prefill_tokens_per_s": result.prefill.tgs * dep.num_gpus,
            "decode_tokens_per_s": result.decode.tgs * dep.num_gpus}


def _server_text(result: SimulationResult, stage: StageResult) -> str:
    server = server_figures(result)
    gpus = f"{server['gpus']} GPU{'s' if server['gpus'] > 1 else ''}"
    if stage.stage == "prefill":
        return f"  server: {server['prefill_tokens_per_s']:,.0f} prompt tokens/s on {gpus}"
    one = (f"attention TP{result.config.deployment.attention.tp}"
           + (f" x PP{result.config.deployment.pp}" if result.config.deployment.pp > 1 else ""))
    if server["schedulers"] > 1:
        who = f"each of the {server['schedulers']} attention-DP schedulers ({one}) runs"
    else:
        who = f"one scheduler ({one}) runs"
    return (f"  server: {server['decode_requests']:,} requests decoding at once on {gpus}, "
            f"{server['decode_tokens_per_s']:,.0f} output tokens/s; {who} {server['requests_per_scheduler']:,} of "
            "them (its max_num_seqs / max_running_requests)")


def _single_request_text(result: SimulationResult) -> str:
    """The line under PREFILL that keeps its step apart from a benchmark's TTFT."""
    isl = result.config.workload.isl
    line = (f"  single-request TTFT {result.single_request_ttft_s / MS:,.2f} ms: one {isl:,}-token prompt alone on an "
            "idle server")
    if result.single_prompt is None:
        return line + ", the step above (a benchmark's TTFT adds queueing and the steps it shares: infersim serve)"
    return (line + f"; the step above prefills {result.prompts_per_prefill_step:g} prompts per attention group "
            "together, the TTFT of prompts that arrive at once")


def _stage_text(stage: StageResult, detail: bool, balance: Any = None, server: str = "",
                result: SimulationResult | None = None) -> list[str]:
    if stage.stage == "prefill" and stage.chunks > 1:
        head = (f"PREFILL  prefill {stage.step_time_s / MS:,.2f} ms in {stage.chunks} steps   throughput "
                f"{stage.tgs:,.0f} tokens/GPU/s   (a {stage.tokens_per_gpu}-token prompt per GPU in {stage.chunks} "
                f"chunks, each attending to the prefix already cached)")
    elif stage.stage == "prefill":
        head = (f"PREFILL  step {stage.step_time_s / MS:,.2f} ms   throughput {stage.tgs:,.0f} tokens/GPU/s"
                f"   ({stage.tokens_per_gpu} prompt tokens per GPU per step)")
    else:
        head = (f"DECODE   TPOT {stage.tpot_s / MS:,.2f} ms   throughput {stage.tgs:,.0f} tokens/GPU/s"
                f"   ({counted(stage.tokens_per_gpu, 'request')} per GPU"
                + (f"; the CUDA graph computes {stage.padded_batch}, padded to a captured size)" if stage.padded_batch
                   else ")"))
        if stage.tokens_per_step != 1.0:
            head += f"\n  one step takes {stage.step_time_s / MS:,.2f} ms and yields {stage.tokens_per_step:.3f} tokens per request"
    sources = sorted({op.source.value for op in stage.operations if op.time_s > 0})
    if stage.stage == "prefill" and result is not None:
        head += "\n" + _single_request_text(result)
    if server:
        head += "\n" + server
    confidence = stage_confidence(stage, result.config) if result is not None else None
    if confidence is not None:
        head += f"\n  grade: {confidence.describe()} of the step"
    lines = [head, f"  bound by {stage.bound.value}; times from {' + '.join(sources)}"
             + (f"; two-batch overlap saves {stage.overlap_saved_s / MS:,.2f} ms"
                + (f" (compute slowed x{stage.sm_slowdown:.3f} by SMs held by communication)" if stage.sm_slowdown > 1 else "")
                if stage.micro_batches > 1 else "")]
    if balance is not None:
        lines.append(f"  expert load: {balance.describe()}")
        if any(IMBALANCE_FROM_TABLE in op.detail for op in stage.operations):
            lines.append("    routed experts timed by a table measured under skewed routing: looked up at the load whose "
                         "busiest rank under that routing carries what this factor gives")
        if detail:
            lines.append(f"    factor = {balance.derivation()}")
    grades = confidence.modules if confidence is not None else {}
    table = simple_table(_module_rows(stage, grades), ["module", "per layer (us)", "step (ms)", "share", "bound", "source",
                                                       "grade"])
    lines += ["  " + line for line in table.splitlines()]
    if detail:
        table = simple_table(_operation_rows(stage), ["group", "operation", "module", "layers", "per layer (us)",
                                                      "step (ms)", "TFLOP", "GB", "bound", "source", "from"])
        lines += [""] + ["  " + line for line in table.splitlines()]
    return lines


_MIXER_NAMES = {"full_attention": "full attention", "sliding_attention": "sliding-window attention",
                "chunked_attention": "chunked attention", "linear_attention": "Gated DeltaNet", "mamba": "Mamba-2"}


def _attention_backend(cfg: RunConfig) -> str | None:
    """The attention backend the engine card picks for this GPU and model (None: the card names none)."""
    choice = cfg.engine.attention_backend(cfg.hardware, cfg.model.is_mla)
    return choice.backend if choice is not None else None


def _attention_text(cfg: RunConfig) -> str:
    backend = _attention_backend(cfg)
    return f"; attention {backend}" if backend else ""


def _layer_mix(model: Any) -> str:
    attention = "MLA" if model.is_mla else (
        "MHA" if model.num_key_value_heads == model.num_attention_heads else
        "MQA" if model.num_key_value_heads == 1 else "GQA")
    parts = [f"{n} {_MIXER_NAMES.get(mixer, mixer)}{' + MoE' if moe else ''}" for mixer, moe, n in model.layer_composition]
    ffn = (f"MoE {model.num_experts} experts, top-{model.num_experts_per_tok}"
           + (f", {model.num_shared_experts} shared" if model.num_shared_experts else "")) if model.is_moe else "dense FFN"
    return f"{model.num_hidden_layers} layers ({', '.join(parts)}); {attention}; {ffn}"


UNFIT_MARK = "[DOES NOT FIT: not achievable] "


def _offload_text(result: SimulationResult) -> str:
    """The MEMORY section's line on deployment.weight_offload auto."""
    mem, hw = result.memory, result.config.hardware
    off = mem.weight_offload
    if off is None:
        return "  weight offload auto: nothing offloaded, every weight fits in HBM beside the KV cache the workload needs"
    per_layer = max(off.bytes_per_layer)
    return (f"  weight offload auto: {off.bytes_per_gpu / GB:,.2f} GB per GPU in host memory ({100 * off.fraction:.1f}% of "
            f"the {off.pool_bytes_per_gpu / GB:,.2f} GB of {off.pool}, an equal share of every layer holding them: "
            f"{per_layer / GB:,.3f} GB each; {off.host_memory_bytes / GB:,.2f} GB host memory per GPU), "
            f"{mem.resident_weights_bytes / GB:,.2f} GB resident; streamed every forward pass over the host link at "
            f"{off.link_bytes_per_s / GB:,.1f} GB/s (pcie_bandwidth {hw.peak.pcie_bandwidth / GB:,.1f} GB/s x "
            f"pcie_efficiency {hw.derates.pcie_efficiency:g}), one layer ahead of compute")


def weights_text(cfg: Any) -> str:
    """Which format the weights have and where it came from: the checkpoint, the run config, or the
    default (an unquantised checkpoint: the text report prints the line for quantised checkpoints
    only, the deployment line saying the format; JSON's weights_format is always there)."""
    w = weights_origin(cfg)
    text = f"{w['weights']} from the {w['weights_from']}" if w["weights_from"] in ("checkpoint",) else \
        f"{w['weights']} ({w['weights_from']})"
    if "expert_weights" in w and w["expert_weights"] != w["weights"]:
        text += f"; routed experts {w['expert_weights']} ({w['expert_weights_from']})"
    if "attention_weights" in w:
        text += f"; attention {w['attention_weights']} ({w['attention_weights_from']})"
    text += f"; GEMM inputs {w['gemm']} ({w['gemm_from']})"
    q = w["checkpoint"]
    if q is not None:
        text += f"; checkpoint: {q['detail']}"
    return text


def _unfit_text(result: SimulationResult, show_unfit: bool) -> list[str]:
    lines = ["DOES NOT FIT on " + f"{result.config.deployment.num_gpus} x {result.config.hardware.name}:"]
    lines += [f"  - {reason}" for reason in result.unfit]
    if show_unfit:
        lines.append("  the times below are computed anyway (--show-unfit); no server can reach them")
    else:
        lines.append("  no TTFT, TPOT or throughput is printed for a run that cannot happen "
                     "(--show-unfit prints them, marked)")
    return lines


def to_text(result: SimulationResult, detail: bool = False, show_unfit: bool = False) -> str:
    cfg = result.config
    dep, wl, mem = cfg.deployment, cfg.workload, result.memory
    layout = (f"{dep.num_gpus} GPU(s) on {dep.num_nodes} node(s); attention TP{dep.attention.tp} x DP{dep.attention.dp}; "
              f"FFN TP{dep.ffn.tp} x EP{dep.ffn.ep} x DP{dep.ffn.dp}" + (f"; PP{dep.pp}" if dep.pp > 1 else "")
              + f"; GEMM {dep.precision.gemm}, weights {dep.precision.weight_dtype}, KV {dep.precision.kv_cache}"
              + f"; overlap {dep.overlap}" + (f"; MoE comm {dep.moe_comm}" if cfg.model.is_moe else ""))
    expert_format = dep.precision.expert_weights
    if expert_format:
        layout += f"; routed experts stored {expert_format}"
    if dep.precision.expert_gemm:
        layout += f"; routed-expert GEMMs {dep.precision.expert_gemm}"
    if dep.precision.attention_weights:
        layout += (f"; attention projections stored {dep.precision.attention_weight_dtype}, "
                   f"GEMMs {dep.precision.attention_gemm_dtype}")
    if lm_head_gathered_dp(cfg.model, dep) > 1:
        layout += f"; LM head gathered over the {dep.attention.dp} DP ranks"
    lines = [
        f"InferSim: {cfg.model.name} on {cfg.hardware.name} ({cfg.hardware.description})",
        f"  model:      {_layer_mix(cfg.model)}",
        f"  deployment: {layout}",
        *([f"  weights:    {weights_text(cfg)}"] if cfg.model.quantization is not None else []),
        f"  workload:   ISL {wl.isl} tokens, OSL {wl.osl} tokens; decode context averages {wl.decode_context:g} tokens",
        f"  engine:     {cfg.engine.name} {cfg.engine.version} ({cfg.engine.description}){_attention_text(cfg)}",
        f"  kernel times: {cfg.tables.describe()}",
        *(f"  note:       {note}" for note in cfg.notes),
        "",
    ]
    stages = [*_stage_text(result.prefill, detail, stage_moe_balance(result, result.prefill),
                           _server_text(result, result.prefill), result), "",
              *_stage_text(result.decode, detail, stage_moe_balance(result, result.decode),
                           _server_text(result, result.decode), result), ""]
    if not result.fits:
        lines += [*_unfit_text(result, show_unfit), ""]
        stages = [UNFIT_MARK + line if line.startswith(("PREFILL", "DECODE")) else line for line in stages]
    if result.fits or show_unfit:
        energy = energy_text(result)
        lines += stages + ([UNFIT_MARK + energy[0], *energy[1:]] if not result.fits else energy) + [""]
    lines += [
        "MEMORY (per GPU; GB = 1e9 bytes)",
        f"  weights {mem.weights_bytes / GB:,.2f} GB of {mem.hbm_bytes / GB:,.2f} GB HBM "
        f"({cfg.engine.name} keeps {mem.reserved_bytes / GB:,.2f} GB: context, graphs, buffers and the activations of "
        f"one {mem.prefill_step_tokens}-token prefill step); "
        + (f"KV cache space {mem.kv_capacity_bytes / GB:,.2f} GB" if mem.kv_capacity_bytes > 0 else
           f"no KV cache space (weights exceed what is left by {-mem.kv_capacity_bytes / GB:,.2f} GB)"),
        f"  KV cache per token: {mem.kv_bytes_per_token:,.0f} bytes for the whole model, "
        f"{mem.kv_bytes_per_token_per_gpu:,.0f} bytes on each GPU",
        f"  largest decode batch that fits: {counted(mem.max_batch_per_gpu, 'request')} per GPU of {mem.request_context} tokens"
        + (f" (bound by the {mem.binding_limit}" + (f"; the KV cache holds {mem.kv_fit_batch_per_gpu})"
                                                    if mem.binding_limit == "running-request cap" else ")"))
        + ("" if mem.fits else "   ** DOES NOT FIT **"),
    ]
    lines += _logged_pool_lines(result)
    if dep.weight_offload != "none":  # right below the weights line it qualifies
        lines.insert(lines.index("MEMORY (per GPU; GB = 1e9 bytes)") + 2, _offload_text(result))
    if mem.bounded_bytes_per_request:
        lines.append(f"  state that does not grow with context (sliding-window or chunked KV, recurrent/conv state): "
                     f"{mem.bounded_bytes_per_request:,.0f} bytes per request, "
                     f"{mem.bounded_bytes_per_request_per_gpu:,.0f} on each GPU")
    if mem.window_pool is not None:
        lines.append(_window_pool_text(cfg.engine.name, mem))
    if mem.state_pool is not None:
        lines.append(_state_pool_text(cfg.engine.name, mem))
    if mem.encoder_weights_bytes:
        lines.append(f"  multimodal encoder (included in the weights above): {mem.encoder_weights_bytes / GB:,.2f} GB, "
                     f"loaded by {cfg.engine.name} though text requests never run it")
    if mem.draft_weights_bytes:
        lines.append(f"  drafter (included above): weights {mem.draft_weights_bytes / GB:,.2f} GB, "
                     f"KV {mem.draft_kv_bytes_per_token_per_gpu:,.0f} bytes per token on each GPU")
    if result.speculative and (result.fits or show_unfit):
        lines += [""] + [(UNFIT_MARK if not result.fits and i == 0 else "") + line
                         for i, line in enumerate(_speculative_text(result.speculative))]
    if result.warnings:
        lines += ["", "WARNINGS"] + [f"  - {w}" for w in result.warnings]
    return "\n".join(lines)
