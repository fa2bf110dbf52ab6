"""Speculative decoding: expected tokens per step, the (k+1)-token verification, the
drafter's cost and memory, the lookahead search, and the config checks."""

from __future__ import annotations

import pytest

from core_fixtures import FREE_ENGINE, TINY_MODEL, TINY_MOE, make_config, run_mapping
from infersim.run.config import config_from_mapping, load_run_config
from infersim.base.errors import ConfigError
from infersim.run.memory import kv_bytes_per_token, memory_budget, weights_per_gpu
from infersim.cards import categories as cat
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate
from infersim.run.speculative import expected_tokens_per_step

WORKLOAD = {"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 4}
DRAFT = {**TINY_MODEL, "name": "tiny-draft", "num_hidden_layers": 1, "intermediate_size": 64}


def spec_config(speculative, model=None, hardware=None, engine=None, **deployment):
    raw = run_mapping(model if model is not None else TINY_MODEL, hardware, workload=dict(WORKLOAD), **deployment)
    raw["speculative"] = speculative
    if engine is not None:
        raw["engine"] = engine
    return config_from_mapping(raw, "test")


@pytest.mark.parametrize("a, k, expected", [
    (0.5, 3, 1 + 0.5 + 0.25 + 0.125),  # (1 - 0.5^4) / 0.5 = 1.875
    (0.8, 1, 1.8),
    (0.0, 4, 1.0),  # nothing accepted: the model's own token only
    (1.0, 4, 5.0),  # everything accepted: k drafts + the bonus token
    (0.7, 2, 1 + 0.7 + 0.49),
])
def test_expected_tokens_per_step(a, k, expected):
    assert expected_tokens_per_step(a, k) == pytest.approx(expected)


def test_verification_is_a_k_plus_one_token_decode():
    cfg = make_config(TINY_MODEL, workload=dict(WORKLOAD))
    plan = build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 4, 0, q_len=3)
    ops = {op.name: op for op in plan.groups[0].operations}
    assert ops["qkv_proj"].shape.m == 4 * 3  # every request feeds k + 1 = 3 tokens
    core = ops["attn_core"].shape
    assert (core.batch, core.q_len, core.kv_len) == (4, 3, 10 + 2)  # context 10 plus the 2 drafts
    assert core.attended_pairs == 10 + 11 + 12
    lm = {op.name: op for op in plan.per_step}["lm_head"].shape
    assert lm.m == 12  # logits at every position
    assert plan.tokens_per_gpu == 4  # still requests per GPU


def test_draft_step_composition_hand_checked():
    cfg = spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": 2, "acceptance_rate": 0.5})
    result = simulate(cfg)
    spec, decode = result.speculative, result.decode
    assert spec.lookahead == 2 and not spec.lookahead_auto
    assert spec.expected_tokens_per_step == pytest.approx(1.75)
    # verify: the model with 3 tokens per request; draft: 2 single-token steps of the draft model
    from infersim.engine.stage import run_stage

    verify = run_stage(build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 4, 20, q_len=3),
                       cfg.hardware, cfg.tables)
    draft = run_stage(build_stage_plan("decode", cfg.draft_model, cfg.draft_deployment, cfg.workload, 4, 0),
                      cfg.hardware, cfg.tables)
    assert spec.verify_time_s == pytest.approx(verify.step_time_s)
    assert spec.draft_step_time_s == pytest.approx(draft.step_time_s)  # no scheduler overhead on this GPU
    assert decode.step_time_s == pytest.approx(verify.step_time_s + 2 * draft.step_time_s)
    assert decode.tokens_per_step == pytest.approx(1.75)
    assert decode.tpot_s == pytest.approx(decode.step_time_s / 1.75) == pytest.approx(spec.tpot_s)
    assert decode.tgs == pytest.approx(4 * 1.75 / decode.step_time_s) == pytest.approx(spec.tgs)
    # the drafter's operations appear once, under the draft category, at k times their step cost
    draft_ops = [op for op in decode.operations if op.module == cat.DRAFT]
    assert sum(op.time_s for op in draft_ops) == pytest.approx(2 * draft.step_time_s)
    assert all(op.group.startswith("draft tiny-draft: ") for op in draft_ops)
    assert sum(op.time_s for op in decode.operations) == pytest.approx(decode.step_time_s)
    # TTFT includes the draft model's prefill
    assert result.prefill.step_time_s == pytest.approx(
        simulate(make_config(TINY_MODEL, workload=dict(WORKLOAD))).prefill.step_time_s + spec.prefill_draft_time_s)
    assert spec.speedup == pytest.approx(spec.baseline_tpot_s / spec.tpot_s)


def test_scheduler_overhead_is_paid_once_per_speculative_step():
    engine = {**FREE_ENGINE, "overheads": {**FREE_ENGINE["overheads"], "step_fixed": 1e-3}}
    cfg = spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": 3, "acceptance_rate": 0.5}, engine=engine)
    decode = simulate(cfg).decode
    overhead = [op for op in decode.operations if op.module == cat.OVERHEAD]
    assert len(overhead) == 1 and overhead[0].time_s == 1e-3
    assert sum(op.time_s for op in decode.operations) == pytest.approx(decode.step_time_s)


@pytest.mark.parametrize("overlap_with_speculative", [True, False])
def test_speculative_step_exposes_cpu_where_the_engine_turns_overlap_off(overlap_with_speculative):
    # SGLang sets disable_overlap_schedule for EAGLE/MTP: the speculative step then waits for the
    # scheduler's CPU work (2 ms + 4 requests x 0.1 ms); with overlap on it hides behind the GPU step
    overheads = {**FREE_ENGINE["overheads"], "step_fixed": 1e-4, "step_cpu": 2e-3, "request_cpu": 1e-4,
                 "overlap_with_speculative": overlap_with_speculative}
    engine = {**FREE_ENGINE, "overheads": overheads}
    cfg = spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": 2, "acceptance_rate": 0.5}, engine=engine)
    result = simulate(cfg)
    overhead = sum(op.time_s for op in result.decode.operations if op.module == cat.OVERHEAD)
    cpu = 2e-3 + 4 * 1e-4  # no launches: FREE_ENGINE runs decode eagerly but launch_cpu is 0
    gpu = result.speculative.verify_time_s - overhead
    if overlap_with_speculative:
        assert overhead == pytest.approx(1e-4 + max(0.0, cpu - gpu))
    else:
        assert overhead == pytest.approx(1e-4 + cpu)
    # the non-speculative baseline keeps the overlap scheduler either way: its CPU work hides
    # behind its (tiny) GPU step, and only the excess is exposed
    raw = run_mapping(TINY_MODEL, workload=dict(WORKLOAD))
    raw["engine"] = engine
    baseline = simulate(config_from_mapping(raw, "test")).decode
    baseline_gpu = sum(op.time_s for op in baseline.operations if op.module != cat.OVERHEAD)
    assert baseline.step_time_s == pytest.approx(baseline_gpu + 1e-4 + max(0.0, cpu - baseline_gpu))
    assert result.speculative.baseline_tpot_s == pytest.approx(baseline.tpot_s)


def test_sglang_turns_overlap_off_for_speculative_decoding():
    from infersim.run.config import load_engine_card

    card, _ = load_engine_card("sglang@0.5")
    assert card.overheads.overlap_scheduler and not card.overheads.overlap_with_speculative
    # SGLang 0.5.23 keeps overlapping under EAGLE ("spec v2", arg_groups/speculative_hook.py)
    for name in ("trtllm", "vllm", "vllm@0.15", "sglang@0.5.23"):
        assert load_engine_card(name)[0].overheads.overlap_with_speculative


def test_lookahead_auto_picks_the_lowest_tpot():
    cfg = spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": "auto", "acceptance_rate": 0.9,
                       "max_lookahead": 6})
    spec = simulate(cfg).speculative
    assert spec.lookahead_auto and [p.lookahead for p in spec.search] == [1, 2, 3, 4, 5, 6]
    best = min(spec.search, key=lambda p: p.tpot_s)
    assert spec.lookahead == best.lookahead and spec.tpot_s == best.tpot_s
    for p in spec.search:
        assert p.tpot_s == pytest.approx(p.step_time_s / expected_tokens_per_step(0.9, p.lookahead))
    # nothing is ever accepted: every extra draft is wasted, so the smallest k wins
    none = simulate(spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": "auto",
                                 "acceptance_rate": 0.0})).speculative
    assert none.lookahead == 1 and none.speedup < 1


def test_drafter_memory_counts_weights_and_kv():
    plain = make_config(TINY_MODEL, workload=dict(WORKLOAD))
    cfg = spec_config({"method": "draft", "draft_model": DRAFT, "lookahead": 2, "acceptance_rate": 0.5})
    mem = simulate(cfg).memory
    base = memory_budget(plain.model, plain.hardware, plain.deployment, plain.workload)
    draft_weights = weights_per_gpu(cfg.draft_model, cfg.draft_deployment)
    assert mem.draft_weights_bytes == draft_weights
    assert mem.weights_bytes == pytest.approx(base.weights_bytes + draft_weights)
    assert mem.draft_kv_bytes_per_token_per_gpu == kv_bytes_per_token(cfg.draft_model, "bf16") == 1 * 2 * 2 * 16 * 2
    assert mem.kv_bytes_per_token_per_gpu == base.kv_bytes_per_token_per_gpu + 128
    assert mem.max_batch_per_gpu == int(mem.kv_capacity_bytes // (12 * (256 + 128)))


def test_mtp_drafts_with_one_layer_of_the_model():
    mtp_model = {**TINY_MOE, "name": "tiny-mtp", "num_nextn_predict_layers": 1}
    cfg = spec_config({"method": "mtp", "lookahead": 1, "acceptance_rate": 0.8}, model=mtp_model)
    result = simulate(cfg)
    spec = result.speculative
    assert spec.drafter == "tiny-mtp MTP" and spec.expected_tokens_per_step == pytest.approx(1.8)
    draft_ops = {op.name: op for op in result.decode.operations if op.module == cat.DRAFT}
    assert {"mtp_eh_proj", "experts_up", "attn_core", "lm_head"} <= set(draft_ops)
    assert draft_ops["mtp_eh_proj"].flops == 2 * 4 * 128 * 64  # [embedding; hidden] -> hidden for 4 requests
    assert all(op.layers == 1 for op in draft_ops.values())  # one MTP layer
    # memory: the MTP layer's weights and one layer of KV per token
    assert result.memory.draft_kv_bytes_per_token_per_gpu == 1 * 2 * 2 * 16 * 2
    assert result.memory.draft_weights_bytes > 0


def test_deepseek_v32_with_mtp():
    cfg = load_run_config("deepseek-v3.2.yaml", ["speculative.method=mtp", "speculative.lookahead=1",
                                                 "speculative.acceptance_rate=0.85"])
    spec = simulate(cfg).speculative
    assert spec.draft_step_time_s < 0.1 * spec.verify_time_s  # one layer of 61 plus the LM head
    assert spec.speedup > 1.2


def test_bundled_speculative_example():
    result = simulate(load_run_config("qwen3-8b-speculative.yaml"))
    spec = result.speculative
    assert spec.method == "draft" and spec.drafter == "qwen3-0.6b" and spec.lookahead_auto
    assert 1 <= spec.lookahead <= 8 and spec.speedup > 1


@pytest.mark.parametrize("speculative, model, match", [
    ({"method": "mtp", "acceptance_rate": 0.8}, TINY_MODEL, "no MTP layers"),
    ({"method": "draft", "acceptance_rate": 0.8}, TINY_MODEL, "needs a draft model"),
    ({"method": "draft", "draft_model": {**DRAFT, "vocab_size": 256}, "acceptance_rate": 0.8}, TINY_MODEL, "vocabulary"),
    ({"method": "draft", "draft_model": DRAFT, "acceptance_rate": 1.5}, TINY_MODEL, "at most 1"),
    ({"method": "draft", "draft_model": DRAFT, "acceptance_rate": 0.5, "lookahead": 0}, TINY_MODEL, "greater than 0"),
    ({"method": "eagle", "acceptance_rate": 0.5}, TINY_MODEL, "must be one of"),
])
def test_bad_speculative_sections(speculative, model, match):
    with pytest.raises(ConfigError, match=match):
        spec_config(speculative, model=model)


def test_speculative_with_pipeline_parallelism_is_refused():
    with pytest.raises(ConfigError, match="pipeline"):
        spec_config({"method": "draft", "draft_model": DRAFT, "acceptance_rate": 0.5}, num_gpus=2, pp=2)
