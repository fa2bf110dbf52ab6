"""Which MoE path an engine takes when the run names none, and where shared experts sit on the
gathered path: TensorRT-LLM runs all-to-all only past top-k EP ranks and keeps shared experts on
each rank's own tokens; SGLang splits them over the whole FFN group (engine cards' sources)."""

from __future__ import annotations

import pytest

from core_fixtures import TINY_MOE, run_mapping
from infersim.run.config import config_from_mapping, load_engine_card
from infersim.base.errors import ConfigError
from infersim.run.memory import weights_per_gpu
from infersim.modules.ffn import ffn_weight_params
from infersim.modules.step import build_stage_plan

SHARED_MOE = {**TINY_MOE, "name": "tiny-shared", "num_shared_experts": 1, "shared_expert_intermediate_size": 64}


def config(engine: str, ep: int, model: dict = TINY_MOE, **deployment):
    raw = run_mapping(model, num_gpus=ep, attention={"tp": 1, "dp": ep}, ffn={"tp": 1, "ep": ep}, **deployment)
    raw["engine"] = engine
    return config_from_mapping(raw, "test")


def test_trtllm_gathers_tokens_when_ep_is_not_above_topk():
    assert load_engine_card("trtllm")[0].all_to_all_needs_ep_above_topk
    assert config("trtllm", 2).deployment.moe_comm == "all-gather"  # EP2 <= top-2
    assert config("trtllm", 4).deployment.moe_comm == "all-to-all"  # EP4 > top-2: the card's all-to-all
    assert config("trtllm", 2, moe_comm="all-to-all").deployment.moe_comm == "all-to-all"  # named: kept
    assert config("vllm", 4).deployment.moe_comm == "all-gather"  # vLLM 0.11's allgather_reducescatter, any EP
    assert config("huggingface", 4).deployment.moe_comm == "all-to-all"  # no card default, no such rule


def ops(cfg, tokens: int):
    plan = build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, tokens,
                            cfg.hardware.derates.deepep_normal_sms)
    return {op.name: op.shape for group in plan.groups for op in group.operations}


def test_shared_experts_on_the_gathered_path_by_hand():
    """EP2 with 4 tokens per GPU, shared expert width 64, hidden 64, gated (up = 2 x width)."""
    trt = config("trtllm", 2, SHARED_MOE)
    sgl = config("sglang", 2, SHARED_MOE)
    assert trt.deployment.moe_comm == sgl.deployment.moe_comm == "all-gather"
    assert (trt.deployment.shared_experts, sgl.deployment.shared_experts) == ("replicated", "sharded")
    replicated, sharded = ops(trt, 4)["shared_expert_up_proj"], ops(sgl, 4)["shared_expert_up_proj"]
    # replicated: the whole expert on the rank's own 4 tokens
    assert (replicated.m, replicated.k, replicated.n) == (4, 64, 128)
    # sharded: half the expert on both ranks' 8 gathered tokens; the same FLOPs, half the weights
    assert (sharded.m, sharded.k, sharded.n) == (8, 64, 64)
    assert replicated.flops == sharded.flops
    # per-GPU parameters of an MoE layer: router 64 x 8, routed 8 / 2 experts x 3 x 64 x 32, shared 3 x 64 x 64 / shards
    routed, router = 4 * 3 * 64 * 32, 64 * 8
    assert ffn_weight_params(trt.model, trt.deployment)[1] == routed + router + 3 * 64 * 64
    assert ffn_weight_params(sgl.model, sgl.deployment)[1] == routed + router + 3 * 64 * 64 / 2
    assert weights_per_gpu(trt.model, trt.deployment) > weights_per_gpu(sgl.model, sgl.deployment)


def test_shared_experts_can_be_named_and_all_to_all_ignores_them():
    named = config("trtllm", 2, SHARED_MOE, shared_experts="sharded")
    assert named.deployment.shared_experts == "sharded"
    assert ops(named, 4)["shared_expert_up_proj"].m == 8
    a2a = config("sglang", 2, SHARED_MOE, moe_comm="all-to-all")
    up = ops(a2a, 4)["shared_expert_up_proj"]
    assert (up.m, up.n) == (4, 128)  # each rank's own tokens, whole expert, whatever shared_experts says
    with pytest.raises(ConfigError, match="shared_experts"):
        config("trtllm", 2, SHARED_MOE, shared_experts="halved")


def test_a_sweep_derives_the_moe_path_again_for_every_layout(tmp_path):
    """A sweep over EP sizes gets for each variant the path loading that variant gets: TensorRT-LLM
    gathers at EP4 (<= Qwen3-30B's top-8) and runs all-to-all at EP16; a named path stays."""
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate
    from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep
    from infersim.sweep.variants import Deriver

    path = tmp_path / "trt.yaml"
    path.write_text("model: qwen3-30b-a3b\nhardware: h20\nengine: trtllm\n"
                    "deployment: {num_gpus: 16, num_nodes: 2, attention: {tp: 1}, ffn: {tp: 1, ep: 16}}\n"
                    "workload: {isl: 1024, osl: 256, decode_batch_per_gpu: 32}\n")
    base = load_base(path)
    assert base.config.deployment.moe_comm == "all-to-all"
    spec = SweepSpec(base, tuple(parse_grid(["deployment.ffn.ep=4,16"])), prefill=False)
    deriver = Deriver(base, spec.axes)
    assert [deriver.config((ep,)).deployment.moe_comm for ep in (4, 16)] == ["all-gather", "all-to-all"]
    rows = run_sweep(spec, workers=1, progress=False).rows
    for row in rows:
        loaded = load_run_config(path, [f"deployment.ffn.ep={row.ffn_ep}"])
        assert row.tpot_s == pytest.approx(simulate(loaded).decode.step_time_s, rel=1e-12)
    named = SweepSpec(load_base(path, ["deployment.moe_comm=all-to-all"]), spec.axes, prefill=False)
    assert Deriver(named.base, named.axes).config((4,)).deployment.moe_comm == "all-to-all"


def test_trtllm_all_to_all_needs_attention_dp():
    """aiconfigurator's transcription of TensorRT-LLM's WideEP rules: "WideEP requires
    attention_dp_size > 1". With attention TP over the EP group every rank holds every token."""
    raw = run_mapping(TINY_MOE, num_gpus=4, attention={"tp": 4}, ffn={"tp": 1, "ep": 4})
    raw["engine"] = "trtllm"
    assert config_from_mapping(raw, "test").deployment.moe_comm == "all-gather"
    raw["deployment"]["attention"] = {"tp": 1}  # attention DP4 (derived), EP4 > top-2
    assert config_from_mapping(raw, "test").deployment.moe_comm == "all-to-all"
