"""Expert-load balance (deployment.moe, infersim.modules.load_balance): hand-checked factors,
brute force on cases small enough to enumerate, and the properties the model promises."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import TINY_MOE, make_config
from infersim.cli.main import main
from infersim.run.config import load_run_config
from infersim.base.errors import ConfigError
from infersim.shapes.comm_shapes import TokenExchangeShape
from infersim.shapes.kernels import GroupedGemmShape
from infersim.tables.grid_keys import shape_grid_key
from infersim.modules.load_balance import eplb_placement, expected_max_normal, moe_balance, popularity
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate

PREFILL = "benchmarks/published/deepseek-v3-h800-prefill.yaml"
EP72 = ["--set", "deployment.num_gpus=72", "--set", "deployment.num_nodes=9", "--set", "deployment.attention.dp=72",
        "--set", "deployment.ffn.ep=72"]


def factor(policy: str, E: int, k: int, P: int, T: float, L: float = 1.0, R: int = 0, skew: float = 1.01,
           dataset: float | None = None) -> float:
    return moe_balance(policy, E, k, P, T, L, R, skew, dataset).token_factor  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Hand-checked values


def test_expected_max_of_normals_matches_known_values():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)
    assert expected_max_normal(32) == pytest.approx(2.0697, abs=1e-4)  # tabulated normal order statistics


def test_four_experts_top1_ep2_closed_form_by_hand():
    # E=4, k=1, P=2, independent tokens: 1 + z_2 sqrt(2/(2-1)) sqrt(N v_tok) / (N/2), v_tok = 1/4
    # = 1 + sqrt(2/pi) * sqrt(N)/2 / (N/2) = 1 + sqrt(2 / (pi N))
    for n in (4, 16, 100):
        assert factor("statistical", 4, 1, 2, n / 2) == pytest.approx(1 + math.sqrt(2 / (math.pi * n)))


def _exact_max_over_mean(per_token: dict[int, Fraction], tokens: int, k: int) -> float:
    """E[max(L0, L1)] / mean for two GPUs, by convolving one token's pairs on GPU 0 `tokens` times."""
    dist = {0: Fraction(1)}
    for _ in range(tokens):
        nxt: dict[int, Fraction] = {}
        for a, pa in dist.items():
            for b, pb in per_token.items():
                nxt[a + b] = nxt.get(a + b, Fraction(0)) + pa * pb
        dist = nxt
    total = tokens * k
    expected_max = sum(p * max(load, total - load) for load, p in dist.items())
    return float(expected_max / Fraction(total, 2))


def test_closed_form_against_exact_enumeration():
    # top-1 of 4 experts, 2 GPUs of 2 experts: a token lands on GPU 0 with probability 1/2
    exact = _exact_max_over_mean({0: Fraction(1, 2), 1: Fraction(1, 2)}, 16, 1)
    assert exact == pytest.approx(1 + 12870 / 65536, rel=1e-12)  # 1 + E|Bin(16,1/2) - 8| / 8 = 1.19638
    assert factor("statistical", 4, 1, 2, 8) == pytest.approx(exact, rel=0.005)
    # top-2 of 4 experts: the 6 expert pairs put 2, 1 or 0 copies on GPU 0 (1, 4, 1 of 6)
    pairs = itertools.combinations(range(4), 2)
    counts: dict[int, Fraction] = {}
    for pair in pairs:
        on_gpu0 = sum(1 for e in pair if e < 2)
        counts[on_gpu0] = counts.get(on_gpu0, Fraction(0)) + Fraction(1, 6)
    assert counts == {2: Fraction(1, 6), 1: Fraction(4, 6), 0: Fraction(1, 6)}
    for tokens in (8, 32):
        exact = _exact_max_over_mean(counts, tokens, 2)
        assert factor("statistical", 4, 2, 2, tokens / 2) == pytest.approx(exact, rel=0.01)


def test_uniform_routing_reproduces_the_reference_simulation():
    # moe_load.md: top-8 of 256 experts, max/mean 1.09/1.26/1.42 at EP8/32/64 for 256 tokens in the
    # batch, 1.01/1.03/1.05 for 16,384 (a multinomial simulation)
    for batch, expected in ((256, (1.09, 1.26, 1.42)), (16384, (1.01, 1.03, 1.05))):
        for ep, want in zip((8, 32, 64), expected):
            assert factor("statistical", 256, 8, ep, batch / ep) == pytest.approx(want, abs=0.015)


def test_eplb_placement_by_hand():
    # loads 4, 2, 1, 1 on 6 slots of 2 GPUs: both redundant slots go to expert 0 (4 -> 2 per
    # replica, then the tie 2 = 2 goes to the lower index: 3 replicas of 4/3); heaviest first onto
    # the lightest GPU with a free slot: e1 (2) -> G0, e0 -> G1, e0 -> G1 (1.33 < 2), e0 -> G0,
    # e2 -> G1 (2.67 < 3.33), e3 -> G0 (G1 is full)
    replicas, gpus = eplb_placement((4.0, 2.0, 1.0, 1.0), 6, 2)
    assert replicas == (3, 1, 1, 1)
    assert gpus == ((1, 0, 3), (0, 0, 2))


def test_eplb_slot_granularity_on_ep72():
    # 256 experts + 32 replicas on 72 GPUs of 4 slots: even load 256/72 = 3.556 per GPU, but 224
    # unreplicated experts leave some GPU with 4 whole experts: 4 / 3.556 = 1.125
    balance = moe_balance("eplb", 256, 8, 72, 1e12, 1.0, 32)
    assert balance.placement_factor == pytest.approx(4 / (256 / 72))
    assert balance.token_factor == pytest.approx(1.125, rel=1e-3)


def test_popularity_is_a_capped_power_law():
    q = popularity(256, 8, 1.01)
    assert sum(q) == pytest.approx(8) and max(q) <= 1 and list(q) == sorted(q, reverse=True)
    assert q[0] / q[-1] == pytest.approx(0.8 * 1024, rel=0.05)  # the range [1, 0.8 x 1024]
    capped = popularity(8, 6, 1.01)  # top-6 of 8: the hottest expert would get more than every token
    assert capped[0] == 1.0 and sum(capped) == pytest.approx(6) and capped[-1] < 1


def test_skewed_dataset_matches_tensorrt_llm_measurement_in_size():
    # TensorRT-LLM wide EP, DeepSeek-R1 EP32, 1024 tokens per rank: max/mean 2.56 without EPLB,
    # 1.11 with EPLB at 9 slots per GPU (moe_load.md); aiconfigurator's alpha 1.01
    without = factor("statistical", 256, 8, 32, 1024, 64, 0, 1.01, 1.01)
    with_eplb = factor("eplb", 256, 8, 32, 1024, 64, 32, 1.01, 1.01)
    assert 2.2 < without < 2.9
    assert 1.0 < with_eplb < 1.15


def test_memory_bound_decode_reads_the_most_activated_experts():
    small = moe_balance("statistical", 256, 8, 32, 1)  # 32 tokens over 256 experts: 5.1 of 8 per GPU
    assert small.mean_active_experts == pytest.approx(8 * (1 - (1 - 8 / 256) ** 32))
    assert small.mean_active_experts < small.active_experts <= 8
    assert small.weight_factor > 1.2
    large = moe_balance("statistical", 256, 8, 32, 4096)
    assert large.weight_factor == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Properties

LAYOUTS = st.sampled_from([(8, 2, 2), (8, 2, 4), (16, 4, 4), (64, 6, 8), (128, 8, 4), (256, 8, 32), (256, 8, 64),
                           (384, 8, 16), (60, 4, 6)])
SKEW = st.sampled_from([0.0, 0.6, 1.01, 1.2, 2.0])
DATASET = st.sampled_from([None, 0.6, 1.01, 1.2])


@settings(max_examples=80, deadline=None)
@given(LAYOUTS, st.floats(1, 1e5), st.floats(1, 4096), SKEW, DATASET)
def test_ideal_is_one_and_others_never_below(layout, tokens, seq, skew, dataset):
    E, k, P = layout
    assert factor("ideal", E, k, P, tokens, seq, 0, skew, dataset) == 1.0
    for policy in ("statistical", "eplb"):
        f = factor(policy, E, k, P, tokens, seq, 0, skew, dataset)
        assert 1.0 <= f <= P * min(k, E // P) / k + 1e-12


@settings(max_examples=80, deadline=None)
@given(LAYOUTS, st.floats(1, 1e5), st.floats(1.0001, 10), st.floats(1, 4096), SKEW, DATASET,
       st.sampled_from(["statistical", "eplb"]), st.integers(0, 3))
def test_more_tokens_per_rank_is_closer_to_even(layout, tokens, more, seq, skew, dataset, policy, extra):
    E, k, P = layout
    R = extra * P if policy == "eplb" else 0
    fewer = factor(policy, E, k, P, tokens, seq, R, skew, dataset)
    assert factor(policy, E, k, P, tokens * more, seq, R, skew, dataset) <= fewer + 1e-12


def test_even_traffic_tends_to_one():
    for E, k, P in ((256, 8, 32), (128, 8, 4), (384, 8, 16)):
        assert factor("statistical", E, k, P, 1e9, 4096) < 1.01
        assert factor("statistical", E, k, P, 1e9, 4096, dataset=1.01) > 1.2  # a skewed dataset keeps a floor


@settings(max_examples=80, deadline=None)
@given(LAYOUTS, st.floats(1, 1e5), st.floats(1, 4096), SKEW, DATASET, st.integers(0, 3))
def test_eplb_is_no_worse_than_the_statistical_default(layout, tokens, seq, skew, dataset, extra):
    E, k, P = layout
    statistical = factor("statistical", E, k, P, tokens, seq, 0, skew, dataset)
    assert factor("eplb", E, k, P, tokens, seq, extra * P, skew, dataset) <= statistical + 1e-9


# ---------------------------------------------------------------------------------------------
# The simulator: layout checks, stage times, report


def _ttft(*overrides: str) -> float:
    return simulate(load_run_config(PREFILL, list(overrides))).prefill.step_time_s


def test_default_is_slower_than_ideal_and_eplb_sits_between():
    # DeepSeek-V3 (256 experts, top-8) prefill at EP32
    ideal = _ttft("deployment.moe.load_balance=ideal", "deployment.moe.redundant_experts=0")
    default = _ttft("deployment.moe.load_balance=statistical", "deployment.moe.redundant_experts=0")
    eplb = _ttft("deployment.moe.load_balance=eplb", "deployment.moe.redundant_experts=32")
    assert ideal < eplb < default
    assert default > 1.05 * ideal
    skewed = ("deployment.moe.dataset_skew=1.01",)
    default_skewed = _ttft("deployment.moe.load_balance=statistical", "deployment.moe.redundant_experts=0", *skewed)
    eplb_skewed = _ttft("deployment.moe.load_balance=eplb", "deployment.moe.redundant_experts=32", *skewed)
    assert ideal < eplb_skewed < default_skewed and default_skewed > 1.3 * ideal


def test_deepseek_v3_on_ep72_with_32_redundant_experts_runs(capsys):
    assert main(["--config", PREFILL, *EP72, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for stage in ("prefill", "decode"):
        balance = data[stage]["moe_load_balance"]
        assert balance["policy"] == "eplb" and balance["slots"] == 288 and balance["redundant_experts"] == 32
        assert balance["ep"] == 72 and balance["factor"] > 1
    assert data["deployment"]["moe"] == {"load_balance": "eplb", "redundant_experts": 32, "routing_skew": 1.01,
                                         "dataset_skew": None}
    assert main(["--config", PREFILL, *EP72]) == 0
    text = capsys.readouterr().out
    assert "expert load: eplb, 256 experts + 32 redundant = 288 slots" in text


def test_redundant_experts_hold_weights():
    base = simulate(load_run_config(PREFILL, ["deployment.moe.redundant_experts=0"])).memory.weights_bytes
    more = simulate(load_run_config(PREFILL)).memory.weights_bytes
    assert more > base


def _error(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_run_config(PREFILL, list(overrides))
    return info.value


def test_slots_not_divisible_by_ep_is_one_clear_error():
    err = _error("deployment.moe.redundant_experts=30")
    assert err.field == "deployment.moe.redundant_experts" and err.value == 30
    assert "256 experts + 30 redundant = 286" in err.problem and "deployment.ffn.ep (32)" in err.problem
    err = _error(*[o for o in EP72 if o != "--set"], "deployment.moe.redundant_experts=0")
    assert err.field == "deployment.ffn.ep" and "256 experts do not divide by deployment.ffn.ep (72)" in err.problem
    assert "redundant" in err.problem  # says how to fix it


def test_redundant_experts_need_eplb_and_an_moe_model():
    err = _error("deployment.moe.load_balance=statistical")
    assert err.field == "deployment.moe.redundant_experts" and "load_balance: eplb" in err.problem
    with pytest.raises(ConfigError) as info:
        make_config(moe={"load_balance": "eplb", "redundant_experts": 2})
    assert info.value.field == "deployment.moe.redundant_experts" and "dense" in info.value.problem
    with pytest.raises(ConfigError) as info:
        make_config(TINY_MOE, moe={"load_balance": "random"})
    assert info.value.field == "deployment.moe.load_balance"
    with pytest.raises(ConfigError) as info:
        make_config(TINY_MOE, moe={"routing_skew": -1})
    assert info.value.field == "deployment.moe.routing_skew"


def test_plan_sizes_experts_and_exchange_for_the_most_loaded_rank():
    config = make_config(TINY_MOE, num_gpus=4, attention={"tp": 1, "dp": 4}, ffn={"ep": 4})
    plan = build_stage_plan("decode", config.model, config.deployment, config.workload, 4, 0)
    ops = {op.name: op.shape for group in plan.groups for op in group.operations}
    up, dispatch = ops["experts_up"], ops["dispatch"]
    assert up.load_factor == dispatch.load_factor > 1
    mean = up.balanced()
    assert mean.load_factor == 1 and mean.tokens_per_gpu == pytest.approx(4)
    # a balanced-load table is looked up at the most loaded rank's token count
    assert shape_grid_key(up)[1][1] == pytest.approx(4 * up.load_factor)
    assert shape_grid_key(mean)[1][1] == pytest.approx(4)
    ideal = make_config(TINY_MOE, num_gpus=4, attention={"tp": 1, "dp": 4}, ffn={"ep": 4},
                        moe={"load_balance": "ideal"})
    plan = build_stage_plan("decode", ideal.model, ideal.deployment, ideal.workload, 4, 0)
    ops = {op.name: op.shape for group in plan.groups for op in group.operations}
    assert ops["experts_up"].load_factor == 1 and ops["experts_up"].tokens_per_gpu == mean.tokens_per_gpu
    assert ops["experts_up"].active_experts == mean.active_experts


def test_exchange_traffic_scales_with_the_load_factor():
    base = TokenExchangeShape("dispatch", 100, 64, 8, 2, 16, 8, "deepep-normal")
    hot = TokenExchangeShape("dispatch", 100, 64, 8, 2, 16, 8, "deepep-normal", 1.25)
    assert hot.traffic() == pytest.approx(tuple(1.25 * t for t in base.traffic()))


def test_report_names_the_factor(capsys):
    assert main(["--config", PREFILL, "--detail"]) == 0
    text = capsys.readouterr().out
    assert text.count("expert load: eplb") == 2 and "factor = 1.000 (fullest GPU's long-run share / mean, EPLB placement) + z_P" in text
    assert main(["--config", "benchmarks/published/qwen3-8b-h20-decode.yaml", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefill"]["moe_load_balance"] is None  # dense model


def _qwen_h100(moe: dict | None = None, batch: int | str = "max"):
    from infersim.run.config import config_from_mapping

    deployment = {"num_gpus": 8, "attention": {"tp": 1, "dp": 8}, "ffn": {"tp": 1, "ep": 8},
                  "precision": {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}}
    if moe is not None:
        deployment["moe"] = moe
    return config_from_mapping({"model": "qwen3-235b-a22b", "hardware": "h100-sxm", "engine": "trtllm",
                                "deployment": deployment,
                                "workload": {"isl": 1000, "osl": 10, "decode_batch_per_gpu": batch}}, "test")


def test_tables_timed_under_skewed_routing_give_back_their_mean_load_to_that_routing():
    """aiconfigurator's MoE tables were timed on the most loaded rank under power-law routing over the
    whole batch (alpha 1.2 for Qwen3): a deployment routed that way (statistical with that long-run
    skew) is looked up at its mean load, the table's own imbalance in the time."""
    from infersim.modules.load_balance import moe_balance
    from infersim.costing.timing import kernel_cost, table_tokens_for

    cfg = _qwen_h100()
    assert cfg.tables.moe_includes_imbalance
    factor = moe_balance("statistical", 128, 8, 8, 128, 1.0, routing_skew=1.2, dataset_skew=1.2).token_factor
    shape = GroupedGemmShape(stage="decode", projection="up", num_experts=128, ep=8, topk=8, hidden=4096,
                             intermediate=1536, tokens_per_gpu=128 * factor, active_experts=16.0, dtype="fp8",
                             weight_dtype="fp8", load_factor=factor, balanced_active_experts=16.0)
    assert factor > 1.5  # the table's skew is large: most loaded rank x1.8 at EP8
    assert table_tokens_for(shape, 1.2) == pytest.approx(128, rel=1e-3)
    skewed = kernel_cost(shape, cfg.hardware, cfg.tables)
    table = cfg.tables.lookup(shape.balanced(), cfg.hardware.peak_flops("fp8"))
    assert skewed.seconds == pytest.approx(table.seconds, rel=1e-3)  # the table's own time at ~128 tokens per GPU
    # an even load of 128 tokens per GPU is the table's kernel at ~71: the rank its routing loads x1.8
    even = kernel_cost(shape.balanced(), cfg.hardware, cfg.tables)
    assert even.seconds < skewed.seconds
    assert "imbalance from the table's routing taken out" in skewed.detail


def test_skewed_routing_tables_time_other_policies_de_skewed():
    """Under any other load balance (the statistical default's even long-run load, EPLB, ideal) the
    table is read where its busiest rank carries what this deployment's busiest rank does: the table's
    kernel without the table's skew, this layout's own factor on top. No policy falls to the roofline
    (it did for EPLB, 3x off the table at prefill sizes), and the more even policy is never slower."""
    from infersim.run.simulate import simulate

    def experts(moe: dict) -> object:
        return next(op for op in simulate(_qwen_h100(moe, 64)).decode.operations if op.name == "experts_up")

    skewed = experts({"load_balance": "statistical", "dataset_skew": 1.2, "routing_skew": 1.2})
    even = experts({"load_balance": "statistical"})
    ideal = experts({"load_balance": "ideal"})
    eplb = experts({"load_balance": "eplb", "redundant_experts": 8})
    for op in (skewed, even, ideal, eplb):
        assert op.source.value == "table", op.detail
    assert ideal.time_s <= even.time_s < skewed.time_s
    assert ideal.time_s <= eplb.time_s < skewed.time_s
    assert skewed.time_s / ideal.time_s < 2.5
