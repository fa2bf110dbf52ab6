"""The mapping of reference points to runs (infersim/validate/points.yaml): loads, matches the
reference, every run config builds in this build (or is refused for a stated reason), and bad
mappings give one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import public_reference
from infersim.run.config import config_from_mapping
from infersim.base.errors import ConfigError, InferSimError
from infersim.validate import POINTS_FILE
from infersim.validate.evaluate import load_reference
from infersim.validate.mapping import KINDS, MEMORY_KINDS, fit_run_to_spec, load_mapping


def test_bundled_mapping_loads_with_a_why_for_every_entry():
    mapping = load_mapping(POINTS_FILE)
    assert len(mapping) == 75 + 14  # validation.yaml, energy.yaml
    # memory points come from the vLLM serving runs' file (infersim.validate.trainval), none from these
    assert {e.kind for e in mapping.values()} == set(KINDS) - set(MEMORY_KINDS)
    for entry in mapping.values():
        assert len(entry.why) > 10, entry.id
        assert entry.not_expressed or entry.metrics, entry.id


def test_every_mapped_id_is_a_reference_point_and_every_point_is_mapped():
    reference = {**load_reference(public_reference("validation.yaml")), **load_reference(public_reference("energy.yaml"))}
    mapping = load_mapping(POINTS_FILE)
    assert set(mapping) - set(reference) == set()
    assert set(reference) - set(mapping) == set()
    # sub-metric conversions name keys of the point's value, and cover all of them
    for pid, entry in mapping.items():
        value = reference[pid].value
        if entry.not_expressed:
            continue
        if isinstance(value, dict):
            assert set(entry.metrics) == set(value), pid
        else:
            assert set(entry.metrics) == {""}, pid


def test_every_run_config_builds():
    """Stage and serving run configs load with this build's loader once unknown fields are dropped;
    no real deployment is refused (the GB200 EP48 decode points need redundant experts)."""
    refused = {}
    for entry in load_mapping(POINTS_FILE).values():
        if not entry.run:
            continue
        run, dropped = fit_run_to_spec(entry.run)
        assert "engine" in dropped or "engine" in run, entry.id
        try:
            config_from_mapping(run, entry.id, entry.overrides)
        except InferSimError as exc:
            refused[entry.id] = str(exc)
    # the GB200 EP48 decode points run with 32 redundant experts (288 = 48 x 6 slots)
    assert refused == {}


def test_fit_run_to_spec_drops_only_unknown_fields():
    run = {"model": "deepseek-v3", "hardware": "h20", "engine": "sglang",
           "deployment": {"num_gpus": 8, "moe": {"load_balance": "eplb"}, "attention": {"tp": 8, "bogus": 1}},
           "workload": {"isl": 10, "osl": 1}, "speculative": {"method": "mtp", "acceptance_rate": 0.8, "extra": 2}}
    fitted, dropped = fit_run_to_spec(run)
    assert sorted(dropped) == ["deployment.attention.bogus", "speculative.extra"]
    assert fitted == {"model": "deepseek-v3", "hardware": "h20", "engine": "sglang",
                      "deployment": {"num_gpus": 8, "moe": {"load_balance": "eplb"}, "attention": {"tp": 8}},
                      "workload": {"isl": 10, "osl": 1}, "speculative": {"method": "mtp", "acceptance_rate": 0.8}}


def _write(tmp_path: Path, points: list) -> Path:
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump({"points": points}))
    return path


GOOD = {"id": "p", "kind": "kernel_gemm", "hardware": "h800", "kernel": {"m": 64, "n": 64, "k": 64},
        "metric": {"from": "tflops"}, "why": "a test shape"}


@pytest.mark.parametrize("change, field, problem", [
    ({"why": None}, "points[0] (p).why", "needs a `why`"),
    ({"kind": "kernel"}, "points[0] (p).kind", "expected one of"),
    ({"metric": {"from": "decode.tgs"}}, "points[0] (p).metric.from", "a kernel point's number is one of"),
    ({"metric": {"from": "tflops", "multiply": -1}}, "points[0] (p).metric.multiply", "positive number"),
    ({"metric": {"from": "tflops", "bytes": 10}}, "points[0] (p).metric.bytes", "only a gbps conversion"),
    ({"hardware": ""}, "points[0] (p).hardware", "names a hardware card"),
    ({"colour": "red"}, "points[0] (p).colour", "unknown key"),
    ({"metric": None}, "points[0] (p).metric", "expected a mapping"),
    ({"set": ["engine.overheads.step_cpu=0"]}, "points[0] (p).set", "a kernel point has none"),
])
def test_bad_mapping_entries_name_the_entry_and_field(tmp_path, change, field, problem):
    entry = {**GOOD, **change}
    if change.get("why", "") is None:
        del entry["why"]
    with pytest.raises(ConfigError) as info:
        load_mapping(_write(tmp_path, [entry]))
    assert info.value.field == field
    assert problem in info.value.problem


def test_a_memory_point_compares_the_kv_pool(tmp_path):
    entry = {"id": "m", "kind": "memory", "run": {"model": "qwen3-8b"}, "metric": {"from": "decode.tgs"},
             "why": "test"}
    with pytest.raises(ConfigError, match="a memory point's number is one of kv_pool_tokens"):
        load_mapping(_write(tmp_path, [entry]))
    entry["metric"] = {"from": "kv_pool_tokens", "unit": "tokens"}
    assert load_mapping(_write(tmp_path, [entry]))["m"].family == "memory"


def test_stage_conversion_must_match_the_stage(tmp_path):
    entry = {"id": "s", "kind": "stage_decode", "run": {"model": "qwen3-8b"}, "metric": {"from": "prefill.tgs"},
             "why": "test"}
    with pytest.raises(ConfigError, match="a stage_decode point compares the decode stage"):
        load_mapping(_write(tmp_path, [entry]))


def test_duplicate_entries_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="a second entry for the same point id"):
        load_mapping(_write(tmp_path, [GOOD, GOOD]))


def test_not_expressed_entries_need_no_run(tmp_path):
    mapping = load_mapping(_write(tmp_path, [{"id": "x", "kind": "serving", "not_expressed": "no  card\n for it",
                                              "why": "see not_expressed"}]))
    assert mapping["x"].not_expressed == "no card for it"


@pytest.mark.parametrize("overrides", ["engine.overheads.step_cpu=0", ["no equals sign"], [3]])
def test_run_overrides_are_a_list_of_field_value_texts(tmp_path, overrides):
    entry = {"id": "s", "kind": "stage_decode", "run": {"model": "qwen3-8b"}, "metric": {"from": "decode.tgs"},
             "why": "test", "set": overrides}
    with pytest.raises(ConfigError) as info:
        load_mapping(_write(tmp_path, [entry]))
    assert info.value.field == "points[0] (s).set"
    assert "FIELD=VALUE" in info.value.problem


def test_perf_overview_points_run_the_pages_cuda_graph_sizes():
    """Both TensorRT-LLM perf-overview pages capture graphs at 1, 2, 4, ..., 256, 384, 512, 1024, ...,
    8192 with padding on: a 750-request decode step (3,000 requests over 4 DP ranks) replays the
    1024 graph, 260 the 384 one, 8192 itself; the bare trtllm card (graphs up to 128) runs 750
    eagerly at its own size."""
    entries = [e for e in load_mapping(POINTS_FILE).values() if e.id.startswith("trt")]
    assert len(entries) == 35
    for entry in entries:
        assert any("cuda_graph_batch_sizes" in o for o in entry.overrides), entry.id
    gb200 = load_mapping(POINTS_FILE)["trt12-deepseekr10528-gb200-dep4-1024-1024"]
    run, _ = fit_run_to_spec(gb200.run)
    paged = config_from_mapping(run, gb200.id, gb200.overrides)
    bare = config_from_mapping(run, gb200.id)
    hbm = paged.hardware.peak.hbm_bytes
    assert [paged.engine.graph_padded_batch(b, hbm) for b in (750, 260, 8192, 3, 5, 8193)] == [1024, 384, 8192, 4, 8, 8193]
    assert bare.engine.graph_padded_batch(750, hbm) == 750
    assert bare.engine.graph_padded_batch(100, hbm) == 128
