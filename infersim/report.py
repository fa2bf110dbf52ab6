"""All reporting lives here: results to JSON-ready data and to readable text."""

from __future__ import annotations

import dataclasses
from typing import Any

from tabulate import tabulate

from infersim.engine import OperationResult, StageResult, combined_source
from infersim.kernels import Bound
from infersim.simulate import SimulationResult
from infersim.units import GB, MS, US


def _operation(op: OperationResult) -> dict[str, Any]:
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
        "detail": op.detail,
    }


def _stage(stage: StageResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if stage.stage == "prefill":
        out["ttft_ms"] = stage.step_time_s / MS
        out["tokens_per_gpu"] = stage.tokens_per_gpu
    else:
        out["tpot_ms"] = stage.step_time_s / MS
        out["batch_per_gpu"] = stage.tokens_per_gpu
    out.update({
        "tgs": stage.tgs,
        "num_layers": stage.num_layers,
        "micro_batches": stage.micro_batches,
        "overlap_saved_ms": stage.overlap_saved_s / MS,
        "sm_slowdown": stage.sm_slowdown,
        "bound": stage.bound.value,
        "source": stage.source.value,
        "module_totals_us": {k: v / US for k, v in stage.module_times().items()},
        "modules": [_operation(op) for op in stage.operations],
    })
    return out


def to_json_data(result: SimulationResult) -> dict[str, Any]:
    cfg = result.config
    mem = result.memory
    return {
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "deployment": dataclasses.asdict(cfg.deployment),
        "workload": dataclasses.asdict(cfg.workload),
        "mfu_tables": cfg.tables.describe(),
        "prefill": _stage(result.prefill),
        "decode": _stage(result.decode),
        "memory": {
            "weights_gb": mem.weights_bytes / GB,
            "kv_bytes_per_token": mem.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": mem.kv_bytes_per_token_per_gpu,
            "hbm_gb": mem.hbm_bytes / GB,
            "reserved_gb": mem.reserved_bytes / GB,
            "kv_capacity_gb": mem.kv_capacity_bytes / GB,
            "request_context_tokens": mem.request_context,
            "max_batch_per_gpu": mem.max_batch_per_gpu,
            "fits": mem.fits,
        },
        "warnings": list(result.warnings),
    }


def _module_rows(stage: StageResult) -> list[list[Any]]:
    """One row per module category: per-layer and per-step time, share, bound and source."""
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
        ])
    return rows


def _operation_rows(stage: StageResult) -> list[list[Any]]:
    return [[op.group, op.name, op.module, op.layers, f"{op.time_per_layer_s / US:,.2f}", f"{op.time_s / MS:,.3f}",
             f"{op.flops / 1e12:,.3f}", f"{op.bytes / GB:,.3f}", op.bound.value, op.source.value]
            for op in stage.operations]


def _stage_text(stage: StageResult, detail: bool) -> list[str]:
    if stage.stage == "prefill":
        head = (f"PREFILL  TTFT {stage.step_time_s / MS:,.2f} ms   throughput {stage.tgs:,.0f} tokens/GPU/s"
                f"   ({stage.tokens_per_gpu} prompt tokens per GPU per step)")
    else:
        head = (f"DECODE   TPOT {stage.step_time_s / MS:,.2f} ms   throughput {stage.tgs:,.0f} tokens/GPU/s"
                f"   ({stage.tokens_per_gpu} requests per GPU)")
    sources = sorted({op.source.value for op in stage.operations if op.time_s > 0})
    lines = [head, f"  bound by {stage.bound.value}; times from {' + '.join(sources)}"
             + (f"; two-batch overlap saves {stage.overlap_saved_s / MS:,.2f} ms"
                + (f" (compute slowed x{stage.sm_slowdown:.3f} by SMs held by communication)" if stage.sm_slowdown > 1 else "")
                if stage.micro_batches > 1 else "")]
    table = tabulate(_module_rows(stage), headers=["module", "per layer (us)", "step (ms)", "share", "bound", "source"],
                     tablefmt="simple", disable_numparse=True)
    lines += ["  " + line for line in table.splitlines()]
    if detail:
        table = tabulate(_operation_rows(stage), headers=["group", "operation", "module", "layers", "per layer (us)",
                                                          "step (ms)", "TFLOP", "GB", "bound", "source"],
                         tablefmt="simple", disable_numparse=True)
        lines += [""] + ["  " + line for line in table.splitlines()]
    return lines


def to_text(result: SimulationResult, detail: bool = False) -> str:
    cfg = result.config
    dep, wl, mem = cfg.deployment, cfg.workload, result.memory
    layout = (f"{dep.num_gpus} GPU(s) on {dep.num_nodes} node(s); attention TP{dep.attention.tp} x DP{dep.attention.dp}; "
              f"FFN TP{dep.ffn.tp} x EP{dep.ffn.ep} x DP{dep.ffn.dp}" + (f"; PP{dep.pp}" if dep.pp > 1 else "")
              + f"; GEMM {dep.precision.gemm}, weights {dep.precision.weight_dtype}, KV {dep.precision.kv_cache}"
              + f"; overlap {dep.overlap}" + (f"; MoE comm {dep.moe_comm}" if cfg.model.is_moe else ""))
    lines = [
        f"InferSim: {cfg.model.name} on {cfg.hardware.name} ({cfg.hardware.description})",
        f"  deployment: {layout}",
        f"  workload:   ISL {wl.isl} tokens, OSL {wl.osl} tokens; decode context averages {wl.decode_context:g} tokens",
        f"  kernel times: {cfg.tables.describe()}",
        "",
        *_stage_text(result.prefill, detail),
        "",
        *_stage_text(result.decode, detail),
        "",
        "MEMORY (per GPU; GB = 1e9 bytes)",
        f"  weights {mem.weights_bytes / GB:,.2f} GB of {mem.hbm_bytes / GB:,.2f} GB HBM "
        f"(runtime reserves {mem.reserved_bytes / GB:,.2f} GB); KV cache space {mem.kv_capacity_bytes / GB:,.2f} GB",
        f"  KV cache per token: {mem.kv_bytes_per_token:,.0f} bytes for the whole model, "
        f"{mem.kv_bytes_per_token_per_gpu:,.0f} bytes on each GPU",
        f"  largest decode batch that fits: {mem.max_batch_per_gpu} requests per GPU of {mem.request_context} tokens"
        + ("" if mem.fits else "   ** DOES NOT FIT **"),
    ]
    if result.warnings:
        lines += ["", "WARNINGS"] + [f"  - {w}" for w in result.warnings]
    return "\n".join(lines)
