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
            "l40s", "rtx-a6000", "rtx-pro-6000"}

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
    """constants.md section 2: NCCL tuning.cc Tree baseLat / hwLat (NVLINK, NET), in seconds."""
    expected = {"LL": (6.8e-6, 0.6e-6, 5.0e-6, 0.5),
                "LL128": (14.0e-6, 1.25e-6, 8.5e-6, 0.95),
                "Simple": (8.4e-6, 4.0e-6, 14e-6, 1.0)}
    for card in cards.values():
        for proto, (base, nvl, net, eff) in expected.items():
            lat = card.derates.collective_latency[proto]
            assert (lat.base, lat.nvlink_hop, lat.network_hop, lat.bandwidth_efficiency) == pytest.approx(
                (base, nvl, net, eff)), (card.name, proto)
            # NCCL tuning.cc v2.7.3-v2.17.1: LL's intra-node latency x 1.8 once the communicator spans nodes
            assert lat.nvlink_hop_factor_across_nodes == (1.8 if proto == "LL" else 1.0), (card.name, proto)


def test_derates_are_fractions_below_peak(cards):
    for card in cards.values():
        assert set(card.derates.compute_efficiency) <= set(card.peak.flops), card.name
        assert card.derates.deepep_normal_sms < card.peak.sm_count
