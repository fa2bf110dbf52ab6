"""A generation result as JSON-ready data, as readable text, and as the benchmark's four-line log.

Sizes are printed in GB = 1e9 bytes (house rule). DeepSpeed's benchmark script divides by 2**30
and also labels that "GB", so its logged sizes read 7.4% lower than ours for the same bytes.
"""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from infersim.generate.simulate import GenerationResult, PassResult
from infersim.base.units import GB

# The benchmark log: the first column is 24 characters wide, the second 22, two spaces between
# columns (../shared/reference/zero_inference.yaml, "Log format").
_COLUMN_WIDTHS = (24, 22)


def _pass(p: PassResult) -> dict[str, Any]:
    return {
        "kv_len": p.kv_len,
        "latency_s": p.seconds,
        "compute_s": p.compute_s,
        "host_to_gpu_s": p.h2d_s,
        "gpu_to_host_s": p.d2h_s,
        "overhead_s": p.overhead_s,
        "host_to_gpu_gb": p.h2d_bytes / GB,
        "gpu_to_host_gb": p.d2h_bytes / GB,
        "bound": p.bound,
    }


def to_json_data(result: GenerationResult) -> dict[str, Any]:
    cfg, gen, mem = result.config, result.spec, result.memory
    prec = cfg.deployment.precision
    steps = result.decode_steps
    return {
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "num_gpus": cfg.deployment.num_gpus,
        "batch": result.batch,
        "prompt_len": result.prompt_len,
        "gen_len": result.gen_len,
        "precision": {"gemm": prec.gemm, "weights": prec.weight_dtype, "kv_cache": prec.kv_cache},
        "offload": {"weights": gen.weights_offloaded, "kv": gen.kv_offloaded,
                    "weights_device": gen.offload_device if gen.weights_offloaded else None,
                    "prefetch": gen.prefetch, "dequantize": result.dequantize or None},
        "host_link_gb_s": result.pcie_bytes_per_s / GB,
        # the benchmark's metric set, in its units
        "model_size_gb": mem.model_bytes / GB,
        "cache_size_gb": mem.cache_bytes / GB,
        "hidden_size_gb": mem.hidden_bytes / GB,
        "peak_gpu_mem_gb": mem.peak_gpu_bytes / GB,
        "prefill_latency_s": result.prefill_latency_s,
        "prefill_throughput_tok_s": result.prefill_throughput,
        "decode_latency_s": result.decode_latency_s,
        "decode_throughput_tok_s": result.decode_throughput,
        "total_latency_s": result.total_latency_s,
        "total_throughput_tok_s": result.total_throughput,
        "decode_method": result.decode_method,
        "decode_steps": len(steps),
        "prefill": _pass(result.prefill),
        "decode_first_step": _pass(steps[0]) if steps else None,
        "decode_last_step": _pass(steps[-1]) if steps else None,
        "decode_step_latencies_s": [s.seconds for s in steps],
        "memory": {
            "weights_stored_gb": mem.weights_stored_bytes / GB,
            "gpu_weights_gb": mem.gpu_weights_bytes / GB,
            "gpu_kv_gb": mem.gpu_kv_bytes / GB,
            "gpu_activations_gb": mem.gpu_activation_bytes / GB,
            "gpu_usable_gb": mem.gpu_usable_bytes / GB,
            "host_weights_gb": mem.host_weights_bytes / GB,
            "host_kv_gb": mem.host_kv_bytes / GB,
            "host_capacity_gb": mem.host_capacity_bytes / GB,
            "nvme_weights_gb": mem.nvme_weights_bytes / GB,
        },
        "notes": list(result.notes),
    }


def _log_line(*cells: str) -> str:
    padded = [f"{cell:<{width}}" for cell, width in zip(cells[:-1], _COLUMN_WIDTHS)]
    return "  ".join([*padded, cells[-1]])


def format_log(data: dict[str, Any]) -> str:
    """The four-line benchmark log from to_json_data's fields (sizes in GB, times in s)."""
    decode_tp = data["decode_throughput_tok_s"]
    return "\n".join([
        _log_line(f"model size: {data['model_size_gb']:.3f} GB", f"cache size: {data['cache_size_gb']:.3f} GB",
                  f"hidden size (p): {data['hidden_size_gb']:.3f} GB"),
        _log_line(f"peak gpu mem: {data['peak_gpu_mem_gb']:.3f} GB", f"prefill latency: {data['prefill_latency_s']:.3f} s",
                  f"prefill throughput: {data['prefill_throughput_tok_s']:.2f} token/s"),
        _log_line(f"decode latency: {data['decode_latency_s']:.3f} s",
                  "decode throughput: " + ("n/a" if decode_tp is None else f"{decode_tp:.2f} token/s")),
        _log_line(f"total latency: {data['total_latency_s']:.3f} s",
                  f"total throughput: {data['total_throughput_tok_s']:.2f} token/s"),
    ])


def to_log(result: GenerationResult) -> str:
    return format_log(to_json_data(result))


def _pass_line(label: str, p: PassResult) -> str:
    return (f"  {label}: {p.seconds:,.3f} s at KV length {p.kv_len} = compute {p.compute_s:,.3f} s, host->GPU {p.h2d_s:,.3f} s ({p.h2d_bytes / GB:,.2f} GB), "
            f"GPU->host {p.d2h_s:,.3f} s, overhead {p.overhead_s:,.3f} s; bound by {p.bound}")


def to_text(result: GenerationResult) -> str:
    cfg, gen, mem = result.config, result.spec, result.memory
    prec = cfg.deployment.precision
    data = to_json_data(result)
    steps = result.decode_steps
    decode_tp = result.decode_throughput
    rows = [
        ["prefill", f"{result.prefill_latency_s:,.3f}", f"{result.prefill_throughput:,.2f}",
         "batch x prompt_len / prefill latency"],
        ["decode", f"{result.decode_latency_s:,.3f}", "n/a" if decode_tp is None else f"{decode_tp:,.2f}",
         f"batch x (gen_len - 1) / decode latency; {len(steps)} steps, {result.decode_method}"],
        ["total", f"{result.total_latency_s:,.3f}", f"{result.total_throughput:,.2f}",
         "batch x gen_len / (prefill + decode latency)"],
    ]
    lines = [
        f"InferSim generate: {cfg.model.name} on {cfg.deployment.num_gpus} x {cfg.hardware.name} ({cfg.hardware.description})",
        f"  batch {result.batch}, prompt {result.prompt_len} tokens, generate {result.gen_len} tokens; "
        f"weights {prec.weight_dtype} (GEMMs {prec.gemm}), KV cache {prec.kv_cache}",
        f"  offload: {gen.describe_offload()}",
        f"  kernel times: {cfg.tables.describe()}",
        "",
    ]
    table = tabulate(rows, headers=["", "latency (s)", "throughput (token/s)", "definition"],
                     tablefmt="simple", disable_numparse=True)
    lines += table.splitlines()
    lines += ["", "PER FORWARD PASS", _pass_line("prefill", result.prefill)]
    if steps:
        lines.append(_pass_line("first decode step", steps[0]))
        if len(steps) > 1:
            lines.append(_pass_line("last decode step", steps[-1]))
    lines += [
        "",
        "MEMORY (GB = 1e9 bytes)",
        f"  model size {data['model_size_gb']:,.3f} GB (parameters x 2 bytes); weights as stored "
        f"{mem.weights_stored_bytes / GB:,.3f} GB per GPU",
        f"  cache size {data['cache_size_gb']:,.3f} GB (KV of {result.batch} x {result.prompt_len + result.gen_len} tokens); "
        f"hidden size (p) {data['hidden_size_gb']:,.3f} GB",
        f"  peak GPU memory {data['peak_gpu_mem_gb']:,.3f} GB of {mem.gpu_usable_bytes / GB:,.2f} GB usable: weights "
        f"{mem.gpu_weights_bytes / GB:,.2f}, KV cache {mem.gpu_kv_bytes / GB:,.2f}, activations {mem.gpu_activation_bytes / GB:,.2f}",
    ]
    if gen.offload:
        lines.append(f"  host memory {mem.host_bytes / GB:,.2f} GB of {mem.host_capacity_bytes / GB:,.2f} GB "
                     f"(weights {mem.host_weights_bytes / GB:,.2f}, KV cache {mem.host_kv_bytes / GB:,.2f})"
                     + (f"; weights on NVMe {mem.nvme_weights_bytes / GB:,.2f} GB" if mem.nvme_weights_bytes else ""))
    lines += ["", "NOTES"] + [f"  - {note}" for note in result.notes]
    return "\n".join(lines)
