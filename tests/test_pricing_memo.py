"""A PricingMemo (infersim.costing.memo) changes how often plans are built and kernels priced, never a
number: randomised sequences of decode steps, prefills, serving steps and whole simulations over
many models, deployments, precisions and engines, priced through one memo that lives across them
(a sweep's), equal the same ones priced without a memo, to the last bit. And a piece is kept on
every input its builder is given, so two configurations that differ in one field a builder reads
never share a piece, and a builder reading a field its inputs do not carry fails instead of being
served a piece built for other values."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.base.errors import InferSimError
from infersim.costing.memo import PricingMemo
from infersim.engine.stage import run_stage, stage_time
from infersim.modules import step
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.run.config import RunConfig, load_run_config
from infersim.run.simulate import decode_time, run_decode, run_prefill, simulate
from infersim.shapes.plan import SequenceBatch

VARIANTS = [
    ("qwen3-30b.yaml", []),
    ("qwen3-30b.yaml", ["deployment.ffn.ep=2"]),
    ("qwen3-30b.yaml", ["deployment.ffn.ep=1", "deployment.ffn.tp=4", "deployment.moe_comm=all-gather"]),
    ("qwen3-30b.yaml", ["deployment.moe_comm=deepep-low-latency"]),
    ("qwen3-30b.yaml", ["deployment.moe_comm=all-gather"]),
    ("qwen3-30b.yaml", ["deployment.overlap=two-batch", "deployment.moe_comm=deepep-normal"]),
    ("qwen3-30b.yaml", ["deployment.precision.gemm=fp8"]),
    ("qwen3-30b.yaml", ["deployment.precision.kv_cache=fp8"]),
    ("qwen3-30b.yaml", ["deployment.moe.load_balance=ideal"]),
    ("qwen3-30b.yaml", ["deployment.moe.routing_skew=1.2"]),
    ("qwen3-30b.yaml", ["engine=trtllm"]),
    ("qwen3-30b.yaml", ["engine=vllm", "deployment.ffn.ep=1"]),
    ("qwen3-30b.yaml", ["engine=huggingface", "deployment.num_gpus=1", "deployment.ffn.ep=1",
                        "deployment.attention.dp=0", "deployment.precision.gemm=bf16"]),
    ("qwen3-30b.yaml", ["deployment.num_gpus=8", "deployment.pp=2", "deployment.attention.dp=0"]),
    ("qwen3-30b.yaml", ["deployment.num_gpus=16", "deployment.num_nodes=2", "deployment.ffn.ep=8",
                        "deployment.attention.dp=0"]),
    ("qwen3-30b.yaml", ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.dp=0"]),
    ("qwen3-30b.yaml", ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.tp=2",
                        "deployment.attention.dp=0"]),
    ("qwen3-next.yaml", []),
    ("qwen3-next.yaml", ["deployment.overlap=two-batch"]),
    ("deepseek-v3.2.yaml", []),
    ("deepseek-v3.2.yaml", ["deployment.moe_comm=all-to-all"]),
    ("deepseek-v3.2.yaml", ["deployment.moe_comm=all-gather", "deployment.shared_experts=sharded"]),
    ("deepseek-v3.2.yaml", ["deployment.moe_comm=all-gather", "deployment.shared_experts=replicated"]),
    ("gpt-oss-120b.yaml", []),
    ("gpt-oss-120b.yaml", ["deployment.precision.kv_cache=fp8"]),
    ("qwen3-8b-speculative.yaml", []),
]


_LOADED: dict[int, RunConfig] = {}
SHARED = PricingMemo()  # one memo for every example, as a long sweep keeps one


def _config(index: int) -> RunConfig:
    """VARIANTS[index] loaded (once: its cards stay the same objects, as in a sweep)."""
    if index not in _LOADED:
        path, sets = VARIANTS[index]
        try:
            _LOADED[index] = load_run_config(path, sets)
        except InferSimError as exc:  # a variant the cards refuse tests nothing: say which
            raise AssertionError(f"{path} {sets}: {exc}") from None
    return _LOADED[index]


def _outcome(price: Callable[[], Any]) -> tuple[str, Any]:
    """What pricing gives: its value, or the error it raises (a refused batch raises alike both ways)."""
    try:
        return "value", price()
    except InferSimError as exc:
        return "refused", str(exc)


def _pricings(cfg: RunConfig, kind: str, batch: int, isl: int, chunk: int) -> Callable[[PricingMemo | None], Any]:
    """One pricing of `cfg` (its workload set to `isl` and `batch`) as a function of the memo."""
    work = dataclasses.replace(cfg.workload, isl=isl, decode_batch_per_gpu=batch)
    model, hw, dep, tables, engine = cfg.model, cfg.hardware, cfg.deployment, cfg.tables, cfg.engine
    if kind == "decode":
        return lambda memo: (decode_time(model, hw, dep, work, batch, tables, engine, memo=memo),
                             run_decode(model, hw, dep, work, batch, tables, engine, memo=memo))
    if kind == "prefill":
        return lambda memo: run_prefill(model, hw, dep, work, tables, engine, memo=memo)
    if kind == "step":  # a serving step: one prompt chunk on a prefix beside decode requests
        seqs = (SequenceBatch(1, chunk, chunk + isl, across_tp=dep.attention.tp > 1), SequenceBatch(batch, 1, isl))

        def serving_step(memo: PricingMemo | None) -> Any:
            plan = build_step_plan(model, dep, seqs, hw.derates.deepep_normal_sms, expert_tokens_per_gpu=chunk / 2,
                                   memo=memo)
            return plan, run_stage(plan, hw, tables, engine, memo), stage_time(plan, hw, tables, None, memo)
        return serving_step
    return lambda memo: simulate(dataclasses.replace(cfg, workload=work), memo)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(VARIANTS) - 1), st.sampled_from(["decode", "prefill", "step", "simulate"]),
                          st.integers(1, 300), st.integers(16, 20_000), st.integers(1, 4096)),
                min_size=1, max_size=6))
def test_memoised_pricing_equals_fresh_pricing(draws):
    for index in range(len(VARIANTS)):  # every variant loads (one the cards refused would test nothing)
        _config(index)
    for index, kind, batch, isl, chunk in draws:
        price = _pricings(_config(index), kind, batch, isl, chunk)
        assert _outcome(partial(price, SHARED)) == _outcome(partial(price, None)), (VARIANTS[index], kind, batch, isl)


def test_a_field_only_one_builder_reads_keeps_configurations_apart():
    """Shared experts under an all-gather MoE path are split over the FFN group (sharded) or the
    attention-TP group (replicated): a field only the MoE builder reads. Priced one after the other
    through one memo, each configuration gets its own numbers, which differ."""
    sharded, replicated = (_config(VARIANTS.index(("deepseek-v3.2.yaml", ["deployment.moe_comm=all-gather",
                                                                         f"deployment.shared_experts={how}"])))
                           for how in ("sharded", "replicated"))
    assert dataclasses.replace(sharded.deployment, shared_experts="replicated") == replicated.deployment
    memo = PricingMemo()
    times = {}
    for cfg in (sharded, replicated, sharded):
        dep = cfg.deployment
        args = (cfg.model, cfg.hardware, dep, cfg.workload, 64, cfg.tables, cfg.engine)
        times[dep.shared_experts] = decode_time(*args, memo=memo)
        assert times[dep.shared_experts] == decode_time(*args)
    assert times["sharded"][0] != times["replicated"][0]


def test_short_lived_deployments_get_their_own_pieces():
    """Deployment objects made and dropped one after another (their memory, and so their
    identities, reused by the next) each get the pieces of their own values through one memo."""
    cfg = _config(VARIANTS.index(("deepseek-v3.2.yaml", ["deployment.moe_comm=all-gather",
                                                          "deployment.shared_experts=sharded"])))
    memo = PricingMemo()
    times = set()
    for i in range(24):
        dep = dataclasses.replace(cfg.deployment, shared_experts=("sharded", "replicated")[i % 2])
        plan = build_stage_plan("decode", cfg.model, dep, cfg.workload, 64, 0, memo=memo)
        assert plan == build_stage_plan("decode", cfg.model, dep, cfg.workload, 64, 0)
        times.add(run_stage(plan, cfg.hardware, cfg.tables, cfg.engine, memo).step_time_s)
        del dep, plan
    assert len(times) == 2


def test_a_builder_reading_a_field_its_inputs_lack_fails(monkeypatch):
    """A builder is given the part of the deployment it is built from (and kept on it): one that
    started reading another field would fail, with or without a memo, rather than be served a
    piece kept for other values of that field."""
    original = step._ffn_operations

    def reads_overlap(model, dep, ctx, moe):
        return original(model, dep, ctx, moe) if dep.overlap == "none" else []

    monkeypatch.setattr(step, "_ffn_operations", reads_overlap)
    cfg = _config(0)
    for memo in (PricingMemo(), None):
        with pytest.raises(AttributeError, match="overlap"):
            build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 8, 0, memo=memo)


# module-level containers the cost model may keep, and why they are not a run's state
KEPT_AT_MODULE_LEVEL = {
    ("infersim/tables/lookup.py", "_LOADED"): "kernel tables read from disk, kept per directory by its files' "
                                              "sizes and mtimes: inputs, not plans or costs",
}


def test_the_cost_model_keeps_no_state_of_its_own():
    """No module of the cost model (shapes, modules, costing, tables, engine) starts an empty
    container at module level or assigns a global: what a run prices is kept by its PricingMemo."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for folder in ("shapes", "modules", "costing", "tables", "engine"):
        for path in sorted((root / "infersim" / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                value = getattr(node, "value", None)
                target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
                empty_literal = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                    value.keys if isinstance(value, ast.Dict) else value.elts)
                empty_call = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.args
                              and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict", "deque"))
                name = target.id if isinstance(target, ast.Name) else ast.unparse(target) if target else ""
                if (empty_literal or empty_call) and (where, name) not in KEPT_AT_MODULE_LEVEL:
                    found.append(f"{where}:{node.lineno} {name}")
            found += [f"{where}:{node.lineno} global {', '.join(node.names)}" for node in ast.walk(tree)
                      if isinstance(node, ast.Global)]
    assert not found
