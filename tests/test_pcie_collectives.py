"""Collectives between GPUs without NVLink (PCIe), beyond a bridged pair, and over AMD's Infinity
Fabric mesh, against NCCL's (RCCL's) model derived by hand.

Single node, NCCL Tree latency with per-link bytes (infersim/modules/comm.py):
    time = base + m x (ranks - 1) x hop + bytes each GPU sends / (link bandwidth x protocol efficiency)
with m = 2 and 2(n-1)/n of the buffer for an all-reduce; the fastest protocol wins, LL128 never over
PCIe (NCCL enables it only where every intra-node hop is NVLink).

L4 (hardware/l4.yaml): PCIe Gen4 32e9 B/s per direction; tiers 2 GPUs 0.62, 4 GPUs 0.16, 8 GPUs 0.045;
NCCL PCI Tree hwLat LL 1.0, Simple 4.0 us; baseLat LL 6.8, Simple 8.4 us; LL carries half its bytes.
  TP2, 64 MiB: Simple 8.4 + 2 x 1 x 4.0 = 16.4 us + 64 MiB / (32e9 x 0.62 = 19.84e9)
               (LL: 8.8 us + 64 MiB / 9.92e9, twice the transfer)
  TP4, 64 MiB: Simple 8.4 + 2 x 3 x 4.0 = 32.4 us + 1.5 x 64 MiB / (32e9 x 0.16 = 5.12e9)
  TP2, 4 KiB:  LL 6.8 + 2 x 1.0 = 8.8 us + 4 KiB / 9.92e9 (Simple: 16.4 us + 4 KiB / 19.84e9)
MI300X (hardware/mi300x.yaml): 7 Infinity Fabric links of 64e9 B/s per direction, 75% usable, a full
mesh: TP2 uses one link (48e9), TP8 all seven (336e9); RCCL Ring Simple base 17.0, hop 2.1 us.
  TP2, 64 MiB: 17.0 + 2 x 2.1 = 21.2 us + 64 MiB / 48e9
  TP8, 64 MiB: 17.0 + 14 x 2.1 = 46.4 us + 1.75 x 64 MiB / 336e9
H100 NVL (hardware/h100-nvl.yaml): NVLink 300e9 x 0.8 = 240e9 within a bridged pair (NVLink Tree
Simple hop 4.0 us); 4 GPUs cross PCIe Gen5 at 64e9 x 0.40 = 25.6e9 with PCI hops.
  TP2, 64 MiB: 16.4 us + 64 MiB / 240e9
  TP4, 64 MiB: 32.4 us + 1.5 x 64 MiB / 25.6e9
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from infersim.shapes.comm_shapes import CollectiveShape, TokenExchangeShape
from infersim.run.config import load_hardware_card
from infersim.base.errors import ConfigError
from infersim.modules.comm import collective_cost, intra_node_link, p2p_bandwidth, token_exchange_cost

L4, _ = load_hardware_card("l4")
MI300X, _ = load_hardware_card("mi300x")
H100_NVL, _ = load_hardware_card("h100-nvl")
H100, _ = load_hardware_card("h100-sxm")
KIB, MIB = 1024, 1024 * 1024


def _all_reduce(hw, size: float, ranks: int, per_node: int = 8):
    return collective_cost(CollectiveShape("all_reduce", size, ranks, per_node), hw)


@pytest.mark.parametrize(("hw", "size", "ranks", "expected", "protocol"), [
    (L4, 64 * MIB, 2, 16.4e-6 + 64 * MIB / 19.84e9, "Simple protocol over PCIe"),
    (L4, 64 * MIB, 4, 32.4e-6 + 1.5 * 64 * MIB / 5.12e9, "Simple protocol over PCIe"),
    (L4, 4 * KIB, 2, 8.8e-6 + 4 * KIB / 9.92e9, "LL protocol over PCIe"),
    (MI300X, 64 * MIB, 2, 21.2e-6 + 64 * MIB / 48e9, "Simple protocol"),
    (MI300X, 64 * MIB, 8, 46.4e-6 + 1.75 * 64 * MIB / 336e9, "Simple protocol"),
    (H100_NVL, 64 * MIB, 2, 16.4e-6 + 64 * MIB / 240e9, "Simple protocol"),
    (H100_NVL, 64 * MIB, 4, 32.4e-6 + 1.5 * 64 * MIB / 25.6e9, "Simple protocol over PCIe"),
], ids=["l4-tp2-64MiB", "l4-tp4-64MiB", "l4-tp2-4KiB", "mi300x-tp2", "mi300x-tp8", "h100nvl-pair", "h100nvl-tp4"])
def test_all_reduce_by_hand(hw, size, ranks, expected, protocol):
    cost = _all_reduce(hw, size, ranks)
    assert cost.seconds == pytest.approx(expected, rel=1e-9)
    assert cost.detail.endswith(protocol)
    assert cost.detail.startswith("RCCL" if hw.vendor == "amd" else "NCCL")


def test_a_group_takes_the_smallest_pcie_tier_that_holds_it():
    # 3 GPUs do not fit the 2-GPU tier (behind one switch): they run at the 4-GPU tier's 0.16
    assert intra_node_link(L4, 3).bandwidth == pytest.approx(32e9 * 0.16)
    assert intra_node_link(L4, 2).bandwidth == pytest.approx(32e9 * 0.62)
    assert intra_node_link(L4, 8).bandwidth == pytest.approx(32e9 * 0.045)
    assert not intra_node_link(H100_NVL, 2).over_pcie and intra_node_link(H100_NVL, 3).over_pcie


def test_a_mesh_gives_a_group_one_link_per_peer():
    per_link = 64e9 * 0.75
    for gpus in range(2, 9):
        assert intra_node_link(MI300X, gpus).bandwidth == pytest.approx((gpus - 1) * per_link)
        assert intra_node_link(MI300X, gpus).name == "Infinity Fabric"
    # behind an NVSwitch every group reaches the whole per-GPU bandwidth
    assert intra_node_link(H100, 2).bandwidth == intra_node_link(H100, 8).bandwidth == pytest.approx(450e9 * 0.8)


def test_kv_transfer_between_instances_runs_one_link_per_gpu_pair():
    assert p2p_bandwidth(MI300X, 8) == (pytest.approx(64e9 * 0.75), "Infinity Fabric")  # one xGMI link, not seven
    assert p2p_bandwidth(H100, 8) == (pytest.approx(450e9 * 0.8), "NVLink")
    assert p2p_bandwidth(L4, 4) == (pytest.approx(32e9 * 0.16), "PCIe")


def test_ll128_never_runs_over_pcie():
    """Even where its latency and bandwidth would win, NCCL does not run LL128 over PCIe."""
    free = replace(L4.derates.collective_latency["LL128"], base=0.0, pcie_hop=0.0, bandwidth_efficiency=1.0)
    card = replace(L4, derates=replace(L4.derates, collective_latency={**L4.derates.collective_latency,
                                                                         "LL128": free}))
    cost = _all_reduce(card, 64 * MIB, 2)
    assert "LL128" not in cost.detail
    assert cost.seconds == pytest.approx(16.4e-6 + 64 * MIB / 19.84e9, rel=1e-9)


def test_a_disabled_protocol_is_not_picked():
    """MI300X's LL128 is off (RCCL enables it only where the platform model says so): switching it on
    with Simple's bandwidth and LL's latency would make it win."""
    on = replace(MI300X.derates.collective_latency["LL128"], enabled=True, bandwidth_efficiency=1.0)
    card = replace(MI300X, derates=replace(MI300X.derates, collective_latency={
        **MI300X.derates.collective_latency, "LL128": on}))
    assert "Simple" in _all_reduce(MI300X, 64 * MIB, 8).detail
    enabled = _all_reduce(card, 64 * MIB, 8)
    assert "LL128" in enabled.detail
    assert enabled.seconds == pytest.approx((12.0 + 14 * 0.8) * 1e-6 + 1.75 * 64 * MIB / 336e9, rel=1e-9)


def test_pcie_across_nodes_uses_nccls_pci_ring_hops():
    """L4 all-gather of 256 MiB over 2 nodes x 2 GPUs (25e9 B/s NIC per GPU at 0.85). Ring only;
    nsteps 3, the last chunk crosses ceil(3 / 2) = 2 NET edges, 1 intra step. Ring Simple:
    8.4 + 1 x max(PCI Ring Simple 5.7, NET overhead 1.0 x 3) + 2 x NET Ring Simple 14.0 = 42.1 us;
    bus bandwidth min(PCIe 32e9 x 0.62 = 19.84e9, 2 NICs 42.5e9) = 19.84e9, x 4/3 algorithm
    bandwidth; LL is capped at half the bus. + the 4 us launch gap."""
    cost = collective_cost(CollectiveShape("all_gather", 256 * MIB, 4, 2), L4)
    assert cost.seconds == pytest.approx((4.0 + 42.1) * 1e-6 + 256 * MIB / (19.84e9 * 4 / 3), rel=1e-9)
    assert "Ring Simple" in cost.detail


def test_a_card_without_the_pcie_facts_says_which_it_lacks():
    no_nvlink = replace(H100, peak=replace(H100.peak, nvlink_bandwidth=0.0))
    with pytest.raises(ConfigError) as err:
        _all_reduce(no_nvlink, MIB, 2)
    assert err.value.field == "derates.pcie_collective"
    assert "no NVLink: peak.nvlink_bandwidth is 0" in str(err.value)
    tiers_only = replace(no_nvlink, derates=replace(L4.derates, collective_latency={
        name: replace(lat, pcie_hop=None) for name, lat in L4.derates.collective_latency.items()}))
    with pytest.raises(ConfigError) as err:
        _all_reduce(tiers_only, MIB, 2)
    assert err.value.field.endswith(".pcie_hop")
    # a layout of data-parallel ranks alone talks over nothing, and needs neither
    assert _all_reduce(no_nvlink, MIB, 1).seconds == 0.0


def test_deepep_needs_nvlink_inside_a_node():
    shape = TokenExchangeShape("dispatch", 128, 7168, 256, 8, 4, 4, implementation="deepep-normal")
    with pytest.raises(ConfigError, match="DeepEP exchanges a node's tokens over NVLink"):
        token_exchange_cost(shape, L4)
    nccl = token_exchange_cost(replace(shape, implementation="nccl"), L4)
    assert "MB PCIe" in nccl.detail and nccl.seconds > 0


def test_rccl_across_nodes_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="RCCL, whose multi-node tuning .* is not modelled"):
        collective_cost(CollectiveShape("all_reduce", MIB, 16, 8), MI300X)
