"""Serving workloads: load profiles and timers, the prefix cache (by hand and emerging in runs),
shared prefixes and sessions, inference-perf profiles and the trainval stanzas, the benchmarks'
dataset flags, speculative decoding in serve, the overload guard and bounded latency samples."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from functools import cache

import pytest
import yaml

from conftest import REPO_ROOT, TEST_CACHE_DIR, shared_reference
from infersim.run.config import config_from_mapping, load_run_config
from infersim.engine.stage import run_stage
from infersim.base.errors import InferSimError
from infersim.modules.step import build_stage_plan
from infersim.serve.api import simulate_serving
from infersim.serve.prefix_cache import PrefixCache
from infersim.serve.profiles import Ramp, constant_times, ip_poisson_times, vllm_times
from infersim.serve.quantiles import EXACT_LIMIT, RELATIVE_ACCURACY, Samples
from infersim.serve.trainval import trainval_options
from infersim.base.stats import percentile

FP8 = {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}


@cache
def config(engine: str = "vllm"):
    return config_from_mapping({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": engine,
        "deployment": {"num_gpus": 1, "precision": FP8}, "workload": {"isl": 1000, "osl": 200}},
        "test", mfu_tables="none")


def shared_prefix_workload(**data) -> dict:
    return {"load": {"stages": [{"rate": 1, "num_requests": 30}]},
            "data": {"type": "shared_prefix", "num_groups": 2, "prompts_per_group": 3, "system_prompt_len": 64,
                     "question_len": 100, "output_len": 10, **data}}


# -- the prefix cache by hand ---------------------------------------------------------------------------


def serve_request(cache: PrefixCache, segments, output_key, output_tokens: int, now: float) -> int:
    """One request through the cache as an instance runs it; returns the tokens it found cached."""
    prompt = sum(length for _key, length in segments)
    found = cache.match(segments, prompt)
    cache.pin(found, now)
    path, _moved = cache.insert_prompt(found, segments, prompt, ("own", now), now)
    cache.release(path, output_key, output_tokens, now)
    return (found.gpu_blocks + found.host_blocks) * cache.block


def test_hits_follow_the_shared_prefixes_and_fall_as_lru_predicts_when_the_pool_shrinks():
    cache = PrefixCache(block_tokens=16)
    s1, s2 = ("sys", 1), ("sys", 2)
    r1 = ((s1, 64), (("q", 1), 32))
    r2 = ((s1, 64), (("q", 2), 32))
    r3 = ((s2, 64), (("q", 3), 32))
    assert serve_request(cache, r1, ("out", 1), 32, 1.0) == 0
    assert serve_request(cache, r2, ("out", 2), 32, 2.0) == 64  # the shared system prompt's 4 blocks
    assert serve_request(cache, r3, ("out", 3), 32, 3.0) == 0
    # cached: s1 4 blocks, q1 2, out1 2, q2 2, out2 2, s2 4, q3 2, out3 2 = 20 blocks, none pinned
    assert (cache.gpu_blocks, cache.pinned_blocks) == (20, 0)
    assert cache.matched_tokens(r1, 96) == 80  # all 6 blocks cached, at most (96 - 1) // 16 = 5 found
    # a pool with room for 12 blocks: least recently used leaves go first, a leaf's parent after it:
    # out1 (t=1), then q1 (t=1), out2 (t=2), q2 (t=2); s1, used last at t=2, is now a leaf
    cache.fit(12 * 16)
    assert cache.gpu_blocks == 12 and cache.evicted_blocks == 8
    assert cache.matched_tokens(r1, 96) == 64 and cache.matched_tokens(r2, 96) == 64
    assert cache.matched_tokens(r3, 96) == 80
    # 6 blocks: s1 (t=2, 4 blocks) then out3 (t=3, 2 blocks)
    cache.fit(6 * 16)
    assert cache.matched_tokens(r1, 96) == 0
    assert cache.matched_tokens(r3, 96) == 80  # s2 and q3 stay
    cache.fit(0)
    assert cache.gpu_blocks == 0 and cache.nodes == 0 and cache.matched_tokens(r3, 96) == 0


def test_pinned_blocks_are_never_evicted_and_a_host_tier_keeps_what_the_gpu_evicts():
    cache = PrefixCache(block_tokens=16, host_capacity_blocks=4)
    segments = ((("sys", 0), 64),)
    found = cache.match(segments, 100)
    cache.pin(found, 0.0)
    path, moved = cache.insert_prompt(found, segments, 100, ("own", 0), 0.0)
    assert moved == 6 * 16  # 100 tokens: sys 4 blocks + 2 of its own, pinned
    cache.fit(0)
    assert cache.gpu_blocks == 6  # all pinned: nothing to evict
    cache.release(path, None, 0, 1.0)
    cache.fit(0)
    # the GPU gives up its 6 blocks; the host tier (4 blocks) keeps the system prompt's, the own
    # tail (the leaf, evicted from the host first) is lost
    assert cache.gpu_blocks == 0 and cache.host_blocks == 4
    again = cache.match(segments + ((("q", 9), 36),), 100)
    assert (again.gpu_blocks, again.host_blocks) == (0, 4)
    assert cache.pin(again, 2.0) == 4 * 16  # brought back to the GPU, pinned
    assert (cache.gpu_blocks, cache.host_blocks) == (4, 0)


def test_a_shared_prefix_workload_hits_what_its_prompts_share():
    # 6 prompts (2 system prompts of 64 tokens, 100-token questions), 30 requests one at a time:
    # of the first 6 requests the 4 that follow their group's first hit its 4 system-prompt blocks;
    # the other 24 repeat a whole prompt and find (164 - 1) // 16 = 10 blocks
    summary = simulate_serving(config(), {"workload": shared_prefix_workload()})
    assert summary["prefix_cache_hit_rate"] == pytest.approx((4 * 64 + 24 * 160) / (30 * 164))
    assert summary["stages"][0]["prefix_cache_hit_rate"] == summary["prefix_cache_hit_rate"]
    sglang = simulate_serving(config("sglang"), {"workload": shared_prefix_workload()})
    assert sglang["prefix_cache_hit_rate"] == pytest.approx((4 * 64 + 24 * 163) / (30 * 164))  # pages of 1 token


def test_hits_fall_when_the_pool_shrinks():
    rates = [simulate_serving(config(), {"workload": shared_prefix_workload(), "kv_capacity_tokens": pool})
             ["prefix_cache_hit_rate"] for pool in (100_000, 700, 400, 200)]
    assert rates[0] == pytest.approx((4 * 64 + 24 * 160) / (30 * 164))
    assert rates[0] > rates[1] > rates[3] and rates[1] >= rates[2] >= rates[3]
    assert rates[3] < 0.2


def test_a_trace_prefix_id_is_one_segment_of_the_real_cache(tmp_path):
    # prefixes A, B, A of 3,000 tokens (187 whole 16-token blocks), prompts of 4,000, one at a time
    rows = [{"arrival_s": 10.0 * i, "input_tokens": 4000, "output_tokens": 10, "prefix_id": prefix,
             "prefix_tokens": 3000} for i, prefix in enumerate("ABA")]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    roomy = simulate_serving(config(), {"mode": "trace", "trace": str(path), "requests": True})
    assert [r["cached_tokens"] for r in roomy["requests"]] == [0, 0, 2992]
    # a pool of 4,064 tokens (254 blocks): B's 4,010 tokens (and 7.5 of page slack) leave 46.5 tokens,
    # 2 blocks, for what A left: its own tail goes first (a leaf), then its prefix from the end, so A
    # comes back to find the first 2 blocks of its prefix
    tight = simulate_serving(config(), {"mode": "trace", "trace": str(path), "requests": True,
                                        "kv_capacity_tokens": 4064})
    assert [r["cached_tokens"] for r in tight["requests"]] == [0, 0, 32]


def test_the_host_tier_keeps_what_the_pool_evicts_and_its_copy_back_delays_the_prefill(tmp_path):
    rows = [{"arrival_s": 10.0 * i, "input_tokens": 4000, "output_tokens": 10, "prefix_id": prefix,
             "prefix_tokens": 3000} for i, prefix in enumerate("ABA")]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = {"mode": "trace", "trace": str(path), "requests": True, "kv_capacity_tokens": 4064}
    gpu_only = simulate_serving(config(), options)
    tiered = simulate_serving(config(), {**options, "host_kv_tokens": 8000})
    # B evicts A's blocks to the host tier (4,000 tokens fit in 8,000): A comes back to find its
    # prefix's first 2 blocks on the GPU and the other 185 on the host
    assert [r["cached_tokens"] for r in tiered["requests"]] == [0, 0, 2992]
    assert tiered["host_cache_hit_rate"] == pytest.approx(185 * 16 / 12000)
    # FP8 KV of Llama-3.1-8B: 32 layers x 8 heads x 128 x 2 = 65,536 bytes a token over PCIe Gen5
    # (64e9 x 0.8 bytes/s): 2,960 tokens take 3.79 ms to come back
    copy = 2960 * 65536 / (64e9 * 0.8)
    assert tiered["requests"][2]["ttft_ms"] / 1e3 > copy
    assert tiered["requests"][2]["ttft_ms"] < gpu_only["requests"][2]["ttft_ms"]  # cheaper than recomputing
    with pytest.raises(InferSimError, match="host"):
        simulate_serving(config("sglang"), {**options, "host_kv_tokens": 8000, "prefix_cache": False})


def test_requests_longer_than_max_model_len_are_rejected_and_counted():
    summary = simulate_serving(config(), {"mode": "poisson", "rate": 5, "num_requests": 200, "seed": 1,
                                          "isl": {"dist": "uniform", "min": 100, "max": 4000}, "osl": 100,
                                          "max_model_len": 2100})
    assert 0 < summary["rejected"] < 200 and summary["completed"] + summary["rejected"] == 200
    assert summary["num_prompts"] == 200 and summary["failed"] == summary["rejected"]


def test_failed_is_written_when_nothing_failed_as_vllm_bench_serve_writes_it():
    summary = simulate_serving(config(), {"mode": "poisson", "rate": 2, "num_requests": 20, "seed": 1,
                                          "isl": 200, "osl": 20})
    assert summary["completed"] == 20 and summary["failed"] == 0
    assert list(summary)[list(summary).index("completed") + 1] == "failed"
    assert "rejected" not in summary and "left_waiting" not in summary


def test_an_empirical_length_file_is_drawn_from(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("# measured prompt lengths\n120, 480\n960\n")
    summary = simulate_serving(config(), {"mode": "poisson", "rate": 2, "num_requests": 300, "osl": 20,
                                          "isl": {"dist": "empirical", "file": str(path)}, "requests": True})
    assert {r["input_tokens"] for r in summary["requests"]} == {120, 480, 960}


def test_cache_aware_routing_keeps_conversations_where_their_history_is():
    workload = shared_prefix_workload(multi_turn=True)
    workload["load"] = {"timer": "constant", "stages": [{"rate": 4, "duration_s": 15}]}
    rates = {router: simulate_serving(config(), {"workload": workload, "replicas": 4, "router": router})
             ["prefix_cache_hit_rate"] for router in ("round-robin", "least-loaded", "cache-aware")}
    # round-robin sends a user's rounds to two replicas in turn (6 users, 4 replicas), least-loaded
    # wherever fewest requests are; cache-aware follows the history
    assert rates["cache-aware"] > max(rates["round-robin"], rates["least-loaded"]) + 0.05


# -- sessions -------------------------------------------------------------------------------------------


def test_inference_perf_multi_turn_rounds_carry_the_conversation_and_never_overlap():
    workload = shared_prefix_workload(multi_turn=True)
    workload["load"] = {"timer": "constant", "stages": [{"rate": 3, "duration_s": 10}]}
    summary = simulate_serving(config(), {"workload": workload, "requests": True})
    records = summary["requests"]
    assert len(records) == 30
    # user i mod 6, round i div 6: (S + Q) + r x (S + Q + O) tokens
    assert sorted({r["input_tokens"] for r in records}) == [164 + k * 174 for k in range(5)]
    by_input = {}
    for r in records:
        by_input.setdefault(r["input_tokens"], []).append(r)
    assert [len(by_input[164 + k * 174]) for k in range(5)] == [6] * 5
    ends = sorted((r["arrival_s"], r["arrival_s"] + r["e2el_ms"] / 1e3) for r in records)
    assert ends[-1][0] <= 10.0 + max(r["e2el_ms"] for r in records) / 1e3 * 5


def test_chat_sessions_wait_their_think_time_and_grow_with_their_history():
    workload = {"load": {"stages": [{"rate": 0.5, "num_requests": 3}]},
                "data": {"type": "sessions", "num_system_prompts": 1, "system_prompt_len": 200, "turns": 4,
                         "question_len": 50, "output_len": 20, "think_time_s": 5}}
    summary = simulate_serving(config(), {"workload": workload, "requests": True})
    records = sorted(summary["requests"], key=lambda r: r["id"])
    assert len(records) == 12
    assert sorted(r["input_tokens"] for r in records) == sorted([250, 320, 390, 460] * 3)
    finishes = {round(r["arrival_s"] + r["e2el_ms"] / 1e3, 9) for r in records}
    follow_ups = [r for r in records if r["input_tokens"] > 250]
    assert all(round(r["arrival_s"] - 5, 9) in finishes for r in follow_ups)
    assert summary["prefix_cache_hit_rate"] > 0.5  # every later turn finds its history


# -- inference-perf profiles and the trainval runs ------------------------------------------------------


def test_serve_reads_an_inference_perf_profile_and_reports_per_stage():
    profile = REPO_ROOT / "docs" / "examples" / "inference-perf-shared-prefix.yaml"
    out = subprocess.run([sys.executable, "-m", "infersim", "serve", "--config", "serve-llama-8b-h100.yaml",
                          "--engine", "vllm", "--workload", str(profile), "--format", "json"],
                         capture_output=True, text=True, cwd=REPO_ROOT, env={"INFERSIM_CACHE_DIR": TEST_CACHE_DIR, "PATH": ""})
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    stages = summary["stages"]
    stated = yaml.safe_load(profile.read_text())["load"]["stages"]
    assert [st["num_prompts"] for st in stages] == [int(s["rate"] * s["duration"]) for s in stated]
    for st in stages:
        for key in ("mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "p99_e2el_ms"):
            assert st[key] > 0
        assert 0 < st["prefix_cache_hit_rate"] < 1
    assert stages[1]["start_s"] == pytest.approx(stages[0]["end_s"] + 1.0)  # drained, then the 1 s interval
    notes = " ".join(summary["notes"])
    assert "load.num_workers" in notes and "server" in notes  # what it does not read is named


def test_inference_perf_distributions_keep_their_defaults_and_unknown_types_are_refused():
    from infersim.serve.inference_perf import workload_from_inference_perf

    profile = {"load": {"type": "poisson", "stages": [{"rate": 1, "duration": 5}]},
               "data": {"type": "random", "input_distribution": {"mean": 300},
                        "output_distribution": {"type": "fixed", "mean": 50.7}}}
    form = workload_from_inference_perf(profile)
    assert form["load"]["timer"] == "ip-poisson"
    assert form["data"]["input"] == {"dist": "normal", "mean": 300, "std": 200.0, "min": 10, "max": 1024}
    assert form["data"]["output"] == 50
    profile["data"]["input_distribution"] = {"type": "skew_normal", "mean": 300, "std_dev": 80, "skew": 2.5}
    assert workload_from_inference_perf(profile)["data"]["input"]["skew"] == 2.5
    profile["data"]["input_distribution"] = {"type": "zipf", "mean": 300}
    with pytest.raises(InferSimError, match="zipf"):
        workload_from_inference_perf(profile)


def test_every_trainval_experiment_runs_from_its_stated_workload_stage_by_stage():
    data = yaml.safe_load(shared_reference("vllm_serving_trainval.yaml").read_text())
    experiments = data["experiments"]
    assert len(experiments) == 13
    for experiment in experiments:
        options = trainval_options(experiment, max_stage_s=15)
        summary = simulate_serving(config(), options)
        stated = experiment["workload"]["stages"]
        assert len(summary["stages"]) == len(stated), experiment["id"]
        for st, s in zip(summary["stages"], stated):
            assert st["num_prompts"] == int(s["rate_rps"] * min(s["duration_s"], 15))
            assert st["completed"] + st["rejected"] + st["left_waiting"] == st["num_prompts"]
            assert st["completed"] > 0 and st["mean_ttft_ms"] > 0 and st["mean_itl_ms"] > 0
        assert summary["pools"][0]["kv_capacity_tokens"] == experiment["vllm"]["gpu_kv_cache_blocks"] * 16
        assert summary["pools"][0]["max_running_requests"] == experiment["vllm"]["max_num_seqs"]


# -- the benchmarks' flags and the load timers ------------------------------------------------------------


def bench_form(*flags: str) -> dict:
    from infersim.serve.bench_flags import workload_from_flags
    from infersim.serve.cli import register

    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return workload_from_flags(parser.parse_args(["serve", *flags]))


def test_random_range_ratios_follow_each_tool():
    vllm = bench_form("--dataset-name", "random", "--random-input-len", "1000", "--random-output-len", "100",
                      "--random-range-ratio", "0.25", "--random-prefix-len", "64", "--request-rate", "4")
    assert vllm["data"]["input"] == {"dist": "uniform", "min": 750, "max": 1250}
    assert vllm["data"]["output"] == {"dist": "uniform", "min": 75, "max": 125}
    assert vllm["data"]["prefix_tokens"] == 64 and vllm["load"]["timer"] == "vllm"
    sglang = bench_form("--bench-tool", "sglang", "--dataset-name", "random", "--random-input-len", "1000",
                        "--random-range-ratio", "0.25", "--request-rate", "4")
    assert sglang["data"]["input"] == {"dist": "uniform", "min": 250, "max": 1000}
    assert sglang["load"]["timer"] == "poisson"


def test_prefix_repetition_and_generated_shared_prefix_send_what_their_tools_send():
    rep = bench_form("--dataset-name", "prefix_repetition", "--prefix-repetition-num-prefixes", "4",
                     "--num-prompts", "10", "--request-rate", "2")
    summary = simulate_serving(config(), {"workload": rep})
    assert summary["num_prompts"] == 8  # 10 // 4 prompts per prefix x 4 prefixes
    gsp = bench_form("--bench-tool", "sglang", "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "3",
                     "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "256", "--gsp-question-len", "32",
                     "--gsp-output-len", "8", "--max-concurrency", "2")
    summary = simulate_serving(config("sglang"), {"workload": gsp})
    assert summary["num_prompts"] == 6 and summary["total_input_tokens"] == 6 * 288
    assert summary["prefix_cache_hit_rate"] == pytest.approx(3 * 256 / (6 * 288))  # one miss per system prompt


def test_the_timers_send_as_their_tools_do():
    times = list(constant_times(120, 60.0, random.Random(1)))
    assert len(times) == 120 and times[-1] == pytest.approx(60.0) and times == sorted(times)
    times = list(vllm_times(50, 5.0, 0.5, seed=3))
    assert times[-1] == pytest.approx(50 / 5.0)  # rescaled to end at n / rate
    ramp = list(vllm_times(2001, 1.0, 1.0, 0, Ramp("linear", 1.0, 9.0)))
    early = sum(1 for t in ramp if t < ramp[-1] / 2)
    assert early < 2001 / 2  # a rising rate sends fewer in the first half
    sent = list(ip_poisson_times(600, 4.0, random.Random(2)))
    assert len(sent) == 600 and 600 / 4.0 * 0.85 < sent[-1] < 600 / 4.0 * 1.15


def test_a_ramp_is_a_single_vllm_stage():
    with pytest.raises(InferSimError, match="ramp"):
        simulate_serving(config(), {"workload": {"load": {"stages": [{"rate": 1, "duration_s": 5}],
                                                          "ramp_up": {"strategy": "linear", "start_rps": 1,
                                                                      "end_rps": 4}},
                                                 "data": {"type": "random", "input": 100, "output": 10}}})


# -- speculative decoding ----------------------------------------------------------------------------------


def test_speculative_tpot_in_serve_is_the_stage_engines_verification_step():
    from infersim.run.speculative import expected_tokens_per_step, speculative_decode

    spec = load_run_config("qwen3-8b-speculative.yaml", ["speculative.lookahead=3", "workload.isl=1000",
                                                         "workload.osl=401", "workload.decode_batch_per_gpu=1"])
    summary = simulate_serving(spec, {"mode": "poisson", "rate": 0.01, "num_requests": 4, "isl": 1000, "osl": 401,
                                      "bucket_width": 1.0, "seed": 3})
    cfg = spec
    baseline = run_stage(build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 1,
                                          cfg.hardware.derates.deepep_normal_sms), cfg.hardware, cfg.tables, cfg.engine)
    _decode, result = speculative_decode(cfg, 1, baseline)
    expected = expected_tokens_per_step(0.7, 3)
    assert summary["pools"][0]["speculative"]["expected_tokens_per_step"] == pytest.approx(expected)
    steps = math.ceil(400 / expected)  # one verification a step, E(3) tokens each
    assert summary["mean_tpot_ms"] / 1e3 == pytest.approx(result.step_time_s * steps / 400, rel=0.02)
    plain = simulate_serving(load_run_config("qwen3-8b-speculative.yaml", ["speculative=null"]),
                             {"mode": "poisson", "rate": 0.01, "num_requests": 4, "isl": 1000, "osl": 401,
                              "bucket_width": 1.0, "seed": 3})
    assert plain["mean_tpot_ms"] / 1e3 == pytest.approx(baseline.step_time_s, rel=0.02)
    assert summary["mean_tpot_ms"] < plain["mean_tpot_ms"] / result.speedup * 1.02


# -- overload and bounded memory ----------------------------------------------------------------------------


def test_an_overloaded_run_warns_and_stays_bounded():
    summary = simulate_serving(config("sglang"), {"mode": "poisson", "rate": 40, "num_requests": 3000,
                                                  "isl": 2000, "osl": 300, "max_waiting": 200})
    load = summary["load"]
    assert load["overloaded"] and summary["warnings"] and "overloaded" in summary["warnings"][0]
    assert load["left_waiting"] > 0 and summary["completed"] + load["left_waiting"] == 3000
    assert 0 < load["saturated_capacity_rps"] < 40
    # what the run served over its whole length (its fill-up and drain included) is below the
    # saturated rate, and not far
    assert 0.7 * load["saturated_capacity_rps"] < summary["request_throughput"] < 1.05 * load["saturated_capacity_rps"]
    assert summary["p99_queue_ms"] / 1e3 < 200 / load["saturated_capacity_rps"] * 2  # the queue is bounded
    calm = simulate_serving(config("sglang"), {"mode": "poisson", "rate": 2, "num_requests": 300,
                                               "isl": 2000, "osl": 300})
    assert not calm["load"]["overloaded"] and "warnings" not in calm


def test_the_cli_warns_on_stderr():
    out = subprocess.run([sys.executable, "-m", "infersim", "serve", "--config", "serve-llama-8b-h100.yaml",
                          "--rate", "40", "--num-requests", "2000", "--isl", "2000", "--osl", "300",
                          "--max-waiting", "100"], capture_output=True, text=True, cwd=REPO_ROOT,
                         env={"INFERSIM_CACHE_DIR": TEST_CACHE_DIR, "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert "infersim: warning: overloaded" in out.stderr and "OVERLOADED" in out.stdout


def test_latency_samples_are_exact_then_within_their_stated_accuracy_in_bounded_memory():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 1.5) for _ in range(3 * EXACT_LIMIT)]
    small = Samples()
    for v in values[:1000]:
        small.add(v)
    assert small.exact and small.percentile(99) == percentile(sorted(values[:1000]), 99)
    big = Samples()
    for v in values:
        big.add(v)
    assert not big.exact and big.memory_entries() < 5000
    ordered = sorted(values)
    for q in (50, 90, 99, 99.9):
        exact = ordered[round(q / 100 * (len(ordered) - 1))]
        assert big.percentile(q) == pytest.approx(exact, rel=RELATIVE_ACCURACY * 1.01)
    assert big.mean == pytest.approx(sum(values) / len(values))


def test_a_trace_whose_requests_all_arrive_at_once_has_no_offered_rate(tmp_path, capsys) -> None:
    """A burst (every arrival at one instant) has no request rate: the load says so (null), never
    Infinity, which JSON cannot hold."""
    import json

    from infersim.cli.main import main

    trace = tmp_path / "burst.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,10\n0,100,10\n")
    assert main(["serve", "--config", "serve-llama-8b-h100.yaml", "--trace", str(trace), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert data["completed"] == 2 and data["load"]["offered_rps"] is None


def test_a_windowed_stage_counts_its_own_requests_on_a_server_already_loaded():
    """A stage of 2/s for 5 s with 5 s of the same load before and after: 10 requests counted, the
    ones sent after the lead-in's 10 (records, counts and latencies hold only them); they meet the batch
    the load keeps up, not a server starting empty and draining, so their steps are longer than
    those of the same 5 s sent alone."""
    data = {"type": "random", "input": 200, "output": 300}
    windowed = {"load": {"stages": [{"rate": 2, "duration_s": 5, "lead_s": 5, "tail_s": 5}]}, "data": data}
    alone = {"load": {"stages": [{"rate": 2, "duration_s": 5}]}, "data": data}
    out = simulate_serving(config(), {"workload": windowed, "requests": True, "seed": 3})
    plain = simulate_serving(config(), {"workload": alone, "requests": True, "seed": 3})
    stage = out["stages"][0]
    assert stage["num_prompts"] == stage["completed"] == out["completed"] == 10
    assert stage["start_s"] == 5.0
    assert sorted(r["id"] for r in out["requests"]) == list(range(10, 20))  # sent 11th to 20th of 30
    assert stage["request_throughput"] == pytest.approx(10 / 5)  # over the counted window
    # the 20 others are simulated: in the run's rates and its Little's-law integral, not in its counts
    assert out["not_counted"] == 20 and "20 requests sent in the stages' lead-ins and tails" in out["notes"][-1]
    assert out["little"]["mean_in_flight"] == pytest.approx(out["little"]["throughput_x_latency"], rel=1e-9)
    assert out["total_output_tokens"] == 10 * 300  # the counted requests' ...
    energy = out["energy"]  # ... while the energy, drawn over the whole time, is per token of all 30
    assert energy["joules_per_output_token"] == pytest.approx(energy["joules"] / (30 * 300), rel=1e-12)
    assert out["output_throughput"] == pytest.approx(30 * 300 / out["duration"], rel=1e-12)
    assert stage["itl_of_means_ms"] > plain["stages"][0]["itl_of_means_ms"]


@pytest.mark.parametrize("stage, problem", [
    ({"rate": 2, "duration_s": 5, "lead_s": -1}, "lead_s"),
    ({"rate": 2, "num_requests": 10, "tail_s": 5}, "lead_s and tail_s extend a stage of rate and duration_s"),
    ({"rate": 2, "duration_s": 5, "lead_s": 1e12}, "with lead_s and tail_s"),
])
def test_a_bad_stage_window_is_refused_in_one_line(stage, problem):
    workload = {"load": {"stages": [stage]}, "data": {"type": "random", "input": 20, "output": 2}}
    with pytest.raises(InferSimError, match=problem):
        simulate_serving(config(), {"workload": workload})


def test_a_session_started_before_a_stage_window_stays_uncounted_turn_after_turn():
    """Sessions of 4 turns at 0.5/s: a 6 s window after a 4 s lead-in counts its 3 sessions' 12 turns;
    the 2 sessions the lead-in started go on for their 4 turns each, all 8 simulated, none counted."""
    workload = {"load": {"stages": [{"rate": 0.5, "duration_s": 6, "lead_s": 4}]},
                "data": {"type": "sessions", "num_system_prompts": 1, "system_prompt_len": 200, "turns": 4,
                         "question_len": 50, "output_len": 20, "think_time_s": 5}}
    summary = simulate_serving(config(), {"workload": workload, "requests": True})
    assert summary["completed"] == len(summary["requests"]) == 12
    assert summary["not_counted"] == 8
    assert sorted(r["input_tokens"] for r in summary["requests"]) == sorted([250, 320, 390, 460] * 3)
