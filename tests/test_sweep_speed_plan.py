"""Plans built through one PricingMemo (infersim.costing.memo) are exactly the plans built without
one, and priced through it they give exactly the plain pricing.

The pieces are kept on their builders' inputs (the model card, the part of the deployment and of
the stage context each builder reads), so a key that missed something would show up as a plan
built for one layout or batch being served to another. Each case first builds every plan through
one memo (the sweep's situation: pieces reused across batches, EP sizes, MoE paths and pipeline
splits), then builds each one without a memo and compares the two operation by operation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import pytest

from infersim.cards.model import ModelCard
from infersim.run.config import load_run_config
from infersim.base.errors import InferSimError
from infersim.costing import memo as memo_module
from infersim.costing.memo import PricingMemo
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.engine.stage import run_stage, stage_time
from infersim.shapes.plan import SequenceBatch, StagePlan
from infersim.run.simulate import _decode_plan

CASES = [
    ("qwen3-30b.yaml", [[], ["deployment.ffn.ep=2"], ["deployment.ffn.ep=1", "deployment.ffn.tp=4"],
                        ["deployment.moe_comm=deepep-low-latency"], ["deployment.moe_comm=all-gather"],
                        ["deployment.attention.tp=2", "deployment.attention.dp=0"],
                        ["deployment.overlap=two-batch", "deployment.moe_comm=deepep-normal"],
                        ["deployment.num_gpus=8", "deployment.pp=2", "deployment.attention.dp=0"],
                        ["deployment.num_gpus=8", "deployment.ffn.ep=8", "deployment.attention.dp=0"],
                        # the same layout on nodes of 8 and of 4 GPUs (ranks per node differ)
                        ["deployment.num_gpus=16", "deployment.num_nodes=2", "deployment.ffn.ep=8", "deployment.attention.dp=0"],
                        ["deployment.num_gpus=16", "deployment.num_nodes=4", "deployment.ffn.ep=8", "deployment.attention.dp=0"],
                        ["deployment.moe.load_balance=ideal"], ["deployment.moe.dataset_skew=1.2"],
                        ["deployment.precision.gemm=fp8"], ["deployment.precision.kv_cache=fp8"],
                        ["engine=trtllm"]]),
    ("qwen3-30b.yaml", [["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.dp=0"],
                        ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.dp=0", "deployment.pp=2"],
                        ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.tp=2", "deployment.attention.dp=0"]]),
    ("qwen3-next.yaml", [[], ["deployment.overlap=two-batch"]]),
    ("deepseek-v3.2.yaml", [[], ["deployment.moe_comm=all-to-all"]]),
    ("gpt-oss-120b.yaml", [[], ["deployment.moe_comm=deepep-low-latency"], ["deployment.precision.kv_cache=fp8"]]),
]


Builder = Callable[[PricingMemo | None], StagePlan]


def _builders(config: str, variants: list[list[str]]) -> list[tuple[Builder, object]]:
    """Decode plans over batches (several padded to one CUDA-graph size) and prefill plans
    (whole prompts, a chunk on a prefix, a mixed step), for every variant that validates; each
    builder takes the memo to build through (or None), and comes with its run config."""
    out: list[tuple[Builder, object]] = []
    models: dict[ModelCard, ModelCard] = {}
    for sets in variants:
        try:
            cfg = load_run_config(config, sets)
        except InferSimError:
            continue
        model = models.setdefault(cfg.model, cfg.model)  # one card object per model, as in a sweep
        cfg = dataclasses.replace(cfg, model=model)
        hw, dep, work = cfg.hardware, cfg.deployment, cfg.workload
        sms = hw.derates.deepep_normal_sms
        for batch in (1, 2, 3, 16, 17, 20, 24, 64, 100):
            if dep.overlap == "two-batch" and batch % 2:
                continue
            out.append((partial(lambda b, c, memo: _decode_plan(c.model, c.hardware, c.deployment, c.workload, b,
                                                                c.engine, memo=memo)[0], batch, cfg), cfg))
        for tokens in (2048, 4096):
            out.append((lambda memo, t=tokens, m=model, d=dep, w=work, s=sms: build_stage_plan(
                "prefill", m, d, w, t, s, memo=memo), cfg))
        # the same tokens per GPU in sequences of different lengths (routing statistics differ)
        for seqs in ((1, 1024, 1024), (2, 512, 512), (4, 256, 4096), (1, 1024, 3072)):
            out.append((lambda memo, q=seqs, m=model, d=dep, s=sms: build_step_plan(
                m, d, (SequenceBatch(*q),), s, memo=memo), cfg))
        out.append((lambda memo, m=model, d=dep, s=sms: build_step_plan(
            m, d, (SequenceBatch(1, 512, 512), SequenceBatch(6, 1, 2000)), s, memo=memo), cfg))
    return out


@pytest.mark.parametrize("config,variants", CASES)
def test_memoised_plans_equal_fresh_plans(config, variants, monkeypatch):
    builders = _builders(config, variants)
    assert len(builders) > 10
    asked = []
    piece = memo_module.PieceScope.piece
    monkeypatch.setattr(memo_module.PieceScope, "piece", lambda scope, *args: asked.append(1) or piece(scope, *args))
    memo = PricingMemo()
    shared = [build(memo) for build, _cfg in builders]
    assert memo.sizes()["pieces"] < len(asked)  # plans were served kept pieces (else this tests nothing)
    for (build, _cfg), plan in zip(builders, shared):
        assert build(None) == plan


def test_memo_is_bounded_and_answers_alike_past_its_bounds(monkeypatch):
    """Past a bound a table drops its older half and goes on: the sizes stay within the bounds and
    every plan and price is still the one built without a memo."""
    for name, bound in (("MAX_PIECES", 16), ("MAX_SHAPES", 64), ("MAX_PAIRS", 2)):
        monkeypatch.setattr(memo_module, name, bound)
    memo = PricingMemo()
    configs = [load_run_config("qwen3-30b.yaml", [f"deployment.precision.kv_cache={kv}"]) for kv in ("bf16", "fp8")]
    for batch in range(1, 120, 7):
        for cfg in configs + [dataclasses.replace(configs[0], hardware=dataclasses.replace(configs[0].hardware))]:
            plan, _ = _decode_plan(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, batch, cfg.engine, memo=memo)
            plain, _ = _decode_plan(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, batch, cfg.engine)
            assert plan == plain
            assert run_stage(plan, cfg.hardware, cfg.tables, cfg.engine, memo) == \
                run_stage(plain, cfg.hardware, cfg.tables, cfg.engine)
            sizes = memo.sizes()
            assert sizes["pieces"] <= 16 and sizes["pairs"] <= 2
            assert sizes["shapes"] <= 2 * 64 and sizes["priced"] <= 2 * 16


@pytest.mark.parametrize("config,variants", CASES)
def test_memoised_pricing_times_like_plain_pricing(config, variants):
    """A plan built and priced through a memo gives the step time, bound and results of the same
    plan built and priced plainly; the second round finds every piece priced already."""
    builders = _builders(config, variants)
    memo = PricingMemo()
    for build, cfg in builders + builders:
        plan, plain = build(memo), build(None)
        hw, tables, engine = cfg.hardware, cfg.tables, cfg.engine
        assert stage_time(plan, hw, tables, engine, memo) == stage_time(plain, hw, tables, engine)
        assert run_stage(plan, hw, tables, engine, memo) == run_stage(plain, hw, tables, engine)
        assert run_stage(plain, hw, tables, engine, memo) == run_stage(plain, hw, tables, engine)


@pytest.mark.parametrize("config,sets", [("qwen3-30b.yaml", []), ("qwen3-30b.yaml", ["engine=vllm", "deployment.ffn.ep=1"]),
                                         ("qwen3-next.yaml", []), ("qwen3-next.yaml", ["deployment.overlap=two-batch"]),
                                         ("deepseek-v3.2.yaml", []), ("gpt-oss-120b.yaml", [])])
def test_plans_built_from_a_kept_frame_equal_fresh_plans(config, sets, monkeypatch):
    """Consecutive decode plans of one deployment that differ only in their sequences (the real
    batches behind one CUDA-graph size, the context lengths) take the pieces that do not read the
    sequences from the last plan's frame: each is still the plan built without a memo, and priced
    through the memo it times as the plain plan does; a plan of other tokens builds its own frame."""
    from infersim.modules import step

    built = []
    layers_built = step._layers_built
    def counted(model, inputs, ctx, ffn_ctx):  # the frames built through the memo (plain inputs keep no frame)
        if inputs.last_frame is not None:
            built.append(1)
        return layers_built(model, inputs, ctx, ffn_ctx)

    monkeypatch.setattr(step, "_layers_built", counted)
    cfg = load_run_config(config, sets)
    model, hw, dep, engine = cfg.model, cfg.hardware, cfg.deployment, cfg.engine
    memo = PricingMemo()
    plans = 0
    for batch in (18, 20, 22, 24, 26, 28, 64, 2):
        for isl in (1024, 5000, 1024, 30_000):
            work = dataclasses.replace(cfg.workload, isl=isl)
            kept, padded = _decode_plan(model, hw, dep, work, batch, engine, memo=memo)
            plain, _ = _decode_plan(model, hw, dep, work, batch, engine)
            assert kept == plain, (batch, isl)
            assert stage_time(kept, hw, cfg.tables, engine, memo) == stage_time(plain, hw, cfg.tables, engine)
            assert run_stage(kept, hw, cfg.tables, engine, memo) == run_stage(plain, hw, cfg.tables, engine)
            plans += 1
    assert len(built) < plans / 2  # most plans came from a kept frame (else this tests nothing)
