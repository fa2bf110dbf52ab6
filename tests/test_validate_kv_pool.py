"""The KV pool vLLM reports as it starts ("GPU KV cache size: N tokens") as `validate` memory points:
the formula (infersim.run.memory.reported_pool_tokens) by hand, the points made of the public vLLM
serving runs (one per distinct server), and how the statistics keep memory apart from times.

Facts used: vLLM 0.15.1 reports num_blocks // groups x block_size, num_blocks = KV space // page
bytes // layers per group (vllm/v1/core/kv_cache_utils.py:829-843, 1285-1294), the layers of each
attention kind in groups of the smaller kind's count (the larger's where it is under 1.25 times the
smaller), the last group of a kind padded (:1017-1064). Mistral-Nemo-12B: 40 layers of 8 KV heads of
128; Llama-4 Scout: 48 layers (12 full attention, 36 chunked) of 8 KV heads of 128; bf16 KV.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from infersim.base.errors import ConfigError
from infersim.cards.deployment import Workload
from infersim.run.config import config_from_mapping
from infersim.run.memory import memory_budget, reported_pool_tokens
from infersim.validate.evaluate import Comparison, ReferencePoint, Validation, evaluate
from infersim.validate.mapping import Conversion, PointMapping
from infersim.validate.trainval import load_trainval
from infersim.validate.units import check_units

GB_1 = 1e9  # a KV space of 1 GB per GPU


def _memory(model: str, tp: int, capacity: float = GB_1):
    config = config_from_mapping({"model": model, "hardware": "h100-sxm", "engine": "vllm@0.15",
                                  "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}},
                                  "workload": {"isl": 1024, "osl": 256}}, "test")
    memory = memory_budget(config.model, config.hardware, config.deployment, Workload(isl=1024, osl=256), None,
                           config.engine, 1024)
    return replace(memory, kv_capacity_bytes=capacity), config.model, config.deployment


def test_a_dense_models_pool_is_its_kv_space_over_every_layers_kv_in_whole_blocks() -> None:
    memory, model, dep = _memory("mistral-nemo-12b", 2)
    # 4 KV heads x 128 x (K, V) x 2 bytes = 2,048 bytes a layer, 40 layers: 81,920 bytes a token;
    # 1e9 / 81,920 = 12,207.03 tokens = 762.9 blocks of 16
    assert reported_pool_tokens(memory, model, dep, 16, 1.25) == 762 * 16
    # two pipeline stages hold 20 layers each: twice the tokens (1e9 / 40,960 / 16 = 1,525.9 blocks)
    assert reported_pool_tokens(memory, model, replace(dep, pp=2), 16, 1.25) == 1525 * 16


def test_the_hybrid_allocators_groups_count_every_layer_and_their_padding() -> None:
    memory, scout, dep = _memory("llama-4-scout-fp8", 2)
    # 12 full + 36 chunked: 4 groups of 12, 48 layers of 2,048 bytes: 1e9 / 98,304 / 16 = 635.8 blocks
    assert reported_pool_tokens(memory, scout, dep, 16, 1.25) == 635 * 16
    # 20 full + 30 sliding: groups of 20, the sliding kind's second padded with 10 empty layers: 60
    # layers, 1e9 / 122,880 / 16 = 508.6 blocks
    windowed = replace(scout, attention_chunk_size=0, sliding_window=8192)
    padded = replace(windowed, num_hidden_layers=50, layer_types=("full_attention",) * 2 + ("sliding_attention",) * 3)
    assert (padded.layer_count("full_attention"), padded.layer_count("sliding_attention")) == (20, 30)
    assert reported_pool_tokens(memory, padded, dep, 16, 1.25) == 508 * 16
    # 13 full + 12 sliding, under 1.25 times apart: groups of 13, one padded: 26 layers, 1e9 / 53,248 / 16 = 1,173.8
    near = replace(windowed, num_hidden_layers=25, layer_types=("full_attention",) * 13 + ("sliding_attention",) * 12)
    assert reported_pool_tokens(memory, near, dep, 16, 1.25) == 1173 * 16


def test_no_pool_in_tokens_for_recurrent_states_or_no_space() -> None:
    memory, model, dep = _memory("qwen3-next-80b-a3b", 4)
    assert reported_pool_tokens(memory, model, dep, 16, 1.25) is None
    memory, model, dep = _memory("mistral-nemo-12b", 2, capacity=-5e9)
    assert reported_pool_tokens(memory, model, dep, 16, 1.25) == 0


def test_each_distinct_server_of_the_runs_is_one_memory_point() -> None:
    points = load_trainval()
    pools = {pid: p for pid, p in points.reference.items() if pid.endswith("-kv-pool")}
    assert sorted(pools) == [f"trainval-{e}-kv-pool" for e in ("17", "60", "61", "62", "63", "64", "65", "66", "67")]
    scout = points.mapping["trainval-17-kv-pool"]
    assert pools["trainval-17-kv-pool"].value == 8253 * 16 and pools["trainval-17-kv-pool"].unit == "tokens"
    assert scout.kind == "memory" and scout.metrics[""].source == "kv_pool_tokens"
    assert "the server of experiments 17, 20, 21, 48" in scout.why  # the same server under four workloads
    # its activations are profiled over one max_num_batched_tokens step (2,048), shared by TP 2
    assert scout.run["workload"]["prefill_tokens_per_gpu"] == 1024
    # the server's budget is its own (vLLM profiles a step of it before sizing KV), not the card's
    assert scout.overrides == ("engine.scheduler.chunked_prefill_tokens=[{min_gpu_bytes: 0, value: 2048}]",)
    assert points.mapping["trainval-62-kv-pool"].run["workload"]["prefill_tokens_per_gpu"] == 512  # 1,024 over TP 2


def test_the_dense_servers_pools_are_predicted_within_two_percent() -> None:
    """InferSim's memory accounting (weights, vLLM's 0.9 of HBM, activations of one profiled step,
    the engine's reserve) against the pools eight public vLLM servers reported: dense models of 7-70B
    on 1-4 H100s. Scout's pool is compared too; it stays out of this bound (vLLM kept 6.4 GB per GPU
    more than InferSim accounts for, with gpu_memory_utilization not stated for the run)."""
    points = load_trainval()
    wanted = [pid for pid in points.reference if pid.endswith("-kv-pool")]
    result = evaluate(points.reference, points.mapping, only=wanted)
    errors = {c.id: c.error for c in result.comparisons}
    assert len(errors) == 9 and not result.not_expressed
    dense = {pid: e for pid, e in errors.items() if pid != "trainval-17-kv-pool"}
    assert max(abs(e) for e in dense.values()) < 0.02, dense
    assert result.stats()["memory"].n == 9 and result.stats()["overall"] is None


def _comparison(pid: str, kind: str, family: str, error: float) -> Comparison:
    return Comparison(pid, pid, "S", kind, family, 100.0, 100.0 * (1 + error), "-", "-")


def test_memory_is_kept_out_of_the_times_sources_and_grades() -> None:
    result = Validation("r", "p", "t", [_comparison("a", "serving", "serving", 0.1),
                                         _comparison("b", "memory", "memory", 0.5)])
    stats = result.stats()
    assert stats["overall"].n == 1 and stats["overall"].median_abs_error == pytest.approx(0.1)
    assert stats["memory"].n == 1 and stats["memory"].median_abs_error == pytest.approx(0.5)
    assert stats["by_source"]["S"].n == 1 and set(stats["by_kind"]) == {"serving", "memory"}


def _point(unit: str = "tokens") -> tuple[dict[str, ReferencePoint], dict[str, PointMapping]]:
    run = {"model": "mistral-nemo-12b", "hardware": "h100-sxm", "engine": "sglang",
           "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}}, "workload": {"isl": 1024, "osl": 256}}
    return ({"m": ReferencePoint("m", "S", 1000.0, unit, "pool")},
            {"m": PointMapping("m", "memory", "test", {"": Conversion("kv_pool_tokens")}, run=run)})


def test_only_vllms_count_is_compared_and_its_unit_is_tokens() -> None:
    reference, mapping = _point()
    result = evaluate(reference, mapping)
    assert not result.comparisons
    assert "the KV pool as the server reports it is vLLM's count; sglang counts its own" in result.not_expressed[0].reason
    reference, mapping = _point(unit="ms")
    with pytest.raises(ConfigError, match="'kv_pool_tokens' predicts tokens"):
        check_units(reference, mapping, "ref.yaml", "points.yaml")


@pytest.mark.parametrize("engine, step", [("vllm@0.15", 8192), ("vllm@0.11", 8192), ("sglang", 500)])
def test_vllm_reserves_the_activations_of_its_whole_token_budget(engine, step) -> None:
    """vLLM profiles a step of max_num_batched_tokens before it sizes its KV space, whatever the
    workload (v1/worker/gpu_model_runner.py profile_run); SGLang reserves by its own formula."""
    config = config_from_mapping({"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": engine,
                                  "deployment": {"num_gpus": 1}, "workload": {"isl": 500, "osl": 200}}, "test")
    assert config.engine.chunk_tokens(config.hardware.peak.hbm_bytes) == 8192 or engine == "sglang"
    memory = memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine, 500)
    assert memory.prefill_step_tokens == step


def test_a_vllm_run_says_the_pool_its_server_would_log(capsys) -> None:
    """The MEMORY section gives the KV pool a vLLM server logs as it starts, to hold against a real
    one's vllm.log: Llama-3.1-8B on one H100 (32 layers x 8 KV heads x 128 x K, V x 2 bytes = 131,072
    bytes a token), its KV space over that, in whole blocks of 16."""
    import json

    from infersim.cli.main import main

    args = ["--model", "llama-3.1-8b", "--hardware", "h100", "--isl", "100", "--osl", "100", "--format", "json"]
    assert main([*args, "--engine", "vllm@0.15"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["logged_kv_pool_tokens"] == int(memory["kv_capacity_gb"] * 1e9 / 131072 / 16) * 16
    assert main([*args, "--engine", "sglang"]) == 0
    sglang = json.loads(capsys.readouterr().out)["memory"]  # SGLang logs its own count: whole tokens (pages of 1)
    assert sglang["logged_kv_pool_tokens"] == int(sglang["kv_capacity_gb"] * 1e9 / 131072)
    assert main(args[:-2] + ["--engine", "vllm@0.15"]) == 0
    assert f'KV pool as vllm logs it at start ("GPU KV cache size"): {memory["logged_kv_pool_tokens"]:,} tokens' \
        in capsys.readouterr().out


def test_vllm_033_logs_the_tokens_of_its_max_model_len_requests() -> None:
    """vLLM 0.33 logs int(blocks / blocks per max_model_len request x max_model_len): for Llama-3.1-8B
    (max_model_len 131,072, a multiple of 16) the pool's tokens; at a context of 4,095 tokens a
    request takes 256 blocks, so the count is blocks / 256 x 4,095, below the pool."""
    from infersim.run.memory import capacity_at_max_model_len, logged_pool_tokens

    config = config_from_mapping({"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "vllm@0.33",
                                  "deployment": {"num_gpus": 1}, "workload": {"isl": 100, "osl": 100}}, "test")
    model, dep, hw, engine = config.model, config.deployment, config.hardware, config.engine
    memory = memory_budget(model, hw, dep, config.workload, None, engine, 100)
    pool = reported_pool_tokens(memory, model, dep, 16, 1.5)
    assert pool is not None and pool > 100_000
    assert logged_pool_tokens(memory, model, dep, engine, hw) == pool
    short = replace(model, max_position_embeddings=4095)
    assert capacity_at_max_model_len(memory, short, dep, 16, 1.5, 16_384) == int(pool // 16 / 256 * 4095) < pool
    one_request = replace(memory, kv_capacity_bytes=255 * 16 * 131_072)  # 255 blocks of 32 layers of 4,096 bytes
    assert capacity_at_max_model_len(one_request, short, dep, 16, 1.5, 16_384) is None  # not one such request


def _gpt_oss(capacity: float):
    config = config_from_mapping({"model": "gpt-oss-120b", "hardware": "h100-sxm", "engine": "vllm@0.33",
                                  "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}},
                                  "workload": {"isl": 100, "osl": 100}}, "test")
    memory = memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine, 100)
    return replace(memory, kv_capacity_bytes=capacity), config


def test_vllm_033_counts_a_sliding_window_groups_admission_blocks() -> None:
    """gpt-oss-120b: 18 full + 18 sliding-window (128) layers of 8 KV heads of 64, two groups of 18;
    on TP2 a layer's token is 4 x 64 x 2 x 2 = 1,024 bytes, a block 18 x 1,024 x 16 = 294,912. A
    131,072-token request takes 8,192 blocks of the full group and cdiv(127 + 16,384, 16) + 1 = 1,033
    of the sliding group (two steps of 8,192 tokens in flight: async scheduling)."""
    from infersim.run.memory import capacity_at_max_model_len, logged_pool_tokens

    memory, config = _gpt_oss(40e9)
    model, dep, hw, engine = config.model, config.deployment, config.hardware, config.engine
    assert (model.layer_count("full_attention"), model.layer_count("sliding_attention"), model.sliding_window) \
        == (18, 18, 128)
    blocks = int(40e9 / 294_912)
    assert capacity_at_max_model_len(memory, model, dep, 16, 1.5, 16_384) == int(blocks / (8192 + 1033) * 131_072)
    # the card's own page, budget and in-flight steps give the same
    page, budget = engine.page_size(hw, False), engine.chunk_tokens(hw.peak.hbm_bytes)
    assert (page, budget) == (16, 8192)
    assert logged_pool_tokens(memory, model, dep, engine, hw) == int(blocks / (8192 + 1033) * 131_072)
    # a pool under one such request: the server does not start, and nothing is logged
    assert capacity_at_max_model_len(_gpt_oss(1e9)[0], model, dep, 16, 1.5, 16_384) is None


def test_vllm_033_counts_a_chunked_groups_chunk_and_in_flight_tokens() -> None:
    """Llama-4 Scout at a 65,536-token context: 12 full + 36 chunked (8,192) layers, groups of 12 (one
    full, three chunked); a request takes 4,096 blocks of the full group and cdiv(8,192 + 16,384, 16)
    = 1,536 of each chunked group; a block is 12 x 2,048 x 16 bytes on TP2."""
    from infersim.run.memory import capacity_at_max_model_len

    memory, scout, dep = _memory("llama-4-scout-fp8", 2, capacity=20e9)
    short = replace(scout, max_position_embeddings=65_536)
    blocks = int(20e9 / (12 * 2048 * 16))
    assert capacity_at_max_model_len(memory, short, dep, 16, 1.5, 16_384) == int(blocks / (4096 + 3 * 1536) * 65_536)
    # with a drafter's layers beside the groups: not reproduced
    drafted = replace(memory, draft_kv_bytes_per_token_per_gpu=1024.0)
    assert capacity_at_max_model_len(drafted, short, dep, 16, 1.5, 16_384) is None


@pytest.mark.parametrize("larger_below, full, sliding, slots", [
    (None, 13, 12, 36),   # vLLM 0.11: groups of the smaller count, 12: two full groups (one padded) and one sliding
    (1.25, 13, 12, 26),   # vLLM 0.15: 13 is under 1.25 x 12: groups of 13, the sliding one padded
    (1.25, 16, 22, 48),   # 22 is not under 1.25 x 16: groups of 16, the sliding kind's second padded
    (1.5, 16, 22, 44),    # vLLM 0.33: 22 is under 1.5 x 16: groups of 22, the full one padded
])
def test_each_vllm_version_groups_a_hybrid_models_layers_its_own_way(larger_below, full, sliding, slots) -> None:
    from infersim.run.memory import hybrid_groups

    memory, scout, dep = _memory("llama-4-scout-fp8", 2)
    model = replace(scout, attention_chunk_size=0, sliding_window=4096, num_hidden_layers=full + sliding,
                    layer_types=("full_attention",) * full + ("sliding_attention",) * sliding)
    group, groups = hybrid_groups(model, larger_below)
    assert group * sum(n for _, n in groups) == slots
    # the reported pool: 1 GB over pages of every slot's 2,048 bytes a token
    assert reported_pool_tokens(memory, model, dep, 16, larger_below) == int(GB_1 / (slots * 2048 * 16)) * 16


def test_a_model_without_attention_layers_has_no_groups() -> None:
    from infersim.run.memory import hybrid_groups

    memory, model, dep = _memory("qwen3-next-80b-a3b", 4)
    assert hybrid_groups(model, 1.5) == (12, (("full_attention", 1),))  # 12 full-attention layers, one group
    linear_only = replace(model, layer_types=("linear_attention",) * model.num_hidden_layers)
    assert hybrid_groups(linear_only, 1.5) == (0, ())


def _sglang(model: str, tp: int, engine: str = "sglang@0.5", capacity: float = GB_1):
    config = config_from_mapping({"model": model, "hardware": "h100-sxm", "engine": engine,
                                  "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}},
                                  "workload": {"isl": 1024, "osl": 256}}, "test")
    memory = memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine, 1024)
    return replace(memory, kv_capacity_bytes=capacity), config


@pytest.mark.parametrize("engine", ["sglang@0.5", "sglang@0.5.23"])
def test_sglang_logs_its_pools_tokens_in_whole_pages(engine) -> None:
    """SGLang's "max_total_num_tokens=N" (managers/scheduler.py): the KV space over a token's cells
    on one GPU, cut to whole pages. Mistral-Nemo on TP2: 40 layers x 4 KV heads x 128 x (K, V) x 2
    bytes = 81,920 bytes a token; 1 GB holds 12,207.03 tokens."""
    from infersim.run.memory import logged_pool_tokens

    memory, config = _sglang("mistral-nemo-12b", 2, engine)
    page = config.engine.page_size(config.hardware, False)
    assert page == 1
    assert logged_pool_tokens(memory, config.model, config.deployment, config.engine, config.hardware) == 12_207
    # whole pages of 64 tokens (a backend that pages so): 190 of them
    paged = replace(config.engine, scheduler=replace(config.engine.scheduler, page_size=64))
    assert paged.page_size(config.hardware, False) == 64
    assert logged_pool_tokens(memory, config.model, config.deployment, paged, config.hardware) == 190 * 64


def test_sglang_logs_a_hybrid_sliding_window_pool_in_full_layer_tokens() -> None:
    """gpt-oss-120b on TP2 under SGLang's hybrid SWA pool (swa_full_tokens_ratio 0.8): a full-layer
    token takes its 18 full layers' 1,024 bytes each and 0.8 of a token of the 18 sliding layers:
    33,177.6 bytes, so 1 GB holds 30,140 of them; with a drafter's cache beside it, no count."""
    from infersim.run.memory import logged_pool_tokens

    memory, config = _sglang("gpt-oss-120b", 2)
    args = (config.model, config.deployment, config.engine, config.hardware)
    assert memory.pool_token_bytes_per_gpu == pytest.approx(18 * 1024 * 1.8)
    assert logged_pool_tokens(memory, *args) == 30_140
    assert logged_pool_tokens(replace(memory, draft_kv_bytes_per_token_per_gpu=512.0), *args) is None


def test_the_report_names_the_line_each_engine_logs(capsys) -> None:
    from infersim.cli.main import main

    for engine, line in (("sglang@0.5", 'KV pool as sglang logs it at start ("max_total_num_tokens")'),
                         ("vllm@0.15", 'KV pool as vllm logs it at start ("GPU KV cache size")'),
                         ("trtllm", 'KV pool as trtllm logs it at start ("max tokens in paged KV cache")')):
        assert main(["--model", "mistral-nemo-12b", "--hardware", "h100", "--engine", engine, "--isl", "1000",
                     "--osl", "100"]) == 0
        out = capsys.readouterr().out
        assert line in out


def test_tensorrt_llm_logs_its_primary_pools_blocks_in_tokens() -> None:
    """TensorRT-LLM's "Allocated X GiB for max tokens in paged KV cache (N)": N = the primary pool's
    blocks x tokens_per_block 32. Mistral-Nemo on TP2, 81,920 bytes a token: 1 GB holds 381 blocks
    of 32 tokens (381.47); gpt-oss (a pool per attention window) and a drafter beside the cache are
    not reproduced."""
    from infersim.run.memory import logged_pool_tokens

    memory, config = _sglang("mistral-nemo-12b", 2, "trtllm")
    args = (config.model, config.deployment, config.engine, config.hardware)
    assert config.engine.page_size(config.hardware, False) == 32
    assert logged_pool_tokens(memory, *args) == 381 * 32
    assert logged_pool_tokens(replace(memory, draft_kv_bytes_per_token_per_gpu=512.0), *args) is None
    memory, config = _sglang("gpt-oss-120b", 2, "trtllm")
    assert logged_pool_tokens(memory, config.model, config.deployment, config.engine, config.hardware) is None
