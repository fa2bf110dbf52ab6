"""Engine cards: validated on load, overhead composition by hand, chunked prefill and memory fit."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import FREE_ENGINE, TINY_MODEL, make_config, run_mapping
from infersim.cards.engine import EngineCard, step_overhead, validate_engine
from infersim.cards.engine_scheduler import MemoryTier, tier_value
from infersim.cards.registry import bundled_names
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.config import config_from_mapping, load_engine_card
from infersim.base.errors import ConfigError
from infersim.run.memory import memory_budget
from infersim.run.simulate import prefill_step_tokens, simulate


def engine(**overheads: float | bool) -> EngineCard:
    data = copy.deepcopy(FREE_ENGINE)
    data["overheads"].update(overheads)
    data["overheads"].setdefault("cuda_graph_max_batch", [{"min_gpu_bytes": 0, "value": 8}])
    return validate_engine(build(EngineCard, data, "test"), "test")


def test_bundled_engines_load_and_name_their_framework():
    names = bundled_names("engines")
    cards = {name: load_engine_card(name)[0] for name in names}
    assert {"sglang", "vllm", "trtllm", "huggingface"} <= {card.name for card in cards.values()}
    for name, card in cards.items():
        # a versioned card's file is NAME-VERSION (vllm-0.15.yaml), the others' NAME
        assert (name == card.name or name.startswith(f"{card.name}-")) and card.version


def test_engine_tiers_follow_gpu_memory():
    sglang, _ = load_engine_card("sglang")
    # engines.md: chunked_prefill_size 8192 on H100/H20/H200, 16384 on B200; graph batch 256 / 512
    assert sglang.chunk_tokens(80e9) == 8192 and sglang.chunk_tokens(141e9) == 8192
    assert sglang.chunk_tokens(180e9) == 16384
    assert sglang.chunk_tokens(80e9, attention_dp=4) == 2048  # divided by the DP-attention size
    assert sglang.graph_max_batch(96e9) == 256 and sglang.graph_max_batch(186e9) == 512
    vllm, _ = load_engine_card("vllm")
    assert vllm.chunk_tokens(80e9) == 8192 and vllm.max_running_requests(80e9) == 1024
    assert vllm.chunk_tokens(48e9) == 2048 and vllm.max_running_requests(48e9) == 256
    tiers = (MemoryTier(min_gpu_bytes=0, value=1), MemoryTier(min_gpu_bytes=10, value=2))
    assert tier_value(tiers, 9.9) == 1 and tier_value(tiers, 10) == 2 and tier_value((), 5) == 0


def test_overhead_by_hand():
    e = engine(step_fixed=1e-3, step_cpu=2e-3, request_cpu=1e-4, launch_cpu=1e-5, overlap_scheduler=True,
               decode_cuda_graph=True)
    # decode, 4 requests, captured (4 <= 8): CPU 2 ms + 0.4 ms; hidden behind a 10 ms GPU step
    o = step_overhead(e, "decode", 10e-3, 4, 500, 1e9)
    assert o.graph and o.eager_kernels == 0
    assert o.cpu_seconds == pytest.approx(2.4e-3) and o.seconds == pytest.approx(1e-3)
    # the same CPU work behind a 1 ms GPU step: 1.4 ms of it shows
    assert step_overhead(e, "decode", 1e-3, 4, 500, 1e9).seconds == pytest.approx(1e-3 + 1.4e-3)
    # 9 requests exceed the graph: 500 eager launches add 5 ms of CPU
    eager = step_overhead(e, "decode", 1e-3, 9, 500, 1e9)
    assert not eager.graph and eager.cpu_seconds == pytest.approx(2e-3 + 9e-4 + 5e-3)
    assert eager.seconds == pytest.approx(1e-3 + (7.9e-3 - 1e-3))
    # without an overlap scheduler the scheduler and request work add; launches still overlap the GPU
    serial = engine(step_fixed=1e-3, step_cpu=2e-3, request_cpu=1e-4, launch_cpu=1e-5, overlap_scheduler=False,
                    decode_cuda_graph=False)
    assert step_overhead(serial, "prefill", 3e-3, 2, 500, 1e9).seconds == pytest.approx(1e-3 + 2.2e-3 + 2e-3)


@settings(max_examples=60, deadline=None)
@given(gpu=st.floats(0, 1.0), requests=st.integers(0, 5000), kernels=st.integers(0, 100000),
       fixed=st.sampled_from([0.0]) | st.floats(1e-9, 0.01), cpu=st.sampled_from([0.0]) | st.floats(1e-9, 0.01),
       per=st.sampled_from([0.0]) | st.floats(1e-12, 1e-4), launch=st.sampled_from([0.0]) | st.floats(1e-12, 1e-4),
       overlap=st.booleans(), stage=st.sampled_from(["prefill", "decode"]))
def test_overhead_is_never_negative_nor_below_the_fixed_part(gpu, requests, kernels, fixed, cpu, per, launch, overlap, stage):
    e = engine(step_fixed=fixed, step_cpu=cpu, request_cpu=per, launch_cpu=launch, overlap_scheduler=overlap,
               decode_cuda_graph=True)
    o = step_overhead(e, stage, gpu, requests, kernels, 1e9)
    assert o.seconds >= fixed >= 0
    assert o.seconds <= fixed + o.cpu_seconds + 1e-15


def test_engine_card_errors_name_the_field():
    bad = copy.deepcopy(FREE_ENGINE)
    bad["scheduler"]["chunked_prefill_tokens"] = []
    with pytest.raises(ConfigError, match="scheduler.chunked_prefill_tokens"):
        validate_engine(build(EngineCard, bad, "e.yaml"), "e.yaml")
    bad = copy.deepcopy(FREE_ENGINE)
    bad["overheads"]["decode_cuda_graph"] = True
    with pytest.raises(ConfigError, match="cuda_graph_max_batch"):
        validate_engine(build(EngineCard, bad, "e.yaml"), "e.yaml")
    bad = copy.deepcopy(FREE_ENGINE)
    bad["memory"]["gpu_memory_utilization"] = 1.5
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        build(EngineCard, bad, "e.yaml")
    bad = copy.deepcopy(FREE_ENGINE)
    bad["scheduler"]["kv_admission"] = "sometimes"
    with pytest.raises(ConfigError, match="kv_admission"):
        build(EngineCard, bad, "e.yaml")


def test_run_config_picks_the_engine_and_overrides_reach_it(capsys):
    assert main(["--config", "qwen3-30b.yaml", "--set", "engine=vllm", "--format", "json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["engine"]["name"] == "vllm"
    assert main(["--config", "qwen3-30b.yaml", "--set", "engine.overheads.step_fixed=0.25", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    scheduler = next(op for op in data["decode"]["modules"] if op["name"] == "scheduler")
    assert scheduler["time_us"] == pytest.approx(0.25e6)
    assert main(["--config", "qwen3-30b.yaml", "--set", "engine=nosuchengine"]) == 2
    assert "engine 'nosuchengine' not found" in capsys.readouterr().err


def test_hardware_cards_hold_no_software_overheads(capsys):
    assert main(["--config", "qwen3-30b.yaml", "--set", "hardware.derates.decode_step_overhead=0.003"]) == 2
    assert "unknown key" in capsys.readouterr().err


WORK = {"isl": 64, "osl": 4, "decode_batch_per_gpu": 2}


def chunked_config(isl: int, budget: int):
    raw = run_mapping(TINY_MODEL, workload={**WORK, "isl": isl})
    raw["engine"]["scheduler"]["chunked_prefill_tokens"] = [{"min_gpu_bytes": 0, "value": budget}]
    return config_from_mapping(raw, "test")


def _flops(stage, name: tuple[str, ...] = (), module: str = "") -> float:
    """FLOPs of the stage's operations with one of these names, or in this module."""
    return sum(op.flops for op in stage.operations if op.name in name or (module and op.module == module))


def test_long_prompt_prefills_in_chunks_over_the_cached_prefix():
    one = simulate(chunked_config(64, 64)).prefill
    four = simulate(chunked_config(64, 16)).prefill
    assert one.chunks == 1 and four.chunks == 4
    # same GEMM work in four pieces; attention sees the prefix: chunk i attends to 16 new x (16 i + ...)
    assert _flops(four, name=("qkv_proj", "o_proj")) == pytest.approx(_flops(one, name=("qkv_proj", "o_proj")))
    assert _flops(four, module="attn_core") == pytest.approx(_flops(one, module="attn_core"))  # causal pairs add up to the same triangle
    assert four.tokens_per_gpu == 64


@settings(max_examples=25, deadline=None)
@given(isl=st.integers(1, 4000), extra=st.integers(1, 4000), budget=st.sampled_from([16, 64, 256]))
def test_ttft_grows_with_the_prompt_past_the_budget(isl, extra, budget):
    short = simulate(chunked_config(isl, budget)).prefill.step_time_s
    long = simulate(chunked_config(isl + extra, budget)).prefill.step_time_s
    assert long > short


def test_many_chunks_are_priced_on_a_sample_that_stays_exact_for_linear_growth():
    exact = simulate(chunked_config(64 * 64, 64)).prefill  # 64 chunks: every one priced
    sampled = simulate(chunked_config(64 * 128, 64)).prefill  # 128 chunks: 63 strata of ~2 full chunks + the last
    assert exact.chunks == 64 and sampled.chunks == 128
    # GEMM work is linear in tokens and must come out exactly doubled
    assert _flops(sampled, name=("qkv_proj",)) == pytest.approx(2 * _flops(exact, name=("qkv_proj",)))


@settings(max_examples=30, deadline=None)
@given(small=st.integers(1, 2000), extra=st.integers(0, 20000))
def test_larger_token_budget_never_lowers_peak_memory(small, extra):
    config = make_config(TINY_MODEL)
    m, hw, dep, wl = config.model, config.hardware, config.deployment, config.workload
    a = memory_budget(m, hw, dep, wl, None, config.engine, small)
    b = memory_budget(m, hw, dep, wl, None, config.engine, small + extra)
    assert b.reserved_bytes >= a.reserved_bytes
    assert b.kv_capacity_bytes <= a.kv_capacity_bytes


def test_running_request_cap_bounds_the_batch_and_is_named():
    raw = run_mapping(TINY_MODEL, workload=dict(WORK))
    raw["engine"]["scheduler"]["max_running_requests"] = [{"min_gpu_bytes": 0, "value": 6}]
    config = config_from_mapping(raw, "test")
    mem = simulate(config).memory
    assert mem.max_batch_per_gpu == 6 and mem.binding_limit == "running-request cap"
    assert mem.kv_fit_batch_per_gpu > 6


def test_prefill_step_tokens_respects_the_workload_then_the_engine():
    config = chunked_config(64, 16)
    assert prefill_step_tokens(config.workload, config.engine, config.hardware, config.deployment) == 16
    raw = run_mapping(TINY_MODEL, workload={**WORK, "prefill_tokens_per_gpu": 128})
    explicit = config_from_mapping(raw, "test")
    assert prefill_step_tokens(explicit.workload, explicit.engine, explicit.hardware, explicit.deployment) == 128


def test_cuda_graph_decode_pads_to_the_next_captured_batch():
    sglang, _ = load_engine_card("sglang")
    # engines.md: 1, 2, 4, 8, 12, then 16..256 step 8
    assert [sglang.graph_padded_batch(b, 96e9) for b in (1, 3, 5, 9, 13, 100, 256)] == [1, 4, 8, 12, 16, 104, 256]
    assert sglang.graph_padded_batch(300, 96e9) == 300  # beyond cuda_graph_max_bs 256: eager, no padding
    raw = run_mapping(TINY_MODEL, workload={**WORK, "decode_batch_per_gpu": 5})
    raw["engine"]["overheads"].update(decode_cuda_graph=True, cuda_graph_max_batch=[{"min_gpu_bytes": 0, "value": 8}],
                                      cuda_graph_batch_sizes=[{"start": 4, "stop": 8, "step": 4}])
    padded = simulate(config_from_mapping(raw, "test")).decode
    raw["workload"]["decode_batch_per_gpu"] = 8
    eight = simulate(config_from_mapping(raw, "test")).decode
    assert padded.padded_batch == 8 and padded.tokens_per_gpu == 5
    raw["workload"]["decode_batch_per_gpu"] = 4
    four = simulate(config_from_mapping(raw, "test")).decode
    ops = {name: {op.name: op for op in stage.operations} for name, stage in (("5", padded), ("8", eight))}
    # the graph's GEMMs compute 8 rows; its attention reads the caches of the 5 real requests only
    assert ops["5"]["qkv_proj"].time_s == pytest.approx(ops["8"]["qkv_proj"].time_s)
    assert ops["5"]["attn_core"].flops == pytest.approx(ops["8"]["attn_core"].flops * 5 / 8)
    assert four.step_time_s < padded.step_time_s < eight.step_time_s
    assert padded.tgs == pytest.approx(5 / padded.step_time_s)  # only 5 produce tokens


def test_graph_limits_count_one_schedulers_batch_not_a_gpus_share():
    """A scheduler batches the requests of one attention-TP group: its CUDA-graph limit and
    padding apply to that group's batch (tp x the per-GPU batch), and SGLang picks the limit by
    its TP size (attention TP x attention DP) too (engines.md: H100 256 below TP4, 512 from it)."""
    sglang, _ = load_engine_card("sglang@0.5")
    assert sglang.graph_max_batch(80e9, 2) == 256 and sglang.graph_max_batch(80e9, 8) == 512
    assert sglang.graph_max_batch(186e9, 1) == sglang.graph_max_batch(186e9, 8) == 512
    assert sglang.graph_max_batch(24e9, 4) == 80 and sglang.graph_max_batch(40e9, 8) == 160
    # 0.5.23 (arg_groups/memory_hook.py): the < 35 GiB tier captures 48 below TP4 (was 24), 160 from it
    newest, _ = load_engine_card("sglang@0.5.23")
    assert newest.graph_max_batch(24e9, 2) == 48 and newest.graph_max_batch(24e9, 4) == 160
    assert newest.graph_max_batch(80e9, 2) == 256 and newest.graph_max_batch(186e9, 1) == 512
    # TP8, 33 requests per GPU: the group runs 264, padded to the captured 272 = 34 per GPU
    assert sglang.graph_padded_batch(33, 96e9, group=8, engine_tp=8) == 34
    # 70 per GPU under TP8 is 560 requests, past the TP8 limit of 512: eager, unpadded
    assert sglang.graph_padded_batch(70, 96e9, group=8, engine_tp=8) == 70
    # attention DP8 (tp 1 per rank): each rank's batch is its own; the limit is the TP8 one
    assert sglang.graph_padded_batch(300, 96e9, group=1, engine_tp=8) == 304
    trtllm, _ = load_engine_card("trtllm")
    # TensorRT-LLM captures up to 128 requests: 17 per GPU under TP8 is 136, eager
    assert trtllm.graph_padded_batch(17, 80e9, group=8, engine_tp=8) == 17
    assert trtllm.graph_padded_batch(5, 80e9, group=8, engine_tp=8) == 8  # 40 -> 64 = 8 per GPU


def test_per_request_cpu_counts_the_attention_tp_groups_requests():
    """Every GPU of a TP group runs the scheduler over the group's whole batch: 4 requests per GPU
    under TP2 are 8 requests of CPU work, as on one GPU with 8."""
    e = engine(step_fixed=0.0, step_cpu=0.0, request_cpu=1e-3, launch_cpu=0.0, overlap_scheduler=False,
               decode_cuda_graph=True, cuda_graph_max_batch=[{"min_gpu_bytes": 0, "value": 1024}])
    work = {"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 16, "decode_batch_per_gpu": 4}
    raw = run_mapping(TINY_MODEL, workload=work, num_gpus=2, attention={"tp": 2}, ffn={"tp": 2})
    raw["engine"] = copy.deepcopy(FREE_ENGINE)
    raw["engine"]["overheads"].update(request_cpu=1e-3, overlap_scheduler=False, decode_cuda_graph=True,
                                      cuda_graph_max_batch=[{"min_gpu_bytes": 0, "value": 1024}])
    decode = simulate(config_from_mapping(raw, "test")).decode
    scheduler = next(op for op in decode.operations if op.name == "scheduler")
    assert scheduler.time_s == pytest.approx(8e-3)
    assert step_overhead(e, "decode", 1e-3, 8, 100, 1e9).seconds == pytest.approx(8e-3)


def test_tp_tiers_only_where_the_engine_uses_them():
    data = copy.deepcopy(FREE_ENGINE)
    data["scheduler"]["chunked_prefill_tokens"] = [{"min_gpu_bytes": 0, "value": 64},
                                                   {"min_gpu_bytes": 0, "min_tp": 4, "value": 128}]
    with pytest.raises(ConfigError, match=r"chunked_prefill_tokens\[1\]\.min_tp"):
        validate_engine(build(EngineCard, data, "test"), "test")
