"""Predicted numbers of kernel points checked by hand against the roofline and kernel_cost, the
statistics on hand-made errors, and the statistics end to end on a synthetic reference file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infersim.run.config import load_hardware_card
from infersim.shapes.comm_shapes import TokenExchangeShape
from infersim.shapes.kernels import GemmShape, NoTables
from infersim.costing.timing import kernel_cost
from infersim.validate import POINTS_FILE
from infersim.validate.evaluate import evaluate, load_reference, summarize
from infersim.validate.mapping import load_mapping


def _run(tmp_path: Path, points: list[dict], **kwargs):
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": points}, sort_keys=False))
    return evaluate(load_reference(path), load_mapping(POINTS_FILE), reference_path=str(path), **kwargs)


def _point(pid: str, value, source: str = "DEEPGEMM", unit: str = "TFLOPS, GB/s") -> dict:
    return {"id": pid, "value": value, "source": source, "unit": unit}


def test_dense_deepgemm_point_by_hand(tmp_path):
    # m4096 n7168 k16384 fp8 on H800, roofline: compute bound at fp8 peak 1978.9e12 x 0.65, plus 4 us launch
    flops = 2 * 4096 * 7168 * 16384
    nbytes = 4096 * 16384 + 16384 * 7168 + 4096 * 7168 * 2
    seconds = max(flops / (1978.9e12 * 0.65), nbytes / (3.35e12 * 0.92)) + 4e-6
    hw, _ = load_hardware_card("h800")
    shape = GemmShape(4096, 16384, 7168, "fp8", "fp8", "bf16")
    assert kernel_cost(shape, hw, NoTables()).seconds == pytest.approx(seconds, rel=1e-12)
    result = _run(tmp_path, [_point("deepgemm-dense-m4096-n7168-k16384", {"tflops": 1358, "GBps": 343})])
    by_id = {c.id: c for c in result.comparisons}
    tflops = by_id["deepgemm-dense-m4096-n7168-k16384/tflops"]
    assert tflops.predicted == pytest.approx(flops / seconds / 1e12, rel=1e-9)
    assert tflops.predicted == pytest.approx(1279.4, abs=0.1)
    assert tflops.error == pytest.approx((1279.4 - 1358) / 1358, abs=1e-4)
    assert by_id["deepgemm-dense-m4096-n7168-k16384/GBps"].predicted == pytest.approx(nbytes / seconds / 1e9, rel=1e-9)
    assert (tflops.dominant_module, tflops.dominant_detail) == ("gemm", "compute")


def test_masked_grouped_deepgemm_point_is_memory_bound_by_hand(tmp_path):
    # 4 experts x 256 rows, down projection k=2048 n=7168: reading 4 fp8 expert matrices dominates
    flops = 2 * 1024 * 2048 * 7168
    nbytes = 4 * 2048 * 7168 + 1024 * 2048 + 1024 * 7168 * 2
    seconds = max(flops / (1978.9e12 * 0.65), nbytes / (3.35e12 * 0.92)) + 4e-6
    assert nbytes / (3.35e12 * 0.92) > flops / (1978.9e12 * 0.65)
    result = _run(tmp_path, [_point("deepgemm-grouped-masked-g4-m256-n7168-k2048", {"tflops": 815, "GBps": 2047})])
    tflops = next(c for c in result.comparisons if c.id.endswith("/tflops"))
    assert tflops.predicted == pytest.approx(flops / seconds / 1e12, rel=1e-9)
    assert tflops.predicted == pytest.approx(1055.0, abs=0.1)
    assert (tflops.dominant_module, tflops.dominant_detail) == ("moe_experts", "memory")


def test_deepep_low_latency_point_by_hand(tmp_path):
    # EP8 on one 8-GPU node: DeepEP's test sends 1,014 (token, expert) messages (10 of 128 x 8
    # masked) of 7408 bytes; 7 of 8 experts' GPUs are same-node peers reached over NVLink (200 GB/s
    # at 0.8), after 23 us fixed latency; then the receive pass copies the received messages into
    # the per-expert layout (read + write) at the H800's elementwise share of HBM (3.35 TB/s x 0.48)
    messages = 128 * 8 - 10
    nvlink_bytes = messages * 7408 * 7 / 8
    receive_pass = 2 * messages * 7408
    seconds = 23e-6 + nvlink_bytes / (200e9 * 0.8) + receive_pass / (3.35e12 * 0.48)
    hw, _ = load_hardware_card("h800")
    shape = TokenExchangeShape("dispatch", messages / 8, 7408, 256, 8, 8, 8, "deepep-low-latency")
    assert kernel_cost(shape, hw, NoTables()).seconds == pytest.approx(seconds, rel=1e-12)
    value = {"dispatch_us": 77, "combine_us": 114, "dispatch_GBps": 98, "combine_GBps": 127}
    result = _run(tmp_path, [_point("deepep-ll-ep8", value, "DEEPEP_V1", "us, GB/s")])
    by_id = {c.id: c for c in result.comparisons}
    assert by_id["deepep-ll-ep8/dispatch_us"].predicted == pytest.approx(seconds * 1e6, rel=1e-9)
    assert by_id["deepep-ll-ep8/dispatch_us"].unit == "us"
    # DeepEP's bandwidth: the sent selections, 7408 bytes each (fp8 + scales + 16)
    assert by_id["deepep-ll-ep8/dispatch_GBps"].predicted == pytest.approx(messages * 7408 / seconds / 1e9, rel=1e-9)
    assert by_id["deepep-ll-ep8/combine_us"].dominant_module == "combine"


def test_summary_statistics_by_hand():
    stats = summarize([0.1, -0.2, 0.05, 0.3, -0.15])
    assert stats.n == 5
    assert stats.median_abs_error == pytest.approx(0.15)
    assert stats.mean_abs_error == pytest.approx(0.16)
    assert stats.signed_mean_error == pytest.approx(0.02)
    assert stats.within_share == pytest.approx(0.6)  # 0.05, 0.1 and exactly 0.15
    assert summarize([]) is None
    assert summarize([0.2, -0.4]).median_abs_error == pytest.approx(0.3)  # even count: mean of the middle two


def test_statistics_end_to_end_on_a_synthetic_reference(tmp_path):
    """Measured values chosen so that the errors are known: +10%, -20%, +40% (kernels), +5% (stage)."""
    ids = ["deepgemm-dense-m64-n2112-k7168", "deepgemm-grouped-contig-g4-m8192-n4096-k7168"]
    first = _run(tmp_path, [_point(ids[0], {"tflops": 1, "GBps": 1}), _point(ids[1], {"tflops": 1, "GBps": 1}),
                            _point("sgl-h20-prefill-node", 1, "ANT", "tok/s per node")])
    predicted = {c.id: c.predicted for c in first.comparisons}
    wanted = {f"{ids[0]}/tflops": 0.10, f"{ids[0]}/GBps": -0.20, f"{ids[1]}/tflops": 0.40,
              "sgl-h20-prefill-node": 0.05}
    measured = {cid: predicted[cid] / (1 + e) for cid, e in wanted.items()}
    points = [_point(ids[0], {"tflops": measured[f"{ids[0]}/tflops"], "GBps": measured[f"{ids[0]}/GBps"]}),
              _point(ids[1], {"tflops": measured[f"{ids[1]}/tflops"]}),
              _point("sgl-h20-prefill-node", measured["sgl-h20-prefill-node"], "ANT", "tok/s per node"),
              _point("somebody-elses-point", 5, "ELSEWHERE", "tok/s")]
    result = _run(tmp_path, points)
    assert {c.id: round(c.error, 9) for c in result.comparisons} == {k: round(v, 9) for k, v in wanted.items()}
    stats = result.stats()
    overall = stats["overall"]
    assert overall.n == 4
    assert overall.median_abs_error == pytest.approx(0.15)  # |e| = 0.05, 0.10, 0.20, 0.40
    assert overall.mean_abs_error == pytest.approx(0.1875)
    assert overall.signed_mean_error == pytest.approx(0.0875)
    assert overall.within_share == pytest.approx(0.5)
    assert stats["by_source"]["DEEPGEMM"].n == 3 and stats["by_source"]["ANT"].n == 1
    assert stats["by_source"]["DEEPGEMM"].signed_mean_error == pytest.approx(0.1)
    assert stats["by_kind"]["kernel"].mean_abs_error == pytest.approx(0.7 / 3)
    assert stats["by_kind"]["stage"].median_abs_error == pytest.approx(0.05)
    assert [(n.id, n.reason) for n in result.not_expressed] == [
        ("somebody-elses-point", "no entry for this point in points.yaml")]


def test_only_selects_points_and_sub_metrics(tmp_path):
    points = [_point("deepgemm-dense-m64-n2112-k7168", {"tflops": 206, "GBps": 1688}),
              _point("deepgemm-dense-m128-n7168-k16384", {"tflops": 645, "GBps": 2604})]
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": points}, sort_keys=False))
    result = evaluate(load_reference(path), load_mapping(POINTS_FILE),
                      only=["deepgemm-dense-m64-n2112-k7168/GBps", "deepgemm-dense-m128-n7168-k16384"])
    assert [c.id for c in result.comparisons] == ["deepgemm-dense-m64-n2112-k7168/GBps",
                                                  "deepgemm-dense-m128-n7168-k16384/tflops",
                                                  "deepgemm-dense-m128-n7168-k16384/GBps"]


def test_kernel_tables_per_hardware_card(tmp_path):
    """--mfu-tables DIR uses DIR/<card> for each point's hardware card; cards without tables stay on
    the roofline and the note says so."""
    from infersim.cards.registry import bundled_dir
    from infersim.tables.lookup import load_tables

    points = [_point("deepgemm-dense-m4096-n7168-k16384", {"tflops": 1358, "GBps": 343}),
              _point("sgl-gb200-prefill-p2-std", 18471, "GB200_2", "tok/s/GPU")]
    result = _run(tmp_path, points, mfu_tables="imported")
    by_id = {c.id: c for c in result.comparisons}
    hw, _ = load_hardware_card("h800")
    shape = GemmShape(4096, 16384, 7168, "fp8", "fp8", "bf16")
    cost = kernel_cost(shape, hw, load_tables(bundled_dir("mfu_tables") / "imported" / "h800"))
    assert cost.source.value == "table"
    tflops = by_id["deepgemm-dense-m4096-n7168-k16384/tflops"]
    assert tflops.predicted == pytest.approx(shape.flops / cost.seconds / 1e12, rel=1e-9)
    assert tflops.note.startswith("table: exact from h800/gemm.csv")
    assert "no kernel tables for gb200 under imported: roofline" in by_id["sgl-gb200-prefill-p2-std"].note
