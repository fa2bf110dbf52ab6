"""DeepEP low-latency exchange: one message per (token, expert), NVLink to same-node peers, NIC across."""

from __future__ import annotations

import pytest
import yaml

from conftest import public_reference
from infersim.config import load_hardware_card
from infersim.kernels import TokenExchangeShape
from infersim.modules.comm import token_exchange_cost


def test_low_latency_traffic_by_hand():
    # 10 tokens, top-4 of 64 experts over EP16 on 2 nodes of 8: 40 copies of 100 bytes, spread evenly
    shape = TokenExchangeShape("dispatch", 10, 100.0, 64, 4, 16, 8, "deepep-low-latency")
    intra, inter = shape.traffic()
    assert intra == pytest.approx(40 * 100 * 7 / 16)  # same node, other GPUs
    assert inter == pytest.approx(40 * 100 * 8 / 16)  # the other node
    # no merging: a per-GPU exchange (NCCL) sends fewer bytes to the same peers
    nccl = TokenExchangeShape("dispatch", 10, 100.0, 64, 4, 16, 8, "nccl")
    assert sum(nccl.traffic()) < intra + inter


def test_deepep_low_latency_kernel_times_within_30_percent():
    """DeepEP's published low-latency times (H800, CX7 400 Gb/s), 128 tokens, hidden 7168, top-8 of
    256 experts; fp8 dispatch with one fp32 scale per 128 values, bf16 combine."""
    points = {p["id"]: p["value"] for p in yaml.safe_load(public_reference("validation.yaml").read_text())["data_points"]}
    hw, _ = load_hardware_card("h800")
    for ep in (8, 16, 32, 64, 128, 256):
        measured = points[f"deepep-ll-ep{ep}"]
        dispatch = token_exchange_cost(TokenExchangeShape("dispatch", 128, 7168 + 7168 / 128 * 4, 256, 8, ep, 8,
                                                          "deepep-low-latency"), hw).seconds
        combine = token_exchange_cost(TokenExchangeShape("combine", 128, 7168 * 2, 256, 8, ep, 8,
                                                         "deepep-low-latency"), hw).seconds
        assert dispatch * 1e6 == pytest.approx(measured["dispatch_us"], rel=0.3), ep
        assert combine * 1e6 == pytest.approx(measured["combine_us"], rel=0.3), ep


def test_group_limited_routing_bounds_the_nodes_a_token_reaches():
    # DeepSeek-V3: 8 groups of 32 experts, 4 groups per token; EP64 on 8 nodes holds one group per node
    limited = TokenExchangeShape("dispatch", 1, 1.0, 256, 8, 64, 8, "deepep-normal", 1.0, 8, 4)
    assert limited.node_hit == pytest.approx(1 - 35 / 70)  # 1 - C(7,4)/C(8,4): exactly 4 of 8 nodes
    uniform = TokenExchangeShape("dispatch", 1, 1.0, 256, 8, 64, 8, "deepep-normal")
    assert uniform.node_hit * 8 > 5  # top-8 of 256 uniformly reaches ~5.3 of 8 nodes
    # two groups per node at EP32 (4 nodes): 1 - C(6,4)/C(8,4)
    assert TokenExchangeShape("dispatch", 1, 1.0, 256, 8, 32, 8, "deepep-normal", 1.0, 8, 4).node_hit == \
        pytest.approx(1 - 15 / 70)
    assert limited.traffic()[1] < uniform.traffic()[1]


def test_deepseek_cards_carry_group_limited_routing():
    from infersim.config import load_model_card

    for name in ("deepseek-v3", "deepseek-v3.2"):
        card, _ = load_model_card(name)
        assert (card.n_group, card.topk_group) == (8, 4)
