"""Memoised plan pieces (infersim.modules.step._PIECES) give exactly the plan a fresh build gives,
and the engine's pricing of pieces by identity gives exactly the per-operation pricing.

The pieces are keyed on a subset of the deployment and stage context (what their builders read),
so a wrong key shows up as a plan built for one layout or batch being served to another. Each
case first builds every plan with the memo shared between them (the sweep's situation: pieces
reused across batches, EP sizes, MoE paths and pipeline splits), then rebuilds each one from an
empty memo and compares the two operation by operation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import pytest

from infersim.cards.model import ModelCard
from infersim.run.config import load_run_config
from infersim.base.errors import InferSimError
from infersim.modules import step
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.engine.stage import run_stage, stage_time
from infersim.shapes.plan import LayerGroup, SequenceBatch, StagePlan
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


def _builders(config: str, variants: list[list[str]]) -> list[Callable[[], StagePlan]]:
    """Decode plans over batches (several padded to one CUDA-graph size) and prefill plans
    (whole prompts, a chunk on a prefix, a mixed step), for every variant that validates."""
    out: list[Callable[[], StagePlan]] = []
    models: dict[ModelCard, ModelCard] = {}
    for sets in variants:
        try:
            cfg = load_run_config(config, sets)
        except InferSimError:
            continue
        # one card object per model, as in a sweep (the memo keys cards by identity)
        model = models.setdefault(cfg.model, cfg.model)
        cfg = dataclasses.replace(cfg, model=model)
        hw, dep, work = cfg.hardware, cfg.deployment, cfg.workload
        sms = hw.derates.deepep_normal_sms
        for batch in (1, 2, 3, 16, 17, 20, 24, 64, 100):
            if dep.overlap == "two-batch" and batch % 2:
                continue
            out.append(partial(lambda b, c: _decode_plan(c.model, c.hardware, c.deployment, c.workload, b,
                                                         c.engine)[0], batch, cfg))
        for tokens in (2048, 4096):
            out.append(partial(build_stage_plan, "prefill", model, dep, work, tokens, sms))
        # the same tokens per GPU in sequences of different lengths (routing statistics differ)
        for seqs in ((1, 1024, 1024), (2, 512, 512), (4, 256, 4096), (1, 1024, 3072)):
            out.append(partial(build_step_plan, model, dep, (SequenceBatch(*seqs),), sms))
        out.append(partial(build_step_plan, model, dep, (SequenceBatch(1, 512, 512), SequenceBatch(6, 1, 2000)), sms))
    return out


def _pieces_kept() -> int:
    return sum(len(pieces) for _card, pieces in step._PIECES.values())


@pytest.mark.parametrize("config,variants", CASES)
def test_memoised_plans_equal_fresh_plans(config, variants):
    builders = _builders(config, variants)
    assert len(builders) > 10
    step.forget_pieces()
    shared = [build() for build in builders]
    pieces_shared = _pieces_kept()
    pieces_alone = 0
    for build, plan in zip(builders, shared):
        step.forget_pieces()
        assert build() == plan
        pieces_alone += _pieces_kept()
    assert pieces_shared < pieces_alone  # some plans were served memoised pieces (else this tests nothing)


def test_memo_is_bounded():
    step.forget_pieces()
    cfg = load_run_config("qwen3-30b.yaml")
    for batch in range(1, 2 * step._PIECES_LIMIT):
        _decode_plan(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, batch, cfg.engine)
        assert all(len(pieces) <= step._PIECES_LIMIT for _card, pieces in step._PIECES.values())
    # one (card, precision, model code) triple after another: the triples are bounded too
    for kv_cache in ("bf16", "fp8") * step._FORMATS_KEPT:
        cfg = load_run_config("qwen3-30b.yaml", [f"deployment.precision.kv_cache={kv_cache}"])
        _decode_plan(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, 1, cfg.engine)
        assert len(step._PIECES) <= step._FORMATS_KEPT


@pytest.mark.parametrize("config,variants", CASES)
def test_pieces_priced_by_identity_time_like_plain_operations(config, variants):
    """The engine prices a group's memoised pieces by identity (engine._COST_MEMO); the same plan
    without pieces, priced operation by operation, gives the same step time, bound and results."""
    cfg = load_run_config(config, variants[0])
    builders = _builders(config, variants)
    for build in builders + builders:  # the second round finds every piece priced already
        plan = build()
        assert all(sum(g.pieces, ()) == g.operations for g in plan.groups)
        plain = dataclasses.replace(plan, groups=tuple(LayerGroup(g.name, g.layers, g.operations) for g in plan.groups))
        hw = cfg.hardware
        assert stage_time(plan, hw, cfg.tables, cfg.engine) == stage_time(plain, hw, cfg.tables, cfg.engine)
        assert run_stage(plan, hw, cfg.tables, cfg.engine) == run_stage(plain, hw, cfg.tables, cfg.engine)
