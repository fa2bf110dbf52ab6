"""Grid syntax: lists, ranges, type conversion through the schemas, and one clear message per mistake."""

from __future__ import annotations

import pytest

from infersim.base.errors import InferSimError
from infersim.sweep.grid import expand_range, expand_values, grid_point, grid_points, grid_size, parse_grid


def axis(text: str, searched: bool = False):
    (a,) = parse_grid([text], searched=searched)
    return a


def test_lists_are_read_as_yaml_and_converted_to_the_field_type():
    assert axis("model.num_key_value_heads=2,4,8").values == (2, 4, 8)
    assert axis("workload.decode_batch_per_gpu=16,max").values == (16, "max")
    assert axis("deployment.precision.kv_cache=bf16,fp8").values == ("bf16", "fp8")
    # YAML 1.1 reads 4e12 as text; the schema turns it into a number, as in a config file
    bw = axis("hardware.peak.hbm_bandwidth=4e12,4.8e12").values
    assert bw == (4e12, 4.8e12) and all(isinstance(v, float) for v in bw)
    assert axis("hardware.peak.flops.fp8=1e15").values == (1e15,)
    assert axis("hardware.derates.collective_latency.LL.base=5e-6").values == (5e-6,)
    assert axis("model=qwen3-8b,llama-3.1-8b").values == ("qwen3-8b", "llama-3.1-8b")


def test_doubling_range_includes_both_bounds_when_reached():
    assert axis("workload.decode_batch_per_gpu=16..256").values == (16, 32, 64, 128, 256)
    assert expand_range("1..512") == [2 ** i for i in range(10)]
    assert expand_range("3..20") == [3, 6, 12]  # 24 would pass the end
    assert expand_range("5..5") == [5]


def test_step_ranges_and_mixed_lists():
    assert expand_range("16..64:16") == [16, 32, 48, 64]
    assert expand_range("16..70:16") == [16, 32, 48, 64]
    assert axis("workload.isl=1,3..12:3").values == (1, 3, 6, 9, 12)
    assert expand_range("0.1..0.5:0.1") == [0.1, 0.2, 0.3, 0.4, 0.5]  # no 0.30000000000000004
    assert axis("hardware.derates.memory_efficiency=0.6..0.9:0.1").values == (0.6, 0.7, 0.8, 0.9)


def test_duplicates_are_dropped_and_order_kept():
    assert axis("deployment.ffn.ep=4,2,4,8").values == (4, 2, 8)


def test_cross_product_order_last_axis_fastest():
    axes = parse_grid(["model.num_key_value_heads=2,4", "workload.decode_batch_per_gpu=1,2,3"])
    assert grid_size(axes) == 6
    assert [grid_point(axes, i) for i in range(6)] == [(2, 1), (2, 2), (2, 3), (4, 1), (4, 2), (4, 3)]


def test_a_chunk_of_points_has_the_values_of_grid_point():
    axes = parse_grid(["model.num_key_value_heads=2,4", "deployment.ffn.ep=1,2,4", "workload.decode_batch_per_gpu=1,2,3"])
    for start, stop in ((0, 18), (4, 11), (17, 18), (5, 5)):
        assert list(grid_points(axes, start, stop)) == [grid_point(axes, i) for i in range(start, stop)]


@pytest.mark.parametrize("text, message", [
    ("model.num_key_value_heads", "expected FIELD=VALUES"),
    ("model.num_key_value_heads=", "no values after '='"),
    ("model.num_key_value_heads=2,,4", "empty value"),
    ("model..heads=2", "empty part in field name"),
    ("workload.decode_batch_per_gpu=256..16", "ends (16) before it starts (256)"),
    ("workload.decode_batch_per_gpu=16..", "bad range"),
    ("workload.decode_batch_per_gpu=a..b", "range start 'a' is not a number"),
    ("workload.decode_batch_per_gpu=16..64:0", "step must be positive"),
    ("workload.decode_batch_per_gpu=0..64", "needs a positive start"),
    ("workload.decode_batch_per_gpu=1..10000000:1", "at most 100,000"),
])
def test_bad_syntax_is_one_clear_message(text, message):
    with pytest.raises(InferSimError, match=None) as info:
        parse_grid([text])
    assert message in str(info.value)
    assert text.split("=")[0] in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("model.num_kv_heads=2", "unknown field 'num_kv_heads' in 'model'; did you mean 'num_key_value_heads'?"),
    ("deployment.ffn.expert_parallel=2", "unknown field 'expert_parallel' in 'deployment.ffn'"),
    ("hardwre.peak.hbm_bandwidth=1e12", "unknown field 'hardwre'; did you mean 'hardware'?"),
    ("hardware.peak=1", "'hardware.peak' is a section"),
    ("deployment=1", "'deployment' is a section"),
    ("hardware.peak.flops=1e15", "is a mapping; vary one entry"),
    ("workload.isl.x=1", "'workload.isl' is a value, not a section"),
    ("mfu_tables=a,b", "cannot be swept"),
])
def test_unknown_fields_are_refused_before_running(text, message):
    with pytest.raises(InferSimError) as info:
        parse_grid([text])
    assert message in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("deployment.ffn.ep=0,2", "must be greater than 0"),
    ("model.num_key_value_heads=two", "expected a whole number"),
    ("deployment.precision.kv_cache=fp6", "must be one of bf16, fp16, fp8"),
    ("workload.decode_batch_per_gpu=most", "must be one of max"),
    ("hardware.derates.memory_efficiency=1.5", "must be at most 1"),
    ("model=16", "given by name or path"),
    ("speculative.acceptance_rate=0.5,1.2", "must be at most 1"),
    ("speculative.lookahead=0", "must be greater than 0"),
    ("speculative.method=medusa", "must be one of draft, mtp"),
])
def test_values_are_checked_by_the_schema(text, message):
    with pytest.raises(InferSimError) as info:
        parse_grid([text])
    assert message in str(info.value)


def test_same_field_twice_and_searched_fields():
    with pytest.raises(InferSimError, match="given twice"):
        parse_grid(["deployment.ffn.ep=2", "deployment.ffn.ep=4"])
    with pytest.raises(InferSimError, match="chosen by the layout search"):
        parse_grid(["deployment.ffn.ep=2,4"], searched=True)
    assert parse_grid(["deployment.moe_comm=all-to-all,deepep-low-latency"], searched=True)[0].values == (
        "all-to-all", "deepep-low-latency")


def test_expand_values_keeps_raw_items_for_other_options():
    assert expand_values("1..8") == [1, 2, 4, 8]
    assert expand_values("1,max") == [1, "max"]
