"""Chunked attention (Llama-4's local layers, `chunked_attention`): a query attends to the tokens of
its own chunk of `attention_chunk_size` up to itself, so the kernel runs each sequence as one
sequence per chunk its queries fall in (vLLM 0.15.1 v1/attention/backends/utils.py:219
make_local_attention_virtual_batches, whose comment gives the example below: chunk 4, q_seqlens
[4, 10, 5], k_seqlens [6, 17, 9] -> local blocks [2, 4, 2]); the layer keeps at most one chunk of KV,
or the whole context under an engine that keeps it (engine card memory.chunked_layers_keep_context).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infersim.base.errors import ConfigError
from infersim.cards.model import validate_model
from infersim.cards.deployment import Deployment, MixerDeployment
from infersim.modules.attention import attention_core, chunk_local
from infersim.run.config import config_from_mapping, load_model_card
from infersim.run.memory import bounded_bytes_per_request, cache_view, memory_budget
from infersim.shapes.kernels import AttentionShape
from infersim.shapes.plan import SequenceBatch, StageContext


def test_vllms_example_cut_by_hand() -> None:
    # positions 3..6: chunk 1-4 holds 3, 4 (2 queries over 4 keys), chunk 5-8 holds 5, 6 (2 over 2)
    assert chunk_local(SequenceBatch(1, 4, 6), 4) == [SequenceBatch(1, 2, 4), SequenceBatch(1, 2, 2)]
    # positions 8..17: 8 (1 over 4), 9-12 and 13-16 (4 over 4 each), 17 (1 over 1): 4 local blocks
    assert chunk_local(SequenceBatch(3, 10, 17), 4) == [SequenceBatch(3, 1, 4), SequenceBatch(6, 4, 4),
                                                        SequenceBatch(3, 1, 1)]
    # positions 5..9: 5-8 (4 over 4), 9 (1 over 1)
    assert chunk_local(SequenceBatch(1, 5, 9, across_tp=True), 4) == [SequenceBatch(1, 4, 4, True),
                                                                      SequenceBatch(1, 1, 1, True)]


def test_a_decode_step_reads_its_chunk_so_far() -> None:
    # context 20,000 in chunks of 8,192: the query at 20,000 sees 20,000 - 16,384 = 3,616 tokens
    assert chunk_local(SequenceBatch(8, 1, 20000), 8192) == [SequenceBatch(8, 1, 3616)]
    assert chunk_local(SequenceBatch(8, 1, 16384), 8192) == [SequenceBatch(8, 1, 8192)]  # a chunk's last token
    assert chunk_local(SequenceBatch(8, 1, 16385), 8192) == [SequenceBatch(8, 1, 1)]  # a new chunk's first


@given(st.integers(1, 40), st.integers(0, 60), st.integers(1, 9))
def test_the_parts_hold_every_query_once_and_see_only_their_chunk(q_len: int, cached: int, chunk: int) -> None:
    seqs = SequenceBatch(2, q_len, cached + q_len)
    parts = chunk_local(seqs, chunk)
    assert sum(p.count * p.q_len for p in parts) == seqs.count * q_len
    assert all(p.q_len <= p.kv_len <= chunk for p in parts)
    # the query-key pairs of the parts are those of causal attention inside each chunk, by position
    pairs = sum(p.count * AttentionShape("mha", "prefill", 1, p.q_len, p.kv_len, 1, 1, 1, 1).attended_pairs
                for p in parts)
    by_position = sum((pos - 1) % chunk + 1 for pos in range(cached + 1, cached + q_len + 1))
    assert pairs == pytest.approx(seqs.count * by_position)


def _scout():
    return load_model_card("llama-4-scout-fp8")[0]


def test_a_chunked_layers_core_is_full_attention_over_its_chunk() -> None:
    scout = _scout()
    mixer = MixerDeployment.of(Deployment(num_gpus=1))
    ctx = StageContext("decode", 4, (SequenceBatch(4, 1, 20000),), 8)
    chunked = [op.shape for op in attention_core(scout, mixer, ctx, "chunked_attention")
               if isinstance(op.shape, AttentionShape)]
    full = [op.shape for op in attention_core(scout, mixer, ctx, "full_attention") if isinstance(op.shape, AttentionShape)]
    assert [s.kv_len for s in chunked] == [3616] and chunked[0].window == 0 and [s.kv_len for s in full] == [20000]
    assert chunked[0].bytes < full[0].bytes / 5  # 3,616 of 20,000 cached tokens read


def test_a_request_keeps_at_most_one_chunk_on_a_chunked_layer() -> None:
    scout = _scout()
    per_token_layer = 8 * 128 * 2 * 2  # 8 KV heads of 128, K and V, bf16
    assert bounded_bytes_per_request(scout, "bf16", 20000) == 36 * 8192 * per_token_layer
    assert bounded_bytes_per_request(scout, "bf16", 3000) == 36 * 3000 * per_token_layer


@pytest.mark.parametrize("change, field, problem", [
    ({"attention_chunk_size": 0}, "attention_chunk_size", "chunked_attention layers need a positive chunk"),
    ({"layer_types": ("full_attention",)}, "attention_chunk_size", "no layer is chunked_attention"),
    ({"layer_types": ("chunked_attention", "sliding_attention"), "sliding_window": 128}, "layer_types",
     "sliding_attention and chunked_attention layers in one model"),
])
def test_a_card_with_chunks_is_checked(change, field, problem) -> None:
    with pytest.raises(ConfigError) as info:
        validate_model(replace(_scout(), **change), "card.yaml")
    assert info.value.field == field and problem in info.value.problem


def _scout_memory(engine: str):
    config = config_from_mapping({"model": "llama-4-scout-fp8", "hardware": "h100-sxm", "engine": engine,
                                  "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}},
                                  "workload": {"isl": 20000, "osl": 1000}}, "test")
    return memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine, 8192)


@pytest.mark.parametrize("engine, whole_context", [("vllm@0.11", True), ("vllm@0.15", False), ("sglang@0.5", True)])
def test_engines_that_keep_the_whole_context_on_chunked_layers(engine, whole_context) -> None:
    """vLLM 0.11 turns its hybrid KV cache manager off for chunked attention (0.15 keeps it on) and
    SGLang 0.5.2 leaves Llama-4 out of its hybrid pool: every layer then keeps the whole context."""
    memory = _scout_memory(engine)
    per_layer_gpu = 4 * 128 * 2 * 2  # TP 2: 4 of the 8 KV heads on each GPU
    if whole_context:
        assert memory.kv_bytes_per_token_per_gpu == 48 * per_layer_gpu and memory.bounded_bytes_per_request_per_gpu == 0
    else:  # 12 full layers grow; 36 chunked layers keep one chunk of 8,192 of the 21,000 tokens
        assert memory.kv_bytes_per_token_per_gpu == 12 * per_layer_gpu
        assert memory.bounded_bytes_per_request_per_gpu == 36 * 8192 * per_layer_gpu
    engine_card = config_from_mapping({"model": "llama-4-scout-fp8", "hardware": "h100-sxm", "engine": engine,
                                       "deployment": {"num_gpus": 1}, "workload": {"isl": 1, "osl": 1}}, "test").engine
    # the cache's view only: the layers still attend within their chunks
    assert cache_view(_scout(), engine_card).layer_count("chunked_attention") == (0 if whole_context else 36)
