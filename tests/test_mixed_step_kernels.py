"""A mixed step (prompt chunks and decode requests in one forward pass) runs each request's
attention with the kernel family of its phase: engines run the decode requests of a mixed batch
with their decode kernels (absorbed MLA, generation-phase attention, the recurrent step of linear
attention), not with the prefill kernel. Before this, a DeepSeek decode request in a mixed step was
priced as a decompressed MHA over its whole context, and one prompt among 188 decoding requests
cost twice a prefill step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.run.config import config_from_mapping
from infersim.engine.stage import run_stage
from infersim.modules.step import build_step_plan
from infersim.shapes.plan import SequenceBatch


def deepseek_dep4():
    return config_from_mapping({
        "model": "deepseek-v3", "hardware": "b200", "engine": "trtllm", "mfu_tables": "none",
        "deployment": {"num_gpus": 4, "attention": {"tp": 1, "dp": 4}, "ffn": {"tp": 1, "ep": 4},
                       "precision": {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}},
        "workload": {"isl": 8192, "osl": 1024, "decode_batch_per_gpu": 64}}, "test")


def layer_ops(plan):
    return {op.name: op.shape for op in plan.groups[-1].operations}


def step_seconds(cfg, seqs) -> float:
    plan = build_step_plan(cfg.model, cfg.deployment, seqs, 0)
    return run_stage(plan, cfg.hardware, cfg.tables, cfg.engine).step_time_s


def test_mla_mixed_step_decompresses_the_prompt_and_absorbs_the_decode_requests():
    cfg = deepseek_dep4()
    m = cfg.model
    plan = build_step_plan(m, cfg.deployment, (SequenceBatch(1, 8192, 8192), SequenceBatch(188, 1, 9000)), 0)
    ops = layer_ops(plan)
    assert plan.stage == "prefill"
    # kv_b_proj decompresses the prompt's 8192 tokens only; the 188 decode tokens go through the
    # absorption GEMMs (q_nope into the 512-wide latent, the latent output back to 128-wide values)
    assert (ops["kv_b_proj"].m, ops["kv_b_proj"].k, ops["kv_b_proj"].n) == (8192, 512, 128 * (128 + 128))
    assert (ops["q_absorb"].m, ops["q_absorb"].k, ops["q_absorb"].n) == (188, 128, 128 * 512)
    assert (ops["v_absorb"].m, ops["v_absorb"].k, ops["v_absorb"].n) == (188, 512, 128 * 128)
    prompt, decode = ops["attn_core"], ops["attn_core_1"]
    assert (prompt.kind, prompt.stage, prompt.q_len, prompt.qk_head_dim) == ("mha", "prefill", 8192, 192)
    assert (decode.kind, decode.stage, decode.batch, decode.kv_len) == ("mla", "decode", 188, 9000)
    assert (decode.qk_head_dim, decode.v_head_dim, decode.num_kv_heads) == (576, 512, 1)
    assert plan.groups[-1].operations[-1].name != "kv_b_proj"
    # the GEMMs shared by both parts see every token once
    assert ops["q_b_proj"].m == 8192 + 188


def test_pure_steps_keep_their_kernels():
    cfg = deepseek_dep4()
    prefill = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(2, 4096, 4096),), 0))
    assert "kv_b_proj" in prefill and "q_absorb" not in prefill and prefill["attn_core"].kind == "mha"
    decode = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(64, 1, 4096),), 0))
    assert "q_absorb" in decode and "kv_b_proj" not in decode and decode["attn_core"].kind == "mla"
    # a one-token prompt has nothing cached: it is a prefill, not a decode request
    single = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 1, 1),), 0, stage="prefill"))
    assert single["attn_core"].stage == "prefill" and "kv_b_proj" in single


def test_gqa_mixed_step_prices_decode_requests_with_the_decode_kernel():
    cfg = config_from_mapping({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "trtllm", "mfu_tables": "none",
        "deployment": {"num_gpus": 1}, "workload": {"isl": 2048, "osl": 128}}, "test")
    ops = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 2048, 2048), SequenceBatch(64, 1, 3000)), 0))
    assert ops["attn_core"].stage == "prefill" and ops["attn_core_1"].stage == "decode"
    assert ops["qkv_proj"].m == 2048 + 64


def test_linear_attention_mixed_step_takes_the_recurrent_step_for_decode_requests():
    cfg = config_from_mapping({
        "model": "qwen3-next-80b-a3b", "hardware": "h100-sxm", "engine": "vllm", "mfu_tables": "none",
        "deployment": {"num_gpus": 1}, "workload": {"isl": 2048, "osl": 128}}, "test")
    plan = build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 2048, 2048), SequenceBatch(32, 1, 3000)), 0)
    names = {op.name for g in plan.groups for op in g.operations}
    assert {"gdn_intra_chunk", "gdn_state", "gdn_output", "gdn_recurrent_1"} <= names
    assert "gdn_intra_chunk_1" not in names and "gdn_recurrent" not in names


@settings(max_examples=15, deadline=None)
@given(prompt=st.integers(256, 8192), decoding=st.integers(1, 512), context=st.integers(2, 16384))
def test_a_mixed_step_costs_no_more_than_its_prefill_and_decode_steps_apart(prompt: int, decoding: int, context: int):
    """One forward pass over both parts shares the weight reads and launches of two passes, so it
    never costs more than the two passes run one after the other (it did, by 2x, when decode
    requests were priced with the prefill kernel)."""
    cfg = deepseek_dep4()
    p, d = SequenceBatch(1, prompt, prompt), SequenceBatch(decoding, 1, context)
    mixed = step_seconds(cfg, (p, d))
    assert mixed <= step_seconds(cfg, (p,)) + step_seconds(cfg, (d,))
    assert mixed >= step_seconds(cfg, (p,))


def test_an_mla_chunk_decompresses_its_cached_prefix_too():
    """A prompt chunk attends to its whole context, so kv_b_proj up-projects the cached prefix's
    latents as well as the chunk's own: 8,192 new tokens on 24,576 cached ones decompress 32,768
    (per GPU of a TP2 group, its 64 heads of 128 + 128 dims)."""
    cfg = config_from_mapping({
        "model": "deepseek-v3", "hardware": "h200", "engine": "sglang", "mfu_tables": "none",
        "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}, "moe_comm": "all-gather",
                       "precision": {"gemm": "fp8", "weights": "fp8"}},
        "workload": {"isl": 32768, "osl": 2}}, "test")
    ops = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 8192, 32768, across_tp=True),), 0))
    assert (ops["kv_b_proj"].m, ops["kv_b_proj"].k, ops["kv_b_proj"].n) == (32768, 512, 64 * 256)
    assert ops["q_b_proj"].m == 8192  # the projections of new tokens see the chunk only
    first = layer_ops(build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(1, 8192, 8192, across_tp=True),), 0))
    assert first["kv_b_proj"].m == 8192
