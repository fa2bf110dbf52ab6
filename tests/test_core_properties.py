"""Properties that must hold for any model, layout and workload."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import TINY_MOE, make_config
from infersim.run.config import load_run_config
from infersim.run.simulate import simulate

REAL_CASES = (
    "configs/qwen3-30b.yaml",
    "benchmarks/published/qwen3-8b-h20-decode.yaml",
    "benchmarks/published/deepseek-v3-h800-decode.yaml",
    "benchmarks/published/deepseek-v3-h800-prefill.yaml",
)


@cache
def decode_time(path: str, batch: int, extra: tuple[str, ...] = ()) -> float:
    config = load_run_config(path, (f"workload.decode_batch_per_gpu={batch}", *extra))
    return simulate(config).decode.step_time_s


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(REAL_CASES), batch=st.integers(1, 200), more=st.integers(1, 200))
def test_larger_decode_batch_never_shortens_the_step(case, batch, more):
    even = 2 if "deepseek" in case else 1  # two-batch overlap splits the batch in two
    small, large = batch * even, (batch + more) * even
    assert decode_time(case, large) >= decode_time(case, small)


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(REAL_CASES),
       field=st.sampled_from(["hardware.peak.hbm_bandwidth", "hardware.peak.flops.bf16", "hardware.peak.flops.fp8",
                              "hardware.peak.nvlink_bandwidth", "hardware.peak.network_bandwidth"]),
       factor=st.floats(1.0, 8.0))
def test_faster_hardware_never_slows_a_stage(case, field, factor):
    # like with like: a changed hardware card is timed by roofline, so the base is too
    base = load_run_config(case, mfu_tables="none")
    hw = base.hardware
    current = {
        "hardware.peak.hbm_bandwidth": hw.peak.hbm_bandwidth,
        "hardware.peak.flops.bf16": hw.peak.flops["bf16"],
        "hardware.peak.flops.fp8": hw.peak.flops.get("fp8", hw.peak.flops["bf16"]),
        "hardware.peak.nvlink_bandwidth": hw.peak.nvlink_bandwidth,
        "hardware.peak.network_bandwidth": hw.peak.network_bandwidth,
    }[field]
    faster = load_run_config(case, (f"{field}={current * factor!r}",), mfu_tables="none")
    slow, fast = simulate(base), simulate(faster)
    assert fast.prefill.step_time_s <= slow.prefill.step_time_s * (1 + 1e-12)
    assert fast.decode.step_time_s <= slow.decode.step_time_s * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 64), isl=st.integers(1, 2048), osl=st.integers(1, 2048), ep=st.sampled_from([1, 2, 4, 8]))
def test_moe_step_grows_with_batch_and_throughput_is_consistent(batch, isl, osl, ep):
    wl = {"isl": isl, "osl": osl, "prefill_tokens_per_gpu": isl, "decode_batch_per_gpu": batch}
    dep = dict(num_gpus=ep, attention={"tp": 1, "dp": ep}, ffn={"ep": ep})
    small = simulate(make_config(TINY_MOE, workload=wl, **dep))
    large = simulate(make_config(TINY_MOE, workload={**wl, "decode_batch_per_gpu": batch + 1}, **dep))
    assert large.decode.step_time_s >= small.decode.step_time_s
    assert small.decode.tgs == small.decode.tokens_per_gpu / small.decode.step_time_s
    assert all(op.time_s >= 0 for op in small.decode.operations)
