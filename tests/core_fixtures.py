"""Small cards with round numbers, so expected costs can be derived by hand in the tests."""

from __future__ import annotations

import copy
from typing import Any

from infersim.run.config import RunConfig, config_from_mapping

TINY_MODEL: dict[str, Any] = {
    "name": "tiny",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "intermediate_size": 128,
}

TINY_MOE: dict[str, Any] = {
    **TINY_MODEL,
    "name": "tiny-moe",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 0,
}

TINY_MLA: dict[str, Any] = {
    **TINY_MODEL,
    "name": "tiny-mla",
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}

# 100 TFLOP/s, 1 TB/s, everything achievable, no overheads: roofline = max(FLOPs/1e14, bytes/1e12)
_LATENCY = {"base": 0.0, "nvlink_hop": 0.0, "network_hop": 0.0, "bandwidth_efficiency": 1.0}
ROUND_GPU: dict[str, Any] = {
    "name": "round",
    "vendor": "nvidia",
    "peak": {
        "flops": {"bf16": 100e12, "fp8": 200e12},
        "hbm_bytes": 10e9,
        "hbm_bandwidth": 1e12,
        "nvlink_bandwidth": 100e9,
        "network_bandwidth": 10e9,
        "pcie_bandwidth": 10e9,
        "sm_count": 100,
        "l2_bytes": 1e6,
        "gpus_per_node": 8,
    },
    "derates": {
        "compute_efficiency": {"bf16": 1.0, "fp8": 1.0},
        "attention_compute_efficiency": 1.0,
        "memory_efficiency": 1.0,
        "elementwise_memory_efficiency": 1.0,
        "nvlink_efficiency": 1.0,
        "network_efficiency": 1.0,
        "gemm_tile_m": 1,
        "kernel_launch_overhead": 0.0,
        "collective_latency": {"LL": dict(_LATENCY), "LL128": dict(_LATENCY), "Simple": dict(_LATENCY)},
        "deepep_normal_latency": 0.0,
        "deepep_low_latency_latency": 0.0,
        "deepep_normal_sms": 20,
    },
}

# An engine with no software overhead, no chunking, no running-request cap and a 1 GB reserve:
# step time = kernel time, KV capacity = HBM - 1 GB - weights.
FREE_ENGINE: dict[str, Any] = {
    "name": "free",
    "framework": "sglang",
    "version": "test",
    "overheads": {"step_fixed": 0.0, "step_cpu": 0.0, "request_cpu": 0.0, "launch_cpu": 0.0,
                  "overlap_scheduler": True, "decode_cuda_graph": False},
    "scheduler": {"chunked_prefill_tokens": [{"min_gpu_bytes": 0, "value": 0}], "mixed_batches": True,
                  "policy": "decode-first", "kv_admission": "on-demand", "page_size": 1, "prefix_cache": False},
    "memory": {"gpu_memory_utilization": 1.0, "reserved_bytes": 1e9, "reserved_per_chunk_token_bytes": 1e-9},
    "context_limit": {"beyond": "run"},
}


def run_mapping(model: dict | str = None, hardware: dict | str = None, **deployment: Any) -> dict[str, Any]:
    workload = deployment.pop("workload", {"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 16, "decode_batch_per_gpu": 4})
    dep = {"num_gpus": 1}
    dep.update(deployment)
    return {
        "model": copy.deepcopy(model if model is not None else TINY_MODEL),
        "hardware": copy.deepcopy(hardware if hardware is not None else ROUND_GPU),
        "engine": copy.deepcopy(FREE_ENGINE),
        "deployment": dep,
        "workload": workload,
    }


def make_config(model: dict | str = None, hardware: dict | str = None, overrides: tuple[str, ...] = (),
                **deployment: Any) -> RunConfig:
    return config_from_mapping(run_mapping(model, hardware, **deployment), "test", overrides)
