"""Offloaded generation: never faster than the same run with everything on the GPU; memory checks
that say what does not fit with the numbers; the prefetch schedule itself."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infersim.base.errors import ConfigError, InferSimError
from infersim.costing.host_transfer import PassUnit, prefetch_schedule
from infersim.generate.simulate import DoesNotFit

from test_generate_metrics import KV_PER_POSITION, TINY, generate, gpu, mapping

# a realistic-ish GPU: compute and memory times are not negligible next to the transfers
REAL = gpu(flops=100e12, hbm_bandwidth=1e12, peak__hbm_bytes=80e9, derates__kernel_launch_overhead=4e-6,
           derates__pcie_efficiency=0.8, host_memory_bytes=1e12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hidden=st.sampled_from([64, 256, 1024]),
    layers=st.integers(1, 4),
    batch=st.integers(1, 64),
    prompt=st.integers(1, 256),
    gen_len=st.integers(1, 5),
    offload=st.sampled_from(["weights", "kv", "weights,kv"]),
    weights=st.sampled_from(["bf16", "int8", "int4"]),
    prefetch=st.booleans(),
    device=st.sampled_from(["cpu", "nvme"]),
)
def test_offload_is_never_faster_than_all_on_gpu(hidden, layers, batch, prompt, gen_len, offload, weights, prefetch,
                                                 device):
    model = {**TINY, "hidden_size": hidden, "num_hidden_layers": layers, "head_dim": hidden // 4,
             "intermediate_size": 3 * hidden}
    common = dict(model=model, hardware=REAL, weights=weights, batch=batch, prompt_len=prompt, gen_len=gen_len)
    on_gpu = generate(mapping(**common))
    off = generate(mapping(**common, offload=offload, prefetch=prefetch, offload_device=device))
    assert off.prefill_latency_s >= on_gpu.prefill_latency_s * (1 - 1e-12)
    for o, g in zip(off.decode_steps, on_gpu.decode_steps):
        assert o.seconds >= g.seconds * (1 - 1e-12)
    assert off.total_latency_s >= on_gpu.total_latency_s * (1 - 1e-12)
    assert off.total_throughput <= on_gpu.total_throughput * (1 + 1e-12)
    # and what is offloaded leaves the GPU (quantized weights excepted: a dequantized 16-bit copy of a
    # layer can outweigh a whole tiny int4 model)
    if weights == "bf16" or offload == "kv":
        assert off.memory.peak_gpu_bytes <= on_gpu.memory.peak_gpu_bytes * (1 + 1e-12)


def test_schedule_by_hand():
    units = [PassUnit("a", compute_s=1.0, h2d_s=2.0), PassUnit("b", compute_s=1.0, h2d_s=2.0),
             PassUnit("c", compute_s=3.0, h2d_s=1.0, d2h_s=0.5)]
    # prefetch: fetches back to back (2, 4, 5); computes at 2-3, 4-5, 5-8; write-back 8-8.5
    assert prefetch_schedule(units, prefetch=True) == pytest.approx(8.5)
    # serial: fetch a 0-2, compute 2-3, fetch b 3-5, compute 5-6, fetch c 6-7, compute 7-10, back 10-10.5
    assert prefetch_schedule(units, prefetch=False) == pytest.approx(10.5)
    # two buffers: the third fetch waits until the first unit computed
    slow_compute = [PassUnit(n, compute_s=5.0, h2d_s=1.0) for n in "abc"]
    # fetch a 0-1, b 1-2; c may start when a is done (6): 6-7; computes 1-6, 6-11, 11-16
    assert prefetch_schedule(slow_compute, prefetch=True) == pytest.approx(16.0)
    assert prefetch_schedule([], prefetch=True) == 0.0


def test_gpu_memory_by_hand():
    r = generate(mapping(batch=16, prompt_len=64, gen_len=4))
    tokens = 16 * 64
    # residual stream + its normalised copy (2 x 64 x 2 B per token), plus the largest kernel's input and
    # output: the SwiGLU up projection, 64 in + 256 out, bf16
    assert r.memory.gpu_activation_bytes == tokens * (2 * 64 * 2 + (64 + 256) * 2)
    assert r.memory.gpu_kv_bytes == 16 * 68 * 2 * KV_PER_POSITION
    assert r.memory.gpu_weights_bytes == (2 * (8192 + 4096 + 16384 + 8192) + 2 * 128 * 64) * 2
    assert r.memory.peak_gpu_bytes == (r.memory.gpu_activation_bytes + r.memory.gpu_kv_bytes
                                       + r.memory.gpu_weights_bytes)


def test_batch_that_does_not_fit_the_gpu_says_so_with_numbers():
    small = gpu(peak__hbm_bytes=1e9)
    # 2048 x 512 prompt tokens: activations 896 B/token = 0.94 GB, KV 2048 x 516 x 2 layers x 128 B = 0.27 GB
    with pytest.raises(DoesNotFit) as err:
        generate(mapping(hardware=small, batch=2048, prompt_len=512, gen_len=4))
    text = str(err.value)
    assert text.startswith("does not fit (tiny, batch 2048 x 512+4 tokens): GPU memory needs 1.21 GB per GPU "
                           "(weights 0.00018 GB, KV cache 0.27 GB, activations 0.94 GB) but toy has 0.90 GB usable "
                           "(1.00 GB less 0.10 GB the toy-eager runtime reserves)")
    assert text.endswith("Try: offload the weights, or offload the KV cache, or lower the batch")
    # half the batch fits
    assert generate(mapping(hardware=small, batch=1024, prompt_len=512, gen_len=4)).memory.fits_gpu


def test_batch_that_does_not_fit_host_memory():
    # KV of 4096 sequences x (64 + 4) positions x 2 layers x 128 B = 71 MB > 10 MB of host memory
    tiny_host = gpu(host_memory_bytes=1e7)
    with pytest.raises(DoesNotFit) as err:
        generate(mapping(hardware=tiny_host, batch=4096, prompt_len=64, gen_len=4, offload="weights,kv"))
    text = str(err.value)
    assert "host memory needs 0.07 GB" in text and "gives 0.01 GB (host_memory_bytes)" in text
    assert "KV cache 0.07 GB" in text and "batch 4096 x 64+4 tokens" in text


def test_memory_accounting_of_offloaded_run():
    r = generate(mapping(batch=4, prompt_len=64, gen_len=4, offload="weights,kv"))
    layer_bytes = (8192 + 4096 + 16384 + 8192) * 2.0
    # two layer buffers on the GPU (fetching one while the other computes); KV of two layers
    assert r.memory.gpu_weights_bytes == 2 * layer_bytes
    assert r.memory.gpu_kv_bytes == 2 * 4 * 68 * 128
    assert r.memory.host_kv_bytes == 2 * 4 * 68 * 128  # both layers' KV lives in host memory
    assert r.memory.host_weights_bytes == r.memory.weights_stored_bytes == (2 * layer_bytes + 2 * 128 * 64 * 2)


@pytest.mark.parametrize("field, value, expected", [
    ("gen_len", 0, "'generate.gen_len' (value: 0): must be at least 1 token: the first generated token comes from prefill"),
    ("prompt_len", 0, "'generate.prompt_len' (value: 0): must be at least 1 token"),
    ("batch", 0, "'generate.batch' (value: 0): must be at least 1 sequence"),
    ("batch", -3, "'generate.batch' (value: -3): must be at least 1 sequence"),
    ("offload", "weights,disk", "'generate.offload[1]' (value: 'disk'): must be one of weights, kv"),
    ("offload_device", "tape", "'generate.offload_device' (value: 'tape'): must be one of cpu, nvme"),
    ("bogus", 1, "'generate.bogus' (value: 1): unknown key"),
])
def test_bad_input_is_one_clear_error(field, value, expected):
    raw = mapping(batch=2, prompt_len=8, gen_len=2)
    raw["generate"][field] = value
    with pytest.raises(ConfigError) as err:
        generate(raw)
    assert expected in str(err.value)


def test_bad_layouts_and_cards():
    raw = mapping(batch=3, prompt_len=8, gen_len=2)
    raw["deployment"].update({"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}})
    with pytest.raises(InferSimError, match=r"generate.batch.*\(value: 3\).*2 attention-DP replicas"):
        generate(raw | {"deployment": raw["deployment"] | {"attention": {"tp": 1}, "ffn": {"tp": 1}}})
    with pytest.raises(ConfigError, match="has no NVMe"):
        generate(mapping(hardware=gpu(nvme_bandwidth=0), batch=1, prompt_len=8, gen_len=2, offload="weights",
                         offload_device="nvme"))
    with pytest.raises(ConfigError, match="gives no host memory"):
        generate(mapping(hardware=gpu(host_memory_bytes=0), batch=1, prompt_len=8, gen_len=2, offload="kv"))
    no_batch = mapping(prompt_len=8, gen_len=2)
    no_batch["workload"] = {"isl": 8, "osl": 2}
    with pytest.raises(ConfigError, match="generate.batch.*not given: pass --batch"):
        generate(no_batch)


def test_overrides_reach_the_generate_section():
    r = generate(mapping(batch=2, prompt_len=8, gen_len=2), ("generate.gen_len=4", "generate.offload=kv"))
    assert r.gen_len == 4 and r.spec.offload == ("kv",)


def test_offloaded_kv_in_flight_is_two_of_the_layers_whose_kv_grows():
    """With the KV offloaded, two layers' KV is on the GPU at a time; the KV that grows with the
    context is the full-attention layers' (transformers keeps a chunk of a chunked layer), so of a
    model with 2 full layers among 8 that is all of it, not a quarter."""
    model = {**TINY, "num_hidden_layers": 8, "attention_chunk_size": 16,
             "layer_types": ["chunked_attention"] * 3 + ["full_attention"]}
    r = generate(mapping(model=model, batch=4, prompt_len=64, gen_len=4, offload="kv"))
    assert r.memory.gpu_kv_bytes == 2 * 4 * 68 * KV_PER_POSITION  # 2 full layers x 4 sequences x 68 positions
