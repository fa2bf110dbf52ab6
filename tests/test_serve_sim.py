"""Serving simulation: Little's law, token conservation, TTFT at low load, the decode-throughput bound,
trtllm-bench's heuristic, PD disaggregation and replicas."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infersim.run.config import config_from_mapping
from infersim.cards.deployment import Workload
from infersim.engine.stage import run_stage
from infersim.base.errors import InferSimError
from infersim.modules.step import build_step_plan
from infersim.shapes.plan import SequenceBatch
from infersim.serve.api import simulate_serving
from infersim.serve.settings import offline_limits
from infersim.serve.options import parse_options
from infersim.serve.simulate import simulate_serving_run, transfer_bandwidth, transfer_seconds
from infersim.run.simulate import run_prefill

FP8 = {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}


@cache
def config(engine: str = "sglang", model: str = "llama-3.1-8b", hardware: str = "h100-sxm", tp: int = 1):
    return config_from_mapping({
        "model": model, "hardware": hardware, "engine": engine,
        "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}, "precision": FP8},
        "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")  # roofline: numbers independent of tables


def assert_little(summary):
    little = summary["little"]
    assert little["mean_in_flight"] == pytest.approx(little["throughput_x_latency"], rel=0.02)


def assert_tokens_conserved(summary):
    assert summary["tokens_emitted"] == summary["total_output_tokens"]


RUNS = [
    ("sglang", {"mode": "poisson", "rate": 6, "num_requests": 300, "isl": {"dist": "lognormal", "mean": 1500, "std": 600},
                "osl": {"dist": "uniform", "min": 20, "max": 400}}),
    ("vllm", {"mode": "offline", "num_requests": 400, "isl": 1000, "osl": 300}),
    ("trtllm", {"mode": "offline", "num_requests": 400, "isl": 1000, "osl": 300}),
    ("vllm", {"mode": "concurrency", "concurrency": 64, "num_requests": 300}),
    ("sglang", {"mode": "poisson", "rate": 20, "num_requests": 300, "replicas": 3, "router": "least-loaded"}),
    ("trtllm", {"mode": "poisson", "rate": 10, "num_requests": 300, "replicas": 2, "burstiness": 0.3}),
    ("sglang", {"mode": "poisson", "rate": 8, "num_requests": 300, "disaggregate": "2P1D"}),
    ("vllm", {"mode": "poisson", "rate": 10, "num_requests": 300, "prefix_hit_rate": 0.5}),
    ("sglang", {"mode": "concurrency", "concurrency": 48, "num_requests": 300, "disaggregate": "2P1D"}),
]


@pytest.mark.parametrize("engine, options", RUNS)
def test_littles_law_and_token_conservation_in_every_mode(engine, options):
    summary = simulate_serving(config(engine), options)
    assert_little(summary)
    assert_tokens_conserved(summary)
    assert summary["completed"] == options["num_requests"]
    assert summary["mean_ttft_ms"] > 0 and summary["mean_tpot_ms"] > 0


def test_preemption_under_on_demand_admission_is_counted_and_conserves_tokens():
    # a small KV pool (most of the H100's memory taken away) forces vLLM to preempt and recompute
    cfg = config_from_mapping({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "vllm",
        "deployment": {"num_gpus": 1, "precision": FP8}, "workload": {"isl": 1000, "osl": 200}},
        "test", ["hardware.peak.hbm_bytes=20e9"])
    summary = simulate_serving(cfg, {"mode": "offline", "num_requests": 300, "isl": 500, "osl": 1500})
    assert summary["preemptions"] > 0
    assert_little(summary)
    assert_tokens_conserved(summary)
    assert summary["kv_utilization_peak"] <= 1.0


def test_ttft_far_below_capacity_is_the_stage_engines_prefill_time():
    """Isolated requests (each finishes long before the next arrives): TTFT = the stage engine's
    prefill of the prompt (run_prefill), exactly with the step-cost grid off (width 1) and within
    the grid's 2% bound with the default width."""
    cfg = config("sglang")
    prefill = run_prefill(cfg.model, cfg.hardware, cfg.deployment, Workload(isl=3000, osl=20), cfg.tables,
                          cfg.engine).step_time_s
    for width, tolerance in ((1.0, 1e-9), (1.04, 0.02)):
        result = simulate_serving_run(cfg, parse_options({"mode": "poisson", "rate": 0.01, "num_requests": 20,
                                                          "isl": 3000, "osl": 20, "bucket_width": width}))
        for r in result.records:
            assert r.first_token_s - r.req.arrival_s == pytest.approx(prefill, rel=tolerance)


@pytest.mark.parametrize("overlap", [False, True])
def test_ttft_plus_the_steps_ahead_when_the_engine_is_busy(overlap: bool):
    """An arrival while another request decodes waits for the step in flight (at most one decode
    step), then its prompt is prefilled: prefill < TTFT <= prefill + one decode step. Under an
    overlap scheduler (SGLang's card; vLLM's async scheduling alike) the next step is already formed
    when it arrives, so it also waits for that one: prefill + one decode step < TTFT <= prefill +
    two (the decode context grows a little past the 2,100 tokens priced here, hence the 2%)."""
    cfg = config("sglang")
    if not overlap:
        cfg = config_from_mapping({"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "sglang",
                                   "deployment": {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1},
                                                  "precision": FP8}, "workload": {"isl": 1000, "osl": 200}},
                                  "test", ["engine.overheads.overlap_scheduler=false"], mfu_tables="none")
    assert cfg.engine.overheads.overlap_scheduler is overlap
    prefill = run_prefill(cfg.model, cfg.hardware, cfg.deployment, Workload(isl=2000, osl=20), cfg.tables,
                          cfg.engine).step_time_s
    decode_step = run_stage(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 1, 2100),), 0),
                            cfg.hardware, cfg.tables, cfg.engine).step_time_s
    from infersim.serve.options import ServeOptions
    from infersim.serve.workload import Request
    import infersim.serve.simulate as sim

    requests = [Request(0, 0.0, 2000, 5000), Request(1, 1.0, 2000, 20), Request(2, 2.3456, 2000, 20)]
    original = sim.build_requests
    sim.build_requests = lambda config, opts: requests
    try:
        result = simulate_serving_run(cfg, ServeOptions(mode="trace", trace="x", bucket_width=1.0))
    finally:
        sim.build_requests = original
    for r in result.records[1:]:
        ttft = r.first_token_s - r.req.arrival_s
        if overlap:
            assert prefill + decode_step < ttft <= prefill + 2 * decode_step * 1.02
        else:
            assert prefill < ttft <= prefill + decode_step * 1.0001


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(["sglang", "vllm", "trtllm"]), isl=st.integers(64, 4000), osl=st.integers(2, 600))
def test_throughput_never_exceeds_decode_throughput_at_the_running_cap(engine, isl, osl):
    cfg = config(engine)
    result = simulate_serving_run(cfg, parse_options({"mode": "offline", "num_requests": 200, "isl": isl, "osl": osl}))
    settings_ = result.pools[0].settings
    cap = settings_.kv_capacity_tokens // (isl + 1)
    if settings_.max_running:
        cap = min(cap, settings_.max_running)
    cap = min(cap, 200)
    step = run_stage(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(cap, 1, isl + 1),), 0),
                     cfg.hardware, cfg.tables, cfg.engine).step_time_s
    bound = cap / step
    from infersim.serve.metrics import summarize

    summary = summarize(result)
    assert summary["output_throughput"] <= bound * 1.02  # 1.02: the step-cost grid's bound


def test_trtllm_bench_heuristic_by_hand():
    # Llama-3.1-8B FP8 on one H100, 1000/1000: KV memory (85.52e9 (81,559 MiB) - 8.03e9 params x 1 B) x 0.95 = 73.6e9 B;
    # KV per token 2 x 32 layers x 8 heads x 128 x 1 B = 65,536 B; 73.6e9 / 65,536 / 2000 = 561 requests
    # -> max_batch_size: next multiple of 128 = 640; tokens 561 x 2 = 1122 -> max(2048, ...) = 2048
    assert offline_limits(config("trtllm"), 1000, 1000) == (640, 2048)
    # 128/128: 4096-request ceiling -> 4096; tokens min(4096 x 2, 32768) = 8192 -> multiple of 1024
    assert offline_limits(config("trtllm"), 128, 128) == (4096, 8192)


def test_trtllm_offline_uses_the_bench_heuristic_and_never_preempts():
    summary = simulate_serving(config("trtllm"), {"mode": "offline", "num_requests": 1000, "isl": 1000, "osl": 1000})
    pool = summary["pools"][0]
    assert (pool["max_running_requests"], pool["token_budget"]) == (640, 2048)
    assert summary["preemptions"] == 0
    # trt10-llama3.1-8b-h100-tp1-1000-1000 measured 15,220 output tok/s (validation.yaml)
    assert 13000 < summary["output_throughput"] < 17500


def test_disaggregation_ttft_includes_the_kv_transfer():
    cfg = config("sglang")
    colocated = simulate_serving(cfg, {"mode": "poisson", "rate": 0.05, "num_requests": 10, "isl": 4000, "osl": 10,
                                       "bucket_width": 1.0})
    pd = simulate_serving(cfg, {"mode": "poisson", "rate": 0.05, "num_requests": 10, "isl": 4000, "osl": 10,
                                "bucket_width": 1.0, "disaggregate": "1P1D"})
    # 4000 tokens x 65,536 B = 262 MB over NVLink (450e9 x 0.8 B/s, both instances in one node) = 0.728 ms
    assert pd["mean_ttft_ms"] - colocated["mean_ttft_ms"] == pytest.approx(4000 * 65536 / 360e9 * 1e3, rel=0.01)
    assert pd["num_gpus"] == 2
    assert [p["role"] for p in pd["pools"]] == ["prefill", "decode"]


@pytest.mark.parametrize("engine, model, tokens, moved", [
    # gpt-oss-120b: 18 full layers of 8 KV heads of 64 (1,024 B a token, K and V in fp8) move every
    # token, its 18 sliding layers the 128 tokens of their window
    ("vllm", "gpt-oss-120b", 4000, 4000 * 18 * 1024 + 18 * 128 * 1024),
    # Llama-4-Scout: 12 full layers of 8 KV heads of 128 (2,048 B a token) move every token, its 36
    # chunked layers one chunk of 8,192; vLLM 0.11 keeps (and moves) the whole context on every layer
    ("vllm@0.15", "llama-4-scout-fp8", 10000, 10000 * 12 * 2048 + 36 * 8192 * 2048),
    ("vllm@0.11", "llama-4-scout-fp8", 10000, 10000 * 48 * 2048),
    ("vllm", "llama-3.1-8b", 4000, 4000 * 65536),  # a dense model: every layer every token
])
def test_a_prompts_kv_transfer_moves_what_each_layer_keeps(engine, model, tokens, moved):
    cfg = config(engine, model, tp=2)
    bandwidth = transfer_bandwidth(cfg, cfg)[0]
    assert transfer_seconds(cfg, cfg)(tokens) * bandwidth == pytest.approx(moved, rel=1e-12)


def test_closed_loop_disaggregation_one_client_adds_only_the_kv_transfer():
    # one client: every request runs alone through prefill, the KV link and decode, as colocated but
    # for the transfer (4000 tokens x 65,536 B over NVLink at 360e9 B/s = 0.728 ms)
    cfg = config("sglang")
    opts = {"mode": "concurrency", "concurrency": 1, "num_requests": 12, "isl": 4000, "osl": 50, "bucket_width": 1.0}
    colocated = simulate_serving(cfg, opts)
    pd = simulate_serving(cfg, {**opts, "disaggregate": "1P1D"})
    transfer_ms = 4000 * 65536 / 360e9 * 1e3
    assert pd["mean_ttft_ms"] - colocated["mean_ttft_ms"] == pytest.approx(transfer_ms, rel=0.01)
    assert pd["mean_tpot_ms"] == pytest.approx(colocated["mean_tpot_ms"], rel=1e-9)
    assert pd["duration"] - colocated["duration"] == pytest.approx(12 * transfer_ms / 1e3, rel=0.01)


def test_closed_loop_disaggregation_never_exceeds_its_clients():
    summary = simulate_serving(config("sglang"), {"mode": "concurrency", "concurrency": 16, "num_requests": 120,
                                                  "isl": {"dist": "uniform", "min": 200, "max": 3000}, "osl": 80,
                                                  "disaggregate": "1P1D", "requests": True})
    spans = sorted((r["arrival_s"], r["finish_s"]) for r in summary["requests"])
    for t, _end in spans:  # at each arrival, at most 16 requests are in the system (its own included)
        assert sum(1 for a, f in spans if a <= t < f) <= 16
    # each client's next request arrives when one finishes: after the first 16, every arrival is a finish
    finishes = {round(f, 12) for _a, f in spans}
    assert all(round(a, 12) in finishes for a, _f in spans[16:])
    assert summary["completed"] == 120 and summary["little"]["mean_in_flight"] <= 16 + 1e-9


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clients=st.integers(1, 64), prefill=st.integers(1, 2), decode=st.integers(1, 2), seed=st.integers(0, 10_000),
       isl_mean=st.integers(50, 3000), osl_max=st.integers(1, 300))
def test_closed_loop_disaggregation_conserves_and_obeys_littles_law(clients, prefill, decode, seed, isl_mean, osl_max):
    summary = simulate_serving(config("sglang"), {
        "mode": "concurrency", "concurrency": clients, "num_requests": 100, "seed": seed,
        "disaggregate": f"{prefill}P{decode}D", "isl": {"dist": "lognormal", "mean": isl_mean, "std": isl_mean / 2},
        "osl": {"dist": "uniform", "min": 1, "max": osl_max}})
    assert summary["completed"] == 100
    assert_little(summary)
    assert_tokens_conserved(summary)
    assert summary["little"]["mean_in_flight"] <= clients + 1e-9


def test_replicas_multiply_gpus_and_capacity():
    one = simulate_serving(config("trtllm"), {"mode": "offline", "num_requests": 800, "isl": 500, "osl": 100})
    four = simulate_serving(config("trtllm"), {"mode": "offline", "num_requests": 3200, "isl": 500, "osl": 100,
                                               "replicas": 4})
    assert four["num_gpus"] == 4
    assert four["output_throughput_per_gpu"] == pytest.approx(one["output_throughput_per_gpu"], rel=0.02)


def test_summary_uses_vllm_bench_serve_names():
    summary = simulate_serving(config("vllm"), {"mode": "poisson", "rate": 5, "num_requests": 50,
                                                "slo": {"ttft_ms": 500, "tpot_ms": 50}, "requests": True})
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p90_e2el_ms", "output_throughput",
                "request_throughput", "total_token_throughput", "output_throughput_per_gpu", "request_goodput",
                "duration", "completed", "total_input_tokens", "total_output_tokens"):
        assert key in summary, key
    assert summary["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert len(summary["requests"]) == 50
    assert summary["mean_itl_ms"] == pytest.approx(summary["mean_tpot_ms"], rel=0.2)


@pytest.mark.parametrize("options, message", [
    ({"mode": "poisson", "rate": 0}, "positive number of requests per second"),
    ({"mode": "poisson"}, "needs a rate"),
    ({"mode": "poisson", "rate": 1, "isl": -3}, "whole number of tokens >= 1"),
    ({"mode": "concurrency", "concurrency": 0}, "concurrency must be a whole number >= 1"),
    ({"mode": "offline", "disaggregate": "3X1D"}, "expected xPyD"),
    ({"mode": "offline", "bogus": 1}, "unknown key"),
])
def test_bad_options_get_one_clear_message(options, message):
    with pytest.raises(InferSimError, match=message):
        simulate_serving(config("sglang"), options)


def test_stretches_keep_the_loop_short():
    summary = simulate_serving(config("trtllm"), {"mode": "offline", "num_requests": 2000, "isl": 1000, "osl": 1000})
    assert summary["iterations"] < summary["steps"] / 1.5
    assert summary["pools"][0]["priced_step_shapes"] < 2000
    assert math.isfinite(summary["p99_itl_ms"])


def test_ttft_far_below_capacity_under_attention_dp_and_chunking():
    """Qwen3-30B-A3B on 4 H20s with DP attention: SGLang divides its 8192-token chunk budget by the
    DP size, so a 3000-token prompt prefills in chunks of 2048 + 952 on one rank, as run_prefill
    chunks it. The other three ranks are idle, so the EP group's experts serve one prompt, not
    four: the TTFT is the two chunk steps with the experts at a quarter of the chunk per GPU, and
    shorter than run_prefill's step, where every rank holds such a prompt."""
    cfg = config_from_mapping({"model": "qwen3-30b-a3b", "hardware": "h20", "engine": "sglang",
                               "deployment": {"num_gpus": 4, "attention": {"tp": 1, "dp": 4}, "ffn": {"tp": 1, "ep": 4}},
                               "workload": {"isl": 3000, "osl": 20}}, "test")
    prefill = run_prefill(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, cfg.tables, cfg.engine)
    assert prefill.chunks == 2
    lone = sum(run_stage(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, q, kv),), 0,
                                         expert_tokens_per_gpu=q / 4), cfg.hardware, cfg.tables, cfg.engine).step_time_s
               for q, kv in ((2048, 2048), (952, 3000)))
    assert lone < 0.9 * prefill.step_time_s
    result = simulate_serving_run(cfg, parse_options({"mode": "poisson", "rate": 0.01, "num_requests": 5,
                                                      "isl": 3000, "osl": 20, "bucket_width": 1.0}))
    for r in result.records:
        assert r.first_token_s - r.req.arrival_s == pytest.approx(lone, rel=1e-9)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(["sglang", "vllm", "trtllm"]), rate=st.floats(0.5, 60), seed=st.integers(0, 10_000),
       isl_mean=st.integers(50, 3000), osl_max=st.integers(2, 500), replicas=st.integers(1, 3))
def test_littles_law_and_conservation_hold_for_any_open_loop(engine, rate, seed, isl_mean, osl_max, replicas):
    summary = simulate_serving(config(engine), {
        "mode": "poisson", "rate": rate, "num_requests": 120, "seed": seed, "replicas": replicas,
        "isl": {"dist": "lognormal", "mean": isl_mean, "std": isl_mean / 2}, "osl": {"dist": "uniform", "min": 1,
                                                                                       "max": osl_max}})
    assert_little(summary)
    assert_tokens_conserved(summary)
    assert summary["p99_ttft_ms"] >= summary["median_ttft_ms"] > 0


def test_shared_prefixes_are_served_from_the_cache(tmp_path):
    import json

    path = tmp_path / "chat.jsonl"
    rows = [{"arrival_s": 10.0 * i, "input_tokens": 4000, "output_tokens": 10, "prefix_id": "system",
             "prefix_tokens": 3000} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = simulate_serving(config("vllm"), {"mode": "trace", "trace": str(path), "requests": True})
    cached = [r["cached_tokens"] for r in summary["requests"]]
    ttft = [r["ttft_ms"] for r in summary["requests"]]
    assert cached == [0, 2992, 2992, 2992]  # whole 16-token pages of the 3000 shared tokens
    assert ttft[1] < ttft[0] / 2
    off = simulate_serving(config("vllm"), {"mode": "trace", "trace": str(path), "prefix_cache": False})
    assert off["mean_ttft_ms"] == pytest.approx(ttft[0], rel=0.01)


def test_unequal_dp_ranks_give_the_experts_the_mean_and_the_exchange_the_busiest():
    """One rank prefills 4000 tokens while three decode 50 each (DP4, EP4): each GPU's experts get
    (4000 + 150) / 4 tokens of the group; the busiest rank still sends its 4000 tokens."""
    cfg = config_from_mapping({"model": "qwen3-30b-a3b", "hardware": "h20", "engine": "sglang",
                               "deployment": {"num_gpus": 4, "attention": {"tp": 1, "dp": 4}, "ffn": {"tp": 1, "ep": 4},
                                              "moe": {"load_balance": "ideal"}, "moe_comm": "all-to-all"},
                               "workload": {"isl": 4000, "osl": 20}}, "test")
    seqs = (SequenceBatch(1, 4000, 4000), SequenceBatch(50, 1, 4000))
    plan = build_step_plan(cfg.model, cfg.deployment, seqs, 0, expert_tokens_per_gpu=(4000 + 4 * 50) / 4)
    ops = {op.name: op.shape for op in plan.groups[0].operations}
    assert ops["experts_up"].tokens_per_gpu == pytest.approx(1050.0)
    assert ops["dispatch"].tokens == 4050
    # gathering instead (SGLang without DeepEP): every GPU holds the 4,200 real tokens of the four
    # ranks, not four times the busiest rank's 4,050, and its experts get their share
    gathered = replace(cfg.deployment, moe_comm="all-gather")
    ops = {op.name: op.shape for op in build_step_plan(cfg.model, gathered, seqs, 0, expert_tokens_per_gpu=1050)
           .groups[0].operations}
    assert ops["dp_all_gather"].bytes_per_rank == 4200 * 2048 * 2
    assert ops["router_gate"].m == 4200 and ops["experts_up"].tokens_per_gpu == pytest.approx(1050.0)
    every_rank = build_step_plan(cfg.model, cfg.deployment, seqs, 0)
    assert {op.name: op.shape for op in every_rank.groups[0].operations}["experts_up"].tokens_per_gpu == 4050
    timed = [run_stage(p, cfg.hardware, cfg.tables, cfg.engine).step_time_s for p in (plan, every_rank)]
    assert timed[0] < timed[1]


@pytest.mark.parametrize("engine, share", [("vllm", 4.0), ("sglang", 4.25)])
def test_the_kv_pool_charges_sliding_window_layers_of_a_mean_length_request(engine, share):
    """Llama-4 Maverick: 3 of every 4 layers attend within an 8,192-token window, so a 2,000-token
    request holds all its tokens in all 48 layers. vLLM's hybrid allocator gives the sliding layers
    what they hold: the pool is a quarter of what the 12 full layers alone would allow. SGLang
    0.5.23's hybrid pool allots each full-layer token 0.8 token in each of the 36 sliding layers (3.4
    full-layer tokens' worth of KV), and the request's 2,000 window tokens fill that 0.8 share first:
    2,000 / 0.8 = 2,500 pool tokens of 3.4 each, 4.25 per token of the request."""
    from infersim.run.memory import memory_budget
    from infersim.serve.settings import settings_from_engine

    cfg = config_from_mapping({"model": "llama-4-maverick", "hardware": "h200", "engine": engine,
                               "deployment": {"num_gpus": 8, "attention": {"tp": 8}, "ffn": {"tp": 8},
                                              "moe_comm": "all-gather", "precision": FP8},
                               "workload": {"isl": 1000, "osl": 1000}}, "test")
    settings = settings_from_engine(cfg, 1000, 1000, offline=False)
    step = settings.max_chunk or min(settings.token_budget, 1 << 20)  # the step the settings sized memory for
    memory = memory_budget(cfg.model, cfg.hardware, cfg.deployment, Workload(isl=1000, osl=1000, decode_batch_per_gpu=1),
                           None, cfg.engine, step)
    full_layers_only = memory.kv_capacity_bytes / memory.kv_bytes_per_token_per_gpu
    assert memory.bounded_bytes_per_request_per_gpu == pytest.approx(3 * memory.kv_bytes_per_token_per_gpu * 2000)
    assert settings.kv_capacity_tokens == pytest.approx(full_layers_only / share, rel=1e-3)


def test_attention_dp_ranks_take_whole_prompts_each_into_their_own_budget():
    """trtllm-bench without chunked context: every attention-DP rank runs its own executor with its
    own max_num_tokens, so four ranks with 3,584 tokens each take four 8,192-token prompts per step
    (each rank's first prompt runs past its budget), not one for the whole instance."""
    from dataclasses import replace

    from infersim.serve.scheduler import Instance, RequestState
    from infersim.serve.settings import SchedulerSettings
    from infersim.serve.workload import Request

    settings = SchedulerSettings(
        token_budget=4 * 3584, max_running=2048, mixed=True, policy="decode-first", admission="reserve-full",
        page_size=32, chunked=False, prefix_cache=False, kv_capacity_tokens=1 << 30, reservation=None,
        origin="test", dp_ranks=4)

    def taken(settings: SchedulerSettings, prompts: list[int], room: int) -> list[int]:
        instance = Instance(settings, coster=None)  # type: ignore[arg-type]  # _take_chunks prices nothing
        instance.prefilling = [RequestState(Request(i, 0.0, n, 10)) for i, n in enumerate(prompts)]
        return [q for _r, q in instance._take_chunks(room)]

    assert taken(settings, [8192] * 6, 4 * 3584) == [8192] * 4
    # short prompts share a rank's 3,584 tokens: 3 x 1,000 on rank 0, then the next three ranks
    assert taken(settings, [1000] * 14, 4 * 3584) == [1000] * 12
    # 40 decode requests in a mixed step leave (14,336 - 40) / 4 = 3,574 per rank: a 3,580-token prompt opens
    # each rank and nothing else fits beside it
    assert taken(settings, [3580] * 5, 4 * 3584 - 40) == [3580] * 4
    # one pooled executor (no attention DP) runs only its first prompt past the budget
    assert taken(replace(settings, dp_ranks=1), [8192] * 6, 4 * 3584) == [8192]


def test_admission_keeps_a_whole_prompt_in_reach_of_every_attention_dp_rank():
    """The same four ranks of 3,584 tokens: admission must hold one 8,192-token prompt per rank
    ready, not stop once the pending tokens exceed the pooled budget (it stopped at two, so half
    the ranks prefilled nothing: Qwen3-235B DEP4 8k/1k came out 16% slow). One pooled executor
    still stops at the pooled budget."""
    from collections import deque
    from dataclasses import replace

    from infersim.serve.scheduler import Instance, RequestState
    from infersim.serve.settings import SchedulerSettings
    from infersim.serve.workload import Request

    settings = SchedulerSettings(
        token_budget=4 * 3584, max_running=2048, mixed=True, policy="decode-first", admission="reserve-full",
        page_size=32, chunked=False, prefix_cache=False, kv_capacity_tokens=1 << 30, reservation=None,
        origin="test", dp_ranks=4)

    def admitted(settings: SchedulerSettings, prompts: list[int]) -> list[int]:
        instance = Instance(settings, coster=None)  # type: ignore[arg-type]  # admission prices nothing
        instance.waiting = deque(RequestState(Request(i, 0.0, n, 10)) for i, n in enumerate(prompts))
        instance._admit()
        return [r.prompt_total for r in instance.prefilling]

    assert admitted(settings, [8192] * 6) == [8192] * 4
    # short prompts stop at the pooled budget as before: 14 x 1,000 = 14,000 < 14,336, the 15th reaches it
    assert admitted(settings, [1000] * 20) == [1000] * 15
    # one executor: 8,192 pending < 14,336, a second prompt is admitted and the pending 16,384 reach it
    assert admitted(replace(settings, dp_ranks=1), [8192] * 6) == [8192] * 2
    # chunked prefill splits prompts over the budget: the pooled budget bounds admission
    assert admitted(replace(settings, chunked=True, max_chunk=3584), [8192] * 6) == [8192] * 2

