"""Elementwise kernels under a kernel-table set that brings its own rule for them (aiconfigurator's
memory-bound-op share of HBM bandwidth and fixed time per op) and under tables that do not (the
hardware card's share and kernel launch overhead)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infersim.run.config import load_hardware_card
from infersim.base.errors import InferSimError
from infersim.shapes.kernels import GemmShape, MemoryBoundShape, NoTables
from infersim.tabletools import aiconfigurator as aic
from infersim.tables.lookup import load_tables
from infersim.costing.timing import kernel_cost

BUNDLED = Path(__file__).resolve().parent.parent / "mfu_tables"
AIC_H100 = BUNDLED / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20"
NORM = MemoryBoundShape("rmsnorm", bytes_moved=134_217_728.0)  # 4096 tokens x 4096 x 2 B, 2 in + 2 out


def test_tables_rule_replaces_the_cards_share() -> None:
    h100 = load_hardware_card("h100-sxm")[0]
    launch = h100.derates.kernel_launch_overhead
    with_rule = kernel_cost(NORM, h100, load_tables(AIC_H100))
    # 134,217,728 B / (3.35e12 B/s x 0.8) = 50.08 us, plus aiconfigurator's 3 us per memory-bound op
    assert with_rule.seconds == pytest.approx(50.0812e-6 + 3e-6, rel=1e-5)
    assert "0.80 of HBM bandwidth + 3 us per kernel (the kernel tables' elementwise rule)" in with_rule.detail
    # a shape of two kernels pays the rule's fixed time twice, the card's launch overhead not at all
    rope = MemoryBoundShape("rotary, KV write", bytes_moved=26_800_000.0, kernels=2)
    assert kernel_cost(rope, h100, load_tables(AIC_H100)).seconds == pytest.approx(10e-6 + 6e-6, rel=1e-12)
    card = kernel_cost(NORM, h100, NoTables())
    assert h100.derates.elementwise_memory_efficiency == 0.48
    assert card.seconds == pytest.approx(134_217_728 / (3.35e12 * 0.48) + launch, rel=1e-12)
    # measured kernels are not touched by the rule
    gemm = GemmShape(m=4096, k=4096, n=4096)
    measured = kernel_cost(gemm, h100, load_tables(AIC_H100))
    assert measured.source.value == "table" and "HBM bandwidth" not in measured.detail


def test_tables_without_a_rule_keep_the_card() -> None:
    h800 = load_hardware_card("h800")[0]
    tables = load_tables(BUNDLED / "imported" / "h800")
    assert tables.elementwise_memory_efficiency is None
    assert kernel_cost(NORM, h800, tables).seconds == kernel_cost(NORM, h800, NoTables()).seconds


def test_rule_is_read_from_aiconfigurators_system_file(tmp_path: Path) -> None:
    (tmp_path / "h100_sxm.yaml").write_text(
        "gpu:\n  mem_bw: 3350000000000\n  mem_bw_empirical_scaling_factor: 0.75 # a comment\n"
        "  mem_empirical_constant_latency: 0.000005\n")
    share, latency, source = aic.elementwise_rule(tmp_path, "h100_sxm")
    assert (share, latency) == (0.75, 5e-6)
    assert "systems/h100_sxm.yaml mem_bw_empirical_scaling_factor 0.75 + mem_empirical_constant_latency 5e-06" in source
    assert aic.elementwise_rule(tmp_path, "h200_sxm") == (None, None, "")  # no system file: no rule
    (tmp_path / "b200_sxm.yaml").write_text("gpu:\n  mem_bw_empirical_scaling_factor: 1.5\n")
    assert aic.elementwise_rule(tmp_path, "b200_sxm") == (None, None, "")  # not a share of bandwidth
    # a share without a fixed time (or with a negative one): the card's launch overhead stays
    (tmp_path / "l40s.yaml").write_text("gpu:\n  mem_bw_empirical_scaling_factor: 0.8\n"
                                        "  mem_empirical_constant_latency: -1\n")
    share, latency, source = aic.elementwise_rule(tmp_path, "l40s")
    assert (share, latency) == (0.8, None) and "constant" not in source


def test_impossible_rule_is_refused_with_file_and_key(tmp_path: Path) -> None:
    copy = tmp_path / "tables"
    shutil.copytree(AIC_H100, copy)
    text = (copy / "provenance.yaml").read_text()
    (copy / "provenance.yaml").write_text(text.replace("elementwise_memory_efficiency: 0.8",
                                                       "elementwise_memory_efficiency: 1.3"))
    with pytest.raises(InferSimError, match=r"provenance.yaml.*elementwise_memory_efficiency.*1.3"):
        load_tables(copy)
    (copy / "provenance.yaml").write_text(text.replace("elementwise_latency: 3.0e-06", "elementwise_latency: 0.5"))
    with pytest.raises(InferSimError, match=r"provenance.yaml.*elementwise_latency.*0.5"):
        load_tables(copy)
