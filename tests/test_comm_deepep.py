"""DeepEP low-latency exchange: one message per (token, expert), NVLink to same-node peers, NIC across."""

from __future__ import annotations

import pytest
import yaml

from conftest import shared_reference
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
    points = {p["id"]: p["value"] for p in yaml.safe_load(shared_reference("validation.yaml").read_text())["data_points"]}
    hw, _ = load_hardware_card("h800")
    for ep in (8, 16, 32, 64, 128, 256):
        measured = points[f"deepep-ll-ep{ep}"]
        dispatch = token_exchange_cost(TokenExchangeShape("dispatch", 128, 7168 + 7168 / 128 * 4, 256, 8, ep, 8,
                                                          "deepep-low-latency"), hw).seconds
        combine = token_exchange_cost(TokenExchangeShape("combine", 128, 7168 * 2, 256, 8, ep, 8,
                                                         "deepep-low-latency"), hw).seconds
        assert dispatch * 1e6 == pytest.approx(measured["dispatch_us"], rel=0.3), ep
        assert combine * 1e6 == pytest.approx(measured["combine_us"], rel=0.3), ep
