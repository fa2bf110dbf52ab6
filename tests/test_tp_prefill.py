"""A prompt prefilled by an attention-TP group: one sequence whose tokens the group's GPUs share
(hand-checked shapes), not one prompt per GPU."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.run.config import config_from_mapping
from infersim.modules.step import build_step_plan, prefill_sequences
from infersim.shapes.plan import SequenceBatch
from infersim.run.simulate import prefill_step_tokens, run_prefill


def llama_tp(tp: int, isl: int, **workload: int):
    return config_from_mapping({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "trtllm", "mfu_tables": "none",
        "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}},
        "workload": {"isl": isl, "osl": 2, **workload}}, "test")


def ops_of(stage):
    return {op.name: op for op in stage.operations}


def test_one_prompt_on_a_tp2_group_is_one_sequence_of_the_whole_prompt():
    cfg = llama_tp(2, 1000)
    assert prefill_step_tokens(cfg.workload, cfg.engine, cfg.hardware, cfg.deployment) == 500  # per GPU
    stage = run_prefill(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, cfg.tables, cfg.engine)
    assert stage.chunks == 1 and stage.tokens_per_gpu == 500
    from infersim.modules.step import build_stage_plan

    plan = build_stage_plan("prefill", cfg.model, cfg.deployment, cfg.workload, 500, 0)
    ops = {op.name: op.shape for op in plan.groups[0].operations}
    core = ops["attn_core"]
    # one sequence of 1000 tokens, 32 / 2 = 16 query heads and 8 / 2 = 4 KV heads on each GPU
    assert (core.batch, core.q_len, core.kv_len, core.num_heads, core.num_kv_heads) == (1, 1000, 1000, 16, 4)
    # the projections see the group's 1000 tokens (attention TP keeps every token on every GPU)
    assert ops["qkv_proj"].m == 1000 and ops["qkv_proj"].n == (32 + 2 * 8) * 128 // 2


def test_a_prompt_longer_than_the_groups_step_is_chunked_over_the_group():
    # 4 GPUs take 256 tokens each per step: a 3000-token prompt runs in ceil(3000 / 1024) = 3 chunks
    cfg = llama_tp(4, 3000, prefill_tokens_per_gpu=256)
    stage = run_prefill(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, cfg.tables, cfg.engine)
    assert stage.chunks == 3 and stage.tokens_per_gpu == 750
    last = build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 952, 3000, across_tp=True),), 0, stage="prefill")
    core = {op.name: op.shape for op in last.groups[0].operations}["attn_core"]
    assert (core.batch, core.q_len, core.kv_len) == (1, 952, 3000)
    assert last.tokens_per_gpu == 238  # 952 / 4


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 5000), isl=st.integers(1, 4000), tp=st.sampled_from([1, 2, 4, 8]))
def test_prefill_sequences_keep_the_groups_tokens(tokens: int, isl: int, tp: int):
    seqs = prefill_sequences(tokens, isl, tp)
    assert sum(s.group_count(tp) * s.q_len for s in seqs) == tokens * tp
    assert all(s.q_len <= isl for s in seqs)


def test_ttft_of_one_prompt_falls_with_more_tensor_parallel_gpus():
    ttft = [run_prefill(c.model, c.hardware, c.deployment, c.workload, c.tables, c.engine).step_time_s
            for c in (llama_tp(tp, 4096) for tp in (1, 2, 4, 8))]
    assert ttft == sorted(ttft, reverse=True)
    assert ttft[3] < 0.4 * ttft[0]  # all-reduces keep TP8 from 8x
