"""Every hardware card loads through the schema, is named after its file, carries a source comment
on every number, and holds the hand-checked datasheet values below."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infersim.cards.hardware import HardwareCard, validate_hardware
from infersim.cards.schema import build, load_yaml

HARDWARE_DIR = Path(__file__).resolve().parent.parent / "hardware"
CARD_PATHS = sorted(HARDWARE_DIR.glob("*.yaml"))
EXPECTED = {"h20", "h800", "h100-sxm", "h200", "a100-sxm-80g", "a100-sxm-40g", "b200", "gb200", "b300", "gb300",
            "l40s", "rtx-a6000", "rtx-pro-6000", "mi300x", "mi325x", "mi355x", "l4", "a10g", "rtx-4090", "rtx-5090",
            "h100-pcie", "h100-nvl"}

# `key: value` where the value is a plain number (int, float, or "989e12"-style text).
_NUMERIC_LINE = re.compile(r"^\s*[\w.-]+\s*:\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*(#.*)?$")


def load_card(path: Path) -> HardwareCard:
    return validate_hardware(build(HardwareCard, load_yaml(path), str(path)), str(path))


@pytest.fixture(scope="module")
def cards() -> dict[str, HardwareCard]:
    return {path.stem: load_card(path) for path in CARD_PATHS}


def test_expected_cards_present():
    assert EXPECTED <= {p.stem for p in CARD_PATHS}


@pytest.mark.parametrize("path", CARD_PATHS, ids=lambda p: p.stem)
def test_card_loads_and_is_named_after_file(path: Path):
    card = load_card(path)
    assert card.name == path.stem
    assert card.description
    assert set(card.derates.collective_latency) == {"LL", "LL128", "Simple"}
    # every format with a peak rate is a real tensor-core format; bf16 and its fp16 twin agree
    assert card.peak.flops.get("fp16", card.peak.flops["bf16"]) == card.peak.flops["bf16"]


@pytest.mark.parametrize("path", CARD_PATHS, ids=lambda p: p.stem)
def test_every_number_has_a_source_comment(path: Path):
    missing = [
        f"{path.name}:{i}: {line.strip()}"
        for i, line in enumerate(path.read_text().splitlines(), start=1)
        if _NUMERIC_LINE.match(line) and "#" not in line
    ]
    assert not missing, "numbers without a source comment:\n" + "\n".join(missing)


def test_hand_checked_values(cards):
    h800, h100, h20, h200 = cards["h800"], cards["h100-sxm"], cards["h20"], cards["h200"]
    a100, b200, gb200, a6000 = cards["a100-sxm-80g"], cards["b200"], cards["gb200"], cards["rtx-a6000"]

    # H800: H100 SXM compute, NVLink 400 GB/s bidirectional
    assert h800.peak.flops["bf16"] == pytest.approx(989.4e12)
    assert h800.peak.flops["fp8"] == pytest.approx(1978.9e12)
    assert h800.peak.nvlink_bandwidth == pytest.approx(200e9)
    assert h800.peak.flops == h100.peak.flops == h200.peak.flops
    assert h100.peak.nvlink_bandwidth == pytest.approx(450e9)

    # H20
    assert h20.peak.hbm_bandwidth == pytest.approx(4.0e12)
    assert h20.peak.hbm_bytes == 97871 * 2**20  # nvidia-smi memory.total in MiB: the '96 GB' is GiB
    assert h20.peak.flops["bf16"] == pytest.approx(148e12)
    assert h20.peak.sm_count == 78
    assert h20.usd_per_gpu_hour == pytest.approx(13.5 / 24 * 2.10)

    # H200
    assert h200.peak.hbm_bytes == 143771 * 2**20
    assert h200.peak.hbm_bandwidth == pytest.approx(4.8e12)
    assert h200.usd_per_gpu_hour == pytest.approx(3.5 / 2.5 * 2.10)

    # A100: no FP8 tensor cores
    assert "fp8" not in a100.peak.flops
    assert a100.peak.flops["bf16"] == pytest.approx(312e12)
    assert a100.peak.flops["int8"] == pytest.approx(624e12)
    assert a100.usd_per_gpu_hour == pytest.approx(2.26 * 2 / 3, rel=1e-4)

    # Blackwell: dense rates, one NVLink domain of 72 for NVL72
    assert b200.peak.flops["bf16"] == pytest.approx(2.25e15)
    assert b200.peak.flops["fp4"] == pytest.approx(9e15)
    assert gb200.peak.gpus_per_node == 72
    assert gb200.peak.hbm_bytes == 189471 * 2**20
    assert b200.peak.nvlink_bandwidth == gb200.peak.nvlink_bandwidth == pytest.approx(900e9)

    # RTX A6000: dense tensor rate is half the datasheet's sparse 309.7 TFLOPS; no DeepEP
    assert a6000.peak.flops["bf16"] == pytest.approx(154.8e12)
    assert a6000.peak.hbm_bandwidth == pytest.approx(768e9)
    assert a6000.host_memory_bytes == pytest.approx(252e9)
    assert a6000.derates.deepep_normal_sms == 0


def test_hand_checked_values_of_amd_and_pcie_cards(cards):
    mi300x, mi325x, mi355x = cards["mi300x"], cards["mi325x"], cards["mi355x"]
    # CDNA 3: 304 CUs x 4,096 FP8 FLOP/clock x 2.1 GHz; the MI325X is the same chip with HBM3E
    assert mi300x.peak.flops["fp8"] == pytest.approx(304 * 4096 * 2.1e9, rel=1e-4)
    assert mi300x.peak.flops == mi325x.peak.flops and "fp4" not in mi300x.peak.flops
    assert mi300x.peak.hbm_bytes == 196288 * 2**20 and mi325x.peak.hbm_bytes == 256 * 2**30
    assert (mi300x.peak.hbm_bandwidth, mi325x.peak.hbm_bandwidth, mi355x.peak.hbm_bandwidth) == (5.3e12, 6e12, 8e12)
    # CDNA 4: 256 CUs x 8,192 FP8 FLOP/clock x 2.4 GHz; FP6 and FP4 at twice FP8, BF16 at half
    assert mi355x.peak.flops["fp8"] == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert mi355x.peak.flops["fp4"] == mi355x.peak.flops["fp6"] == pytest.approx(2 * mi355x.peak.flops["fp8"], rel=1e-4)
    assert mi355x.peak.flops["bf16"] == pytest.approx(mi355x.peak.flops["fp8"] / 2)
    # Infinity Fabric: 7 links per GPU, 128 (153.6) GB/s bidirectional each
    assert mi300x.peak.nvlink_bandwidth == mi325x.peak.nvlink_bandwidth == pytest.approx(7 * 64e9)
    assert mi355x.peak.nvlink_bandwidth == pytest.approx(7 * 76.8e9)

    l4, a10g, r4090, r5090 = cards["l4"], cards["a10g"], cards["rtx-4090"], cards["rtx-5090"]
    pcie, nvl, sxm = cards["h100-pcie"], cards["h100-nvl"], cards["h100-sxm"]
    # dense = half the datasheets' "with sparsity" figures
    assert (l4.peak.flops["bf16"], l4.peak.flops["fp8"]) == pytest.approx((242e12 / 2, 485e12 / 2))
    assert (pcie.peak.flops["bf16"], pcie.peak.flops["fp8"]) == pytest.approx((1513e12 / 2, 3026e12 / 2))
    assert (nvl.peak.flops["bf16"], nvl.peak.flops["fp8"]) == pytest.approx((1671e12 / 2, 3341e12 / 2))
    # GeForce: FP32 accumulation at half the FP16-accumulate rate (Ada whitepaper, RTX 4090: 330.3 -> 165.2)
    assert r4090.peak.flops["bf16"] == pytest.approx(330.3e12 / 2, rel=1e-3)
    assert r5090.peak.flops["fp4"] == pytest.approx(3352e12 / 2)
    # no FP8 before Ada; no published int8 rate for the A10G
    assert set(a10g.peak.flops) == {"bf16", "fp16"}
    # HBM as the driver reports it
    assert (l4.peak.hbm_bytes, r4090.peak.hbm_bytes, nvl.peak.hbm_bytes) == (23034 * 2**20, 24564 * 2**20, 95830 * 2**20)
    assert pcie.peak.hbm_bytes == sxm.peak.hbm_bytes
    # links: no NVLink on the PCIe cards (H100 PCIe taken without bridges); H100 NVL bridges pairs
    assert all(card.nvlink_gpus == 1 for card in (l4, a10g, r4090, r5090, pcie))
    assert (nvl.nvlink_gpus, nvl.peak.nvlink_bandwidth) == (2, 300e9)
    assert pcie.peak.pcie_bandwidth == r5090.peak.pcie_bandwidth == 2 * l4.peak.pcie_bandwidth == 64e9


def test_hand_checked_values_of_the_aiconfigurator_gpus(cards):
    a40, a80 = cards["a100-sxm-40g"], cards["a100-sxm-80g"]
    # A100 40GB: the 80GB part's GA100 (tensor rates, SMs, L2, NVLink), HBM2 at 1,555 GB/s, 40,960 MiB
    assert a40.peak.flops == a80.peak.flops and a40.peak.sm_count == a80.peak.sm_count == 108
    assert a40.peak.hbm_bandwidth == pytest.approx(1.555e12) and a40.peak.hbm_bytes == 40960 * 2**20
    assert a40.peak.nvlink_bandwidth == a80.peak.nvlink_bandwidth

    # L40S: datasheet dense 362.05 / 733 TFLOPS, 864 GB/s GDDR6, PCIe Gen4 only: no NVLink
    l40s = cards["l40s"]
    assert (l40s.peak.flops["bf16"], l40s.peak.flops["fp8"]) == pytest.approx((362.05e12, 733e12))
    assert l40s.peak.hbm_bandwidth == pytest.approx(864e9) and l40s.peak.hbm_bytes == 46068 * 2**20
    assert l40s.peak.nvlink_bandwidth == 0 and l40s.peak.pcie_bandwidth == pytest.approx(32e9)
    assert l40s.compute_capability == 8.9 and l40s.peak.sm_count == 18176 // 128

    # RTX PRO 6000 Blackwell Server: 4,000 sparse FP4 TOPS -> 2e15 dense; GDDR7 512 bit x 28 Gb/s; PCIe Gen5 only
    pro = cards["rtx-pro-6000"]
    assert pro.peak.flops["fp4"] == pytest.approx(4000e12 / 2)
    assert pro.peak.flops["bf16"] == pytest.approx(pro.peak.flops["fp4"] / 4)
    assert pro.peak.hbm_bandwidth == pytest.approx(512 * 28e9 / 8) and pro.peak.hbm_bytes == 97887 * 2**20
    assert pro.peak.nvlink_bandwidth == 0 and pro.peak.pcie_bandwidth == pytest.approx(64e9)
    assert pro.peak.sm_count == 24064 // 128

    # Blackwell Ultra: B300 (HGX) and GB300 (NVL72): FP4 14 / 15 PFLOPS dense, INT8 cut to 153.5 / 165 TOPS
    b300, gb300 = cards["b300"], cards["gb300"]
    assert (b300.peak.flops["fp4"], gb300.peak.flops["fp4"]) == pytest.approx((14e15, 15e15))
    assert (b300.peak.flops["int8"], gb300.peak.flops["int8"]) == pytest.approx((153.5e12, 165e12))
    assert b300.peak.hbm_bytes == 275040 * 2**20 and gb300.peak.hbm_bytes == 284208 * 2**20
    assert (b300.peak.gpus_per_node, gb300.peak.gpus_per_node) == (8, 72)
    assert b300.peak.network_bandwidth == gb300.peak.network_bandwidth == pytest.approx(800e9 / 8)
    assert b300.compute_capability == gb300.compute_capability == 10.3


def test_collective_latency_is_nccl_tree(cards):
    """constants.md section 2: NCCL tuning.cc Tree baseLat / hwLat (NVLINK, PCI, NET), in seconds, on
    every NVIDIA card; a card that may talk over PCIe must hold the PCI values."""
    expected = {"LL": (6.8e-6, 0.6e-6, 5.0e-6, 0.5, 1.0e-6),
                "LL128": (14.0e-6, 1.25e-6, 8.5e-6, 0.95, 1.9e-6),
                "Simple": (8.4e-6, 4.0e-6, 14e-6, 1.0, 4.0e-6)}
    for card in cards.values():
        if card.vendor != "nvidia":
            continue
        for proto, (base, nvl, net, eff, pci) in expected.items():
            lat = card.derates.collective_latency[proto]
            assert (lat.base, lat.nvlink_hop, lat.network_hop, lat.bandwidth_efficiency) == pytest.approx(
                (base, nvl, net, eff)), (card.name, proto)
            assert lat.pcie_hop is None or lat.pcie_hop == pytest.approx(pci), (card.name, proto)
            assert lat.enabled, (card.name, proto)
            # NCCL tuning.cc v2.7.3-v2.17.1: LL's intra-node latency x 1.8 once the communicator spans nodes
            assert lat.nvlink_hop_factor_across_nodes == (1.8 if proto == "LL" else 1.0), (card.name, proto)


def test_collective_latency_is_rccl_ring_on_amd(cards):
    """ROCm/rccl src/graph/tuning.cc: baseLat and the gfx942/gfx950 tuning models' hwLat (xGMI, PCI) of
    the Ring column (RCCL skips Tree Simple on one node of these GPUs), NET of the Tree column, and
    bwRatio (Ring, <= 2 nodes); LL128 on only where RCCL enables it (gfx950)."""
    expected = {"LL": (12.0e-6, 0.8e-6, 2.2e-6, 10.5e-6, 0.08),
                "LL128": (12.0e-6, 0.8e-6, 2.2e-6, 10.5e-6, 0.08),
                "Simple": (17.0e-6, 2.1e-6, 5.7e-6, 25.0e-6, 1.0)}
    amd = {name: card for name, card in cards.items() if card.vendor == "amd"}
    assert set(amd) == {"mi300x", "mi325x", "mi355x"}
    for card in amd.values():
        assert card.compute_capability is None
        assert card.peak.nvlink_topology == "mesh" and card.nvlink_gpus == 8
        for proto, values in expected.items():
            lat = card.derates.collective_latency[proto]
            assert (lat.base, lat.nvlink_hop, lat.pcie_hop, lat.network_hop, lat.bandwidth_efficiency) == pytest.approx(
                values), (card.name, proto)
            assert lat.nvlink_hop_factor_across_nodes == 1.0
        assert card.derates.collective_latency["LL128"].enabled == (card.name == "mi355x")


def test_cards_whose_gpus_talk_over_pcie_state_the_pcie_path(cards):
    """A node whose GPUs are not all in one NVLink domain holds PCIe tiers up to the whole node and
    the PCI step latencies: TP across it is priced, not refused."""
    for card in cards.values():
        if card.nvlink_gpus >= card.peak.gpus_per_node:
            continue
        tiers = card.derates.pcie_collective
        assert tiers and tiers[-1].gpus == card.peak.gpus_per_node, card.name
        assert all(a.efficiency >= b.efficiency for a, b in zip(tiers, tiers[1:])), card.name  # bigger groups, slower
        assert all(lat.pcie_hop for lat in card.derates.collective_latency.values()), card.name


def test_derates_are_fractions_below_peak(cards):
    for card in cards.values():
        assert set(card.derates.compute_efficiency) <= set(card.peak.flops), card.name
        assert card.derates.deepep_normal_sms < card.peak.sm_count
