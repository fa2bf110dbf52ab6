"""Whole-generation metrics on a tiny model, checked against numbers worked out by hand.

The "instant" GPU below computes in ~1e-25 s, so with weights and KV streamed over a 5 GB/s link
every pass takes exactly its transfer bytes / 5e9 plus the toy engine's per-pass overhead: each latency
can be written down from the model's matrix sizes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from infersim.run.config import config_from_mapping
from infersim.cards.deployment import Workload
from infersim.engine.stage import run_stage
from infersim.generate.simulate import GenerationResult, simulate_generation
from infersim.generate.spec import config_and_spec
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate

# hidden 64, 4 query heads, 2 KV heads of 16, SwiGLU width 128, 2 layers, vocab 128
TINY: dict[str, Any] = {
    "name": "tiny", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "intermediate_size": 128,
}
# weight elements per layer: qkv 64*(4+2*2)*16 = 8192, o 64*64 = 4096, up 64*2*128 = 16384, down 128*64 = 8192
LAYER_WEIGHTS = 8192 + 4096 + 16384 + 8192
VOCAB_WEIGHTS = 128 * 64  # embedding, and again the (untied) LM head
KV_PER_POSITION = 2 * 2 * 16 * 2  # K and V, 2 heads of 16, bf16: per layer, per sequence, per position

_LAT = {"base": 0.0, "nvlink_hop": 0.0, "network_hop": 0.0, "bandwidth_efficiency": 1.0}


def gpu(flops: float = 1e30, hbm_bandwidth: float = 1e30, **extra: Any) -> dict[str, Any]:
    card = {
        "name": "toy",
        "vendor": "nvidia",
        "peak": {"flops": {"bf16": flops, "fp16": flops, "fp8": 2 * flops}, "hbm_bytes": 1e9,
                 "hbm_bandwidth": hbm_bandwidth, "nvlink_bandwidth": 1e11, "network_bandwidth": 1e10,
                 "pcie_bandwidth": 10e9, "sm_count": 100, "l2_bytes": 1e6, "gpus_per_node": 8},
        "derates": {"compute_efficiency": {"bf16": 1.0, "fp16": 1.0, "fp8": 1.0}, "attention_compute_efficiency": 1.0,
                    "memory_efficiency": 1.0, "elementwise_memory_efficiency": 1.0, "nvlink_efficiency": 1.0, "network_efficiency": 1.0, "gemm_tile_m": 1,
                    "kernel_launch_overhead": 0.0,
                    "collective_latency": {"LL": dict(_LAT), "LL128": dict(_LAT), "Simple": dict(_LAT)},
                    "deepep_normal_latency": 0.0, "deepep_low_latency_latency": 0.0, "deepep_normal_sms": 0,
                    "pcie_efficiency": 0.5},
        "host_memory_bytes": 1e10,
        "nvme_bandwidth": 2e9,
    }
    for dotted, value in extra.items():
        node = card
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return card


OVERHEAD = 5e-4  # the toy engine's fixed cost per pass (prefill or decode step)
TOY_ENGINE: dict[str, Any] = {
    "name": "toy-eager", "framework": "huggingface", "version": "test",
    "overheads": {"step_fixed": OVERHEAD, "step_cpu": 0.0, "request_cpu": 0.0, "launch_cpu": 0.0,
                  "overlap_scheduler": False, "decode_cuda_graph": False},
    "scheduler": {"chunked_prefill_tokens": [{"min_gpu_bytes": 0, "value": 0}], "mixed_batches": False,
                  "policy": "prefill-first", "kv_admission": "reserve-full", "page_size": 1, "prefix_cache": False},
    "memory": {"gpu_memory_utilization": 1.0, "reserved_bytes": 1e8},
    "context_limit": {"beyond": "run"},
}


def mapping(model: dict | None = None, hardware: dict | None = None, weights: str = "bf16",
            **generate: Any) -> dict[str, Any]:
    return {
        "model": copy.deepcopy(model or TINY),
        "hardware": hardware or gpu(),
        "engine": copy.deepcopy(TOY_ENGINE),
        "deployment": {"num_gpus": 1, "precision": {"gemm": "bf16", "weights": weights, "kv_cache": "bf16"}},
        "workload": {"isl": 16, "osl": 4},
        "generate": generate,
    }


def generate(raw: dict[str, Any], overrides: tuple[str, ...] = ()) -> GenerationResult:
    config, gen = config_and_spec(raw, "test mapping", overrides)
    return simulate_generation(config, gen)


LINK = 10e9 * 0.5  # pcie_bandwidth x pcie_efficiency


def test_metrics_by_hand_weights_and_kv_streamed():
    batch, prompt, gen_len = 3, 16, 5
    r = generate(mapping(batch=batch, prompt_len=prompt, gen_len=gen_len, offload="weights,kv"))
    weights = (2 * LAYER_WEIGHTS + 2 * VOCAB_WEIGHTS) * 2.0  # bf16, every pass
    # prefill: the weights come in, nothing is cached yet. The prompt's KV goes back on the other link
    # direction after each layer's (instant) compute: the last layer's 3 x 16 x 128 B = 6144 B (1.23 us)
    # hides behind the LM head's fetch (128 x 64 x 2 B = 16384 B, 3.28 us), so only the fetches count.
    assert batch * prompt * KV_PER_POSITION < VOCAB_WEIGHTS * 2
    prefill = weights / LINK + OVERHEAD
    assert r.prefill_latency_s == pytest.approx(prefill, rel=1e-9)
    assert r.prefill.d2h_bytes == 2 * batch * prompt * KV_PER_POSITION
    # decode step j attends prompt + j positions and fetches the prompt + j - 1 cached ones, per layer
    steps = [weights / LINK + 2 * batch * (prompt + j - 1) * KV_PER_POSITION / LINK + OVERHEAD for j in range(1, gen_len)]
    assert [s.seconds for s in r.decode_steps] == pytest.approx(steps, rel=1e-9)
    assert [s.d2h_bytes for s in r.decode_steps] == [2 * batch * KV_PER_POSITION] * (gen_len - 1)
    assert [s.kv_len for s in r.decode_steps] == [17, 18, 19, 20]
    assert r.decode_latency_s == pytest.approx(sum(steps), rel=1e-9)
    assert r.total_latency_s == pytest.approx(prefill + sum(steps), rel=1e-9)
    assert r.prefill_throughput == pytest.approx(batch * prompt / prefill, rel=1e-9)
    assert r.decode_throughput == pytest.approx(batch * (gen_len - 1) / sum(steps), rel=1e-9)
    assert r.total_throughput == pytest.approx(batch * gen_len / (prefill + sum(steps)), rel=1e-9)
    # the benchmark's sizes
    assert r.memory.cache_bytes == 2 * 2 * batch * (prompt + gen_len) * 2 * 16 * 2  # K,V x layers x batch x seq x kv width x 2 B
    assert r.memory.hidden_bytes == batch * (prompt + gen_len) * 64 * 2
    assert r.memory.model_bytes == (2 * (LAYER_WEIGHTS + 2 * 64) + 2 * VOCAB_WEIGHTS) * 2  # norms counted too


def test_int4_weights_stream_with_group_scales():
    r = generate(mapping(weights="int4", batch=2, prompt_len=8, gen_len=2, offload="weights"))
    per_weight = 0.5 + 4 / 64  # int4 + fp16 scale and zero point per group of 64
    weights = (2 * LAYER_WEIGHTS + 2 * VOCAB_WEIGHTS) * per_weight
    assert r.prefill.h2d_bytes == pytest.approx(weights)
    assert r.prefill_latency_s == pytest.approx(weights / LINK + OVERHEAD, rel=1e-9)
    assert r.decode_latency_s == pytest.approx(weights / LINK + OVERHEAD, rel=1e-9)
    assert r.dequantize == "int4 -> bf16"


def test_nvme_weights_are_read_at_the_slower_link():
    r = generate(mapping(batch=1, prompt_len=8, gen_len=1, offload="weights", offload_device="nvme"))
    weights = (2 * LAYER_WEIGHTS + 2 * VOCAB_WEIGHTS) * 2.0
    assert r.prefill_latency_s == pytest.approx(weights / 2e9 + OVERHEAD, rel=1e-9)  # NVMe 2 GB/s < PCIe 5 GB/s
    assert r.decode_steps == () and r.decode_latency_s == 0 and r.decode_throughput is None
    assert r.total_throughput == pytest.approx(1 * 1 / r.prefill_latency_s)


def test_prefetch_overlaps_transfer_with_compute():
    """A slow GPU (compute comparable to transfer): prefetch hides one of the two, serial adds them."""
    slow = gpu(flops=1e9, hbm_bandwidth=1e12)
    serial = generate(mapping(hardware=slow, batch=4, prompt_len=8, gen_len=3, offload="weights", prefetch=False))
    overlapped = generate(mapping(hardware=slow, batch=4, prompt_len=8, gen_len=3, offload="weights", prefetch=True))
    for s, o in zip((serial.prefill, *serial.decode_steps), (overlapped.prefill, *overlapped.decode_steps)):
        assert s.seconds == pytest.approx(s.compute_s + s.h2d_s + s.overhead_s, rel=1e-9)
        assert max(o.compute_s, o.h2d_s) + o.overhead_s <= o.seconds < s.seconds


def test_decode_is_the_sum_of_steps_at_growing_kv_length():
    """Every decode step equals the core engine's decode step at that KV length; they grow with it."""
    hw = gpu(flops=100e12, hbm_bandwidth=1e12, derates__kernel_launch_overhead=0.0)
    batch, prompt, gen_len = 8, 512, 6
    r = generate(mapping(hardware=hw, batch=batch, prompt_len=prompt, gen_len=gen_len))
    config = config_from_mapping({k: v for k, v in mapping(hardware=hw).items() if k != "generate"}, "core")
    for j, step in enumerate(r.decode_steps, start=1):
        kv_len = prompt + j
        core = config_from_mapping({k: v for k, v in mapping(hardware=hw).items() if k != "generate"}, "core",
                                   [f"workload.isl={kv_len - 1}", "workload.osl=2", f"workload.decode_batch_per_gpu={batch}"])
        assert step.seconds == pytest.approx(simulate(core).decode.step_time_s, rel=1e-12)
        assert step.kv_len == kv_len
    times = [s.seconds for s in r.decode_steps]
    assert times == sorted(times) and times[-1] > times[0]  # longer KV, longer attention
    assert r.decode_latency_s == pytest.approx(sum(times), rel=1e-12)
    # the first step is not every step: timing one step for all would miss the growth
    assert r.decode_latency_s > (gen_len - 1) * times[0]
    # the core's plan builder at an explicit KV length gives the same step
    plan = build_stage_plan("decode", config.model, config.deployment, Workload(isl=prompt + 2, osl=2), batch, 0)
    assert run_stage(plan, config.hardware, config.tables, config.engine).step_time_s == pytest.approx(times[2], rel=1e-12)
    # prefill is the core prefill of batch x prompt tokens
    core = config_from_mapping({k: v for k, v in mapping(hardware=hw).items() if k != "generate"}, "core",
                               [f"workload.isl={prompt}", f"workload.prefill_tokens_per_gpu={batch * prompt}",
                                f"workload.decode_batch_per_gpu={batch}"])
    assert r.prefill_latency_s == pytest.approx(simulate(core).prefill.step_time_s, rel=1e-12)


def test_defaults_come_from_the_workload():
    raw = mapping()
    raw["workload"] = {"isl": 32, "osl": 8, "decode_batch_per_gpu": 6}
    r = generate(raw)
    assert (r.batch, r.prompt_len, r.gen_len) == (6, 32, 8)
    assert len(r.decode_steps) == 7


def test_two_gpus_split_the_batch():
    raw = mapping(batch=8, prompt_len=16, gen_len=3, offload="weights")
    raw["deployment"].update({"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}})
    two = generate(raw)
    one = generate(mapping(batch=8, prompt_len=16, gen_len=3, offload="weights"))
    # each GPU streams half the layer weights (TP shards) but the whole batch's metrics are reported
    assert two.prefill.h2d_bytes < one.prefill.h2d_bytes
    assert two.memory.cache_bytes == one.memory.cache_bytes
    assert two.total_throughput == pytest.approx(8 * 3 / two.total_latency_s)
