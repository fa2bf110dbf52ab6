"""Bundled kernel tables chosen by device and engine framework (infersim.mfu.select), and the
bundled aiconfigurator tables themselves: they load, carry the licence notice and serve the shapes
of the dense models the batch-1 prefill check uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.kernels import AttentionShape, GemmShape
from infersim.mfu.lookup import load_tables
from infersim.mfu.select import TableChoice, bundled_tables_for

BUNDLED = Path(__file__).resolve().parent.parent / "mfu_tables"
AIC_DEVICES = ("h100-sxm", "h200", "b200", "gb200")


def make_root(tmp_path: Path, dirs: list[str]) -> Path:
    for rel in dirs:
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "provenance.yaml").write_text("format_version: 1\n")
    return tmp_path


def test_same_device_and_framework_newest_version(tmp_path: Path) -> None:
    root = make_root(tmp_path, ["aiconfigurator/h100-sxm/trtllm-1.2.0rc5", "aiconfigurator/h100-sxm/trtllm-1.3.0rc20",
                                "aiconfigurator/h100-sxm/trtllm-1.3.0", "aiconfigurator/h100-sxm/sglang-0.5.14",
                                "aiconfigurator/h200/trtllm-1.3.0rc20"])
    choice = bundled_tables_for("h100-sxm", "trtllm", root)
    assert choice == TableChoice(root / "aiconfigurator/h100-sxm/trtllm-1.3.0", "trtllm", "1.3.0",
                                 "kernel tables for h100-sxm and engine trtllm: trtllm 1.3.0 (h100-sxm/trtllm-1.3.0); "
                                 "other versions bundled: 1.3.0rc20, 1.2.0rc5")
    assert bundled_tables_for("h100-sxm", "sglang", root).path == root / "aiconfigurator/h100-sxm/sglang-0.5.14"


def test_fallback_to_another_framework_says_so(tmp_path: Path) -> None:
    root = make_root(tmp_path, ["aiconfigurator/h100-sxm/vllm-0.24.0", "aiconfigurator/h100-sxm/sglang-0.5.14",
                                "imported/h20"])
    choice = bundled_tables_for("h100-sxm", "trtllm", root)
    assert choice is not None and choice.framework == "sglang"
    assert choice.note == ("kernel tables for h100-sxm: no trtllm tables bundled for h100-sxm; took sglang 0.5.14 "
                           "(h100-sxm/sglang-0.5.14) instead: kernel times are those of another engine's kernels")
    none_given = bundled_tables_for("h100-sxm", None, root)
    assert none_given.path == root / "aiconfigurator/h100-sxm/sglang-0.5.14"
    assert none_given.note.endswith("no engine given; took sglang 0.5.14 (h100-sxm/sglang-0.5.14)")
    # the original InferSim's imported tables are SGLang-class kernels
    h20 = bundled_tables_for("h20", "sglang", root)
    assert h20 == TableChoice(root / "imported/h20", "sglang", "unknown",
                              "kernel tables for h20 and engine sglang: sglang-class kernels (imported/h20)")
    assert bundled_tables_for("h20", "vllm", root).path == root / "imported/h20"
    assert bundled_tables_for("a100-sxm-80g", "trtllm", root) is None


def test_directories_without_provenance_are_not_candidates(tmp_path: Path) -> None:
    (tmp_path / "aiconfigurator/h200/trtllm-1.3.0rc20").mkdir(parents=True)
    assert bundled_tables_for("h200", "trtllm", tmp_path) is None


def test_bundled_choices() -> None:
    for device in AIC_DEVICES:
        choice = bundled_tables_for(device, "trtllm")
        assert choice is not None and choice.path == BUNDLED / "aiconfigurator" / device / "trtllm-1.3.0rc20"
    assert bundled_tables_for("h800", "trtllm").path == BUNDLED / "imported" / "h800"
    assert bundled_tables_for("rtx-a6000", "vllm") is None


@pytest.mark.parametrize("device", AIC_DEVICES)
def test_bundled_aiconfigurator_tables_load_with_licence(device: str) -> None:
    tables = load_tables(BUNDLED / "aiconfigurator" / device / "trtllm-1.3.0rc20")
    prov = tables.provenance
    assert prov.source["license"] == "Apache-2.0" and prov.notes[0].startswith("Apache-2.0")
    assert prov.software["framework"] == "trtllm" and prov.software["package"] == "aiconfigurator-core"
    assert tables.moe_includes_imbalance


def test_bundled_h100_tables_serve_llama_2_7b_prefill() -> None:
    """Llama-2-7B at TP1: QKV (4096 x 12288) and O are measured (K, N); the MLP's 11008 lies between
    measured K and N and is interpolated; attention 32-32-128 prefill at 4096 tokens is a grid point."""
    tables = load_tables(BUNDLED / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20")
    peak = tables.provenance.peak_flops["bf16"]
    qkv = tables.lookup(GemmShape(m=4096, k=4096, n=12288), peak)
    assert qkv is not None and qkv.method == "exact"
    assert qkv.seconds == pytest.approx(515.2266820e-6, rel=1e-6)
    down = tables.lookup(GemmShape(m=4096, k=11008, n=4096), peak)
    assert down is not None and down.method == "interpolated" and "k=11008 between 10240 and 12288" in down.note
    attention = tables.lookup(AttentionShape(kind="mha", stage="prefill", batch=1, q_len=4096, kv_len=4096,
                                             num_heads=32, num_kv_heads=32, qk_head_dim=128, v_head_dim=128,
                                             causal=True, dtype="bf16", kv_dtype="bf16"), peak)
    assert attention is not None and attention.method == "exact"


def test_report_line_names_engine_and_routing() -> None:
    tables = load_tables(BUNDLED / "aiconfigurator" / "h200" / "trtllm-1.3.0rc20")
    line = tables.describe()
    assert "engine trtllm 1.3.0rc20" in line
    assert ("MoE tables timed under power_law_1.01, power_law_1.2 routing: expert-load imbalance included; "
            "elementwise kernels at 0.80 of HBM bandwidth (aiconfigurator's rule for memory-bound ops: "
            "systems/h200_sxm.yaml mem_bw_empirical_scaling_factor 0.8") in line
