"""Attention TP with the routed experts on EP inside the same GPUs (SGLang --tp 8 --ep 8, vLLM
--tensor-parallel-size 8 --enable-expert-parallel, TensorRT-LLM tp 8 moe_ep 8 without attention DP):
every rank holds its attention group's tokens, runs its local experts on them, and the outputs are
reduced; dense FFN layers and shared experts stay TP-sharded over the group."""

from __future__ import annotations

import pytest

from infersim.run.config import config_from_mapping
from infersim.cards.deployment import dense_ffn_tp
from infersim.base.errors import ConfigError
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import GemmShape, GroupedGemmShape
from infersim.modules.ffn import ffn_weight_params
from infersim.modules.step import build_stage_plan


def _config(engine: str = "sglang", **deployment):
    dep = {"num_gpus": 8, "attention": {"tp": 8, "dp": 1}, "ffn": {"tp": 1, "ep": 8},
           "precision": {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}, **deployment}
    return config_from_mapping({"model": "deepseek-v3", "hardware": "h200", "engine": engine, "deployment": dep,
                                "workload": {"isl": 1000, "osl": 100, "decode_batch_per_gpu": 4}}, "test",
                               mfu_tables="none")


def test_the_layout_engines_run_is_accepted_and_gathers():
    # the command: --set deployment.attention.tp=8 --set deployment.attention.dp=1
    # --set deployment.ffn.ep=8 --set deployment.ffn.tp=1 on DeepSeek-V3 / H200
    for engine in ("sglang", "vllm", "trtllm"):
        config = _config(engine)
        dep = config.deployment
        assert (dep.attention.tp, dep.ffn.tp, dep.ffn.ep) == (8, 1, 8)
        assert dep.moe_comm == "all-gather", engine  # no attention DP: every engine's gathered path
        assert dense_ffn_tp(dep) == 8


def test_moe_layer_runs_local_experts_on_the_groups_tokens_and_reduces():
    config = _config()
    plan = build_stage_plan("decode", config.model, config.deployment, config.workload, 4, 0)
    groups = {g.name: g for g in plan.groups}
    moe = next(g for g in plan.groups if any(op.name == "experts_up" for op in g.operations))
    ops = {op.name: op.shape for op in moe.operations}
    # 4 requests per GPU x TP8 = 32 tokens held by every rank of the group after attention's all-reduce
    assert ops["router_gate"].m == 32
    up = ops["experts_up"]
    assert isinstance(up, GroupedGemmShape) and up.ep == 8 and up.intermediate == 2048  # experts whole, 32 per rank
    assert up.tokens_per_gpu / up.load_factor == pytest.approx(4)  # the group's 32 tokens routed over its 8 GPUs
    # shared expert TP-sharded over the group (2048 / 8), run on all 32 tokens
    shared = ops["shared_expert_up_proj"]
    assert isinstance(shared, GemmShape) and (shared.m, shared.n) == (32, 2 * 2048 // 8)
    comm = [op.shape for op in moe.operations if isinstance(op.shape, CollectiveShape)]
    assert [(c.kind, c.ranks) for c in comm] == [("all_reduce", 8), ("all_reduce", 8)]  # attention out, MoE out
    assert "dispatch" not in ops and "combine" not in ops
    # the dense layers: TP8 over the group, like attention
    dense = next(g for g in plan.groups if any(op.name == "ffn_up_proj" for op in g.operations))
    dense_up = next(op.shape for op in dense.operations if op.name == "ffn_up_proj")
    assert (dense_up.m, dense_up.n) == (32, 2 * 18432 // 8)
    assert groups  # the plan has named groups


def test_weights_shard_dense_layers_over_the_attention_group():
    config = _config()
    dense, moe = ffn_weight_params(config.model, config.deployment)
    h = config.model.hidden_size
    assert dense == pytest.approx(3 * h * 18432 / 8)
    routed = 256 / 8 * 3 * h * 2048
    shared = 3 * h * 2048 / 8
    assert moe == pytest.approx(routed + shared + h * 256)


def test_narrower_layouts_are_still_refused():
    # a dense model cannot run its FFN narrower than attention TP
    with pytest.raises(ConfigError, match="a TP FFN must span at least the attention TP group"):
        config_from_mapping({"model": "llama-3.1-70b", "hardware": "h200",
                             "deployment": {"num_gpus": 8, "attention": {"tp": 8}, "ffn": {"tp": 1, "dp": 8}},
                             "workload": {"isl": 100, "osl": 10}}, "test", mfu_tables="none")
    # the experts of an attention-TP group must spread over at least its GPUs
    with pytest.raises(ConfigError, match="tp x ep smaller than attention.tp"):
        _config(ffn={"tp": 1, "ep": 4, "dp": 2})
