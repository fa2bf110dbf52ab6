"""Hostile numbers, generated: model cards, hardware cards, run configs and benchmark results with
arbitrary values (0, negatives, huge, inf, nan, text, floats for counts) either give one
ConfigError-style message naming the field, or a result whose every number is finite and
non-negative and whose kernel times never beat the card's HBM bandwidth. And every bundled model
on every bundled GPU, over a grid of layouts and batches, never hits an internal error."""

from __future__ import annotations

import copy
import json
import math
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import yaml
from conftest import REPO_ROOT
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infersim.cards.model import ModelCard
from infersim.run.config import config_from_mapping
from infersim.base.errors import ConfigError, InferSimError
from infersim.shapes.kernels import Bound
from infersim.cards import categories as cat
from infersim.cli.report import to_json_data, to_text
from infersim.run.simulate import SimulationResult, simulate

# values a careless script or a hostile user writes
SPECIAL = [0, -1, 1, 2, 3, 7, 8, 64, 4096, 10**15, 10**16, 1e15, 1e30, 1e300, -1e300, 1e-300, 1e-45, 0.5, 2.5, 0.999,
           float("inf"), float("-inf"), float("nan"), "abc", "4096", "1e30", ".inf", "nan", "", True, False, None,
           [], {}, [1, 2], {"a": 1}]
NUMBERS = st.one_of(st.sampled_from(SPECIAL), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=True, allow_infinity=True),
                    # plausible values too, so that many examples get past validation into the simulator
                    st.sampled_from([2 ** i for i in range(14)]), st.integers(1, 100_000), st.floats(1e-3, 1e13))

MODEL_FIELDS = sorted(f"model.{k}" for k, hint in get_type_hints(ModelCard).items() if hint is int)
HARDWARE_FIELDS = [f"hardware.{k}" for k in (
    "peak.flops.bf16", "peak.hbm_bytes", "peak.hbm_bandwidth", "peak.nvlink_bandwidth", "peak.network_bandwidth",
    "peak.sm_count", "peak.gpus_per_node", "peak.l2_bytes", "derates.compute_efficiency.bf16",
    "derates.attention_compute_efficiency", "derates.memory_efficiency", "derates.elementwise_memory_efficiency",
    "derates.nvlink_efficiency", "derates.gemm_tile_m", "derates.kernel_launch_overhead",
    "derates.collective_latency.LL.base", "derates.collective_latency.Simple.bandwidth_efficiency",
    "derates.deepep_normal_sms", "derates.prefill_step_overhead", "derates.decode_step_overhead",
    "derates.runtime_reserved_bytes")]
RUN_FIELDS = ["deployment.num_gpus", "deployment.num_nodes", "deployment.pp", "deployment.attention.tp",
              "deployment.attention.dp", "deployment.ffn.tp", "deployment.ffn.ep", "deployment.ffn.dp",
              "workload.isl", "workload.osl", "workload.prefill_tokens_per_gpu", "workload.decode_batch_per_gpu"]
FIELDS = MODEL_FIELDS + HARDWARE_FIELDS + RUN_FIELDS

# numbers a report may hold below zero: time saved by overlap (negative when SM sharing costs more),
# and the space left for KV cache of a run that does not fit
SIGNED = {"overlap_saved_ms", "kv_capacity_gb"}


@cache
def _card(kind: str, name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / kind / f"{name}.yaml").read_text())


def base_run(model: str = "qwen3-30b-a3b", hardware: str = "h20") -> dict[str, Any]:
    run = yaml.safe_load((REPO_ROOT / "configs" / "qwen3-30b.yaml").read_text())
    run["model"] = copy.deepcopy(_card("models", model))
    run["hardware"] = copy.deepcopy(_card("hardware", hardware))
    return run


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def is_clearly_not_a_number(value: Any) -> bool:
    """A value no numeric field may accept: not a number or numeric text, or not finite."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return True
    if isinstance(value, str):
        try:
            return not math.isfinite(float(value))
        except ValueError:
            return True
    return isinstance(value, float) and not math.isfinite(value)


def numbers_of(data: Any, key: str = "") -> list[tuple[str, float]]:
    if isinstance(data, bool) or data is None or isinstance(data, str):
        return []
    if isinstance(data, (int, float)):
        return [(key, data)]
    if isinstance(data, dict):
        return [n for k, v in data.items() for n in numbers_of(v, str(k))]
    if isinstance(data, (list, tuple)):
        return [n for v in data for n in numbers_of(v, key)]
    return []


def check_result(result: SimulationResult) -> None:
    """Every number finite and (but for SIGNED) non-negative; no kernel beats the HBM bandwidth."""
    data = to_json_data(result)
    json.dumps(data, allow_nan=False)  # raises on nan/inf
    for key, value in numbers_of(data):
        assert math.isfinite(value), (key, value)
        assert value >= 0 or key in SIGNED, (key, value)
    bandwidth = result.config.hardware.peak.hbm_bandwidth
    for stage in (result.prefill, result.decode):
        assert stage.step_time_s > 0 and math.isfinite(stage.tgs)
        for op in stage.operations:
            if op.module in cat.COMMUNICATION or op.bound is Bound.COMM:
                continue  # bytes over links, not HBM (a drafter's dispatch sits under module 'draft')
            assert op.time_s >= op.bytes / bandwidth * (1 - 1e-9), (op.name, op.time_s, op.bytes)
    to_text(result, show_unfit=True)  # the report renders whatever the numbers are


def check_error(exc: InferSimError, changes: list[tuple[str, Any]]) -> None:
    message = str(exc)
    assert "\n" not in message and len(message) < 2000, message
    if not isinstance(exc, ConfigError):
        return
    assert exc.field or exc.problem
    if len(changes) == 1 and is_clearly_not_a_number(changes[0][1]):
        path = changes[0][0]
        field = path.split(".", 1)[1] if path.startswith(("model.", "hardware.")) else path
        assert exc.field == field, (exc.field, field, message)


def simulate_and_check(run: dict[str, Any], changes: list[tuple[str, Any]]) -> None:
    """Apply the changes to the run and simulate it: either a clear refusal or sane numbers."""
    for path, value in changes:
        set_path(run, path, value)
    try:
        result = simulate(config_from_mapping(run, "generated"))
    except InferSimError as exc:
        event("refused")
        check_error(exc, changes)
        return
    event("simulated")
    check_result(result)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), NUMBERS), min_size=1, max_size=3))
def test_arbitrary_numbers_in_cards_and_run_configs(changes: list[tuple[str, Any]]) -> None:
    simulate_and_check(base_run(), changes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), NUMBERS), min_size=1, max_size=2))
def test_arbitrary_numbers_in_a_dense_model(changes: list[tuple[str, Any]]) -> None:
    run = base_run("qwen3-8b", "h800")
    run["deployment"] = {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}}
    simulate_and_check(run, changes)


BENCH_FIELDS = ["batch_size", "input_len", "output_len", "prefill_latency", "median_decode_latency",
                "prefill_throughput", "median_decode_throughput"]
SERVING_FIELDS = ["completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "median_tpot_ms",
                  "max_concurrency", "input_throughput", "output_throughput"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(serving=st.booleans(), changes=st.lists(st.tuples(st.integers(0, 7), NUMBERS), min_size=1, max_size=3))
def test_arbitrary_bench_results(tmp_path: Path, serving: bool, changes: list[tuple[int, Any]]) -> None:
    from infersim.cards.schema import build
    from infersim.cards.deployment import Workload
    from infersim.trace.bench import bench_workload, read_bench_results

    if serving:
        line: dict[str, Any] = {"completed": 200, "total_input_tokens": 400000, "total_output_tokens": 100000,
                                "mean_ttft_ms": 350.0, "median_tpot_ms": 28.0, "max_concurrency": 32}
        fields = SERVING_FIELDS
    else:
        line = {"batch_size": 64, "input_len": 1024, "output_len": 16, "prefill_latency": 0.8,
                "median_decode_latency": 0.025}
        fields = BENCH_FIELDS
    for index, value in changes:
        line[fields[index % len(fields)]] = value
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(line) + "\n")
    try:
        (record,) = read_bench_results(path)
        workload = bench_workload(record, 8, 1)
        build(Workload, {"isl": workload.isl, "osl": workload.osl, "prefill_tokens_per_gpu": workload.prefill_tokens_per_gpu,
                         "decode_batch_per_gpu": workload.decode_batch_per_gpu}, str(path))
    except InferSimError as exc:
        message = str(exc)
        assert str(path) in message and "\n" not in message and len(message) < 2000
        return
    for value in (record.batch_size, record.input_len, record.output_len, record.ttft_s, record.tpot_s,
                  record.prefill_throughput, record.decode_throughput):
        assert value is None or (math.isfinite(value) and value >= 0), record
    assert record.batch_size > 0 and record.input_len > 0 and record.output_len > 0
    assert all(v is None or v > 0 for v in (record.ttft_s, record.tpot_s))


# ---- every bundled model x every bundled GPU x a small grid of layouts and batches ----------------


def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in (REPO_ROOT / kind).glob("*.yaml"))


@pytest.mark.parametrize("model", _names("models"))
def test_bundled_models_on_bundled_gpus_never_hit_an_internal_error(model: str) -> None:
    from infersim.cards.schema import build
    from infersim.run.config import RunConfig, default_engine, load_hardware_card, load_model_card
    from infersim.cards.deployment import Deployment, Workload, complete_layout
    from infersim.shapes.kernels import NoTables

    card, _ = load_model_card(model)
    simulated = 0
    for hardware in _names("hardware"):
        hw, _ = load_hardware_card(hardware)
        for tp in (1, 8):
            for ep in (1, 8):
                gpus = max(tp, ep)
                ffn = {"tp": 1, "ep": ep} if card.is_moe else {"tp": tp, "ep": ep}
                try:
                    dep = complete_layout(build(Deployment, {"num_gpus": gpus, "attention": {"tp": tp}, "ffn": ffn},
                                                "grid"), card, hw, "grid")
                except InferSimError:
                    continue  # a layout this model or GPU cannot take: a message, which is the point
                # a batch of 1 where attention is whole on a GPU, 64 where it is split: both sizes on every GPU
                batch = 1 if tp == 1 else 64
                workload = Workload(isl=1024, osl=256, prefill_tokens_per_gpu=2048, decode_batch_per_gpu=batch)
                config = RunConfig(model=card, hardware=hw, deployment=dep, workload=workload, tables=NoTables(),
                                   engine=default_engine())
                check_result(simulate(config))
                simulated += 1
    assert simulated > 0


GENERATE_FIELDS = ["generate.batch", "generate.prompt_len", "generate.gen_len", "hardware.host_memory_bytes",
                   "hardware.nvme_bandwidth", "hardware.derates.pcie_efficiency", "hardware.peak.pcie_bandwidth"]
# generate times every decode step: keep generated lengths that pass validation short
SHORT = NUMBERS.filter(lambda v: not (isinstance(v, (int, float)) and not isinstance(v, bool) and 300 < abs(v) < 2e5))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS + GENERATE_FIELDS), SHORT), min_size=1, max_size=3),
       offload=st.sampled_from([[], ["weights"], ["kv"], ["weights", "kv"]]))
def test_arbitrary_numbers_in_generate(changes: list[tuple[str, Any]], offload: list[str]) -> None:
    from infersim.generate import simulate_generation
    from infersim.generate.report import to_json_data as generation_json
    from infersim.generate.report import to_text as generation_text
    from infersim.generate.spec import config_and_spec

    run = base_run()
    run["hardware"]["host_memory_bytes"] = 1e12
    run["generate"] = {"batch": 8, "prompt_len": 128, "gen_len": 8, "offload": offload}
    for path, value in changes:
        set_path(run, path, value)
    try:
        config, gen = config_and_spec(run, "generated")
        result = simulate_generation(config, gen)
    except InferSimError as exc:
        check_error(exc, changes)
        return
    json.dumps(generation_json(result), allow_nan=False)
    generation_text(result)
