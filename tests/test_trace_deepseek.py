"""The real DeepSeek-V3 trace (4 MoE layers, forward + backward, EP64 on H800): per-layer forward time by module.

Each attributed number is checked against an independent computation done here with plain
json: kernel -> launch by `args.correlation` -> the `(F)` user annotation enclosing the launch on
the same CPU thread; a new layer starts at every `attn(F)`. The same numbers are also pinned, in
µs, as read from the file (durations there are whole microseconds).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import shared_reference

from infersim.trace import LaneMeasure, measure_trace

TRACE = ("traces", "deepseek-v3-train-ep64-h800.json")
US = 1e-6

LAYER_TOTAL_US = [21945, 22613, 26211, 26622]
ATTN_CORE_US = [1248, 1199, 1280, 1221]
MOE_EXPERTS_US = [2979, 3058, 3661, 3167]
DISPATCH_US = [6059, 5706, 7077, 7919]
COMBINE_US = [7325, 8260, 9521, 9630]


@pytest.fixture(scope="module")
def trace_path() -> Path:
    return shared_reference(*TRACE)


@pytest.fixture(scope="module")
def lane(trace_path: Path) -> LaneMeasure:
    (measured,) = measure_trace(str(trace_path))
    return measured


@pytest.fixture(scope="module")
def independent(trace_path: Path) -> dict:
    """Per layer: kernels (name, dur, stream, ts) grouped by their forward region name."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    regions = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].endswith("(F)")),
                     key=lambda e: e["ts"])
    layer_of, layer = {}, -1
    for r in regions:
        if r["name"] == "attn(F)":
            layer += 1
        layer_of[id(r)] = layer
    layers: list[dict[str, list[dict]]] = [defaultdict(list) for _ in range(layer + 1)]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for k in gpu:
        launch = launches[k["args"]["correlation"]]
        inside = [r for r in regions if r["tid"] == launch["tid"] and r["ts"] <= launch["ts"] <= r["ts"] + r["dur"]]
        if inside:
            layers[layer_of[id(inside[0])]][inside[0]["name"]].append(k)
    return {"layers": layers, "gpu": gpu}


def _module(lane: LaneMeasure, layer: int, module: str) -> float:
    return dict(lane.stages[0].layers[layer].modules).get(module, 0.0)


def test_four_forward_layers_found_from_annotations(lane: LaneMeasure) -> None:
    (stage,) = lane.stages
    assert stage.num_layers == 4
    assert len(stage.steps) == 1
    assert stage.steps[0].layer_source == "annotations"
    assert stage.steps[0].label == "ProfilerStep#1"
    assert stage.unmatched == ()  # every kernel of the forward regions matched a rule


def test_layer_totals_equal_the_kernels_inside_forward_regions(lane: LaneMeasure, independent: dict) -> None:
    for i, regions in enumerate(independent["layers"]):
        expected = sum(k["dur"] for ks in regions.values() for k in ks)
        assert expected == LAYER_TOTAL_US[i]
        assert lane.stages[0].layers[i].time_s == pytest.approx(expected * US, abs=1e-9)


def test_per_layer_modules_match_independent_sums(lane: LaneMeasure, independent: dict) -> None:
    for i, regions in enumerate(independent["layers"]):
        attention = sum(k["dur"] for k in regions["attn(F)"] if "compute_attn_ws" in k["name"])
        experts = sum(k["dur"] for k in regions["mlp(F)"]
                      if "m_grouped_fp8" in k["name"] or "reduce_fused_impl" in k["name"])
        dense_in_attention = sum(k["dur"] for k in regions["attn(F)"] if "fp8_ptp128c::GemmKernel" in k["name"])
        dense_in_mlp = sum(k["dur"] for k in regions["mlp(F)"]
                           if "fp8_ptp128c::GemmKernel" in k["name"] and "m_grouped" not in k["name"])
        dispatch = sum(k["dur"] for k in regions["dispatch(F)"])
        combine = sum(k["dur"] for k in regions["combine(F)"])
        assert (attention, experts, dispatch, combine) == (ATTN_CORE_US[i], MOE_EXPERTS_US[i], DISPATCH_US[i],
                                                           COMBINE_US[i])
        assert _module(lane, i, "attn_core") == pytest.approx(attention * US)
        assert _module(lane, i, "moe_experts") == pytest.approx(experts * US)
        # the MLA projections (q_a, kv_a, q_b, kv_b, o) are the dense GEMMs of attn(F)
        assert _module(lane, i, "attn_proj") == pytest.approx(dense_in_attention * US)
        # the dense GEMMs of mlp(F) are the shared expert (up and down)
        assert _module(lane, i, "shared_expert") == pytest.approx(dense_in_mlp * US)
        assert _module(lane, i, "dispatch") == pytest.approx(dispatch * US)
        assert _module(lane, i, "combine") == pytest.approx(combine * US)
        # the router gate (a bf16 -> fp32 cuBLAS GEMM before the top-k) is the router, not a projection
        gate = sum(k["dur"] for k in regions["attn(F)"] if k["name"].startswith("sm90_xmma_gemm_bf16f32"))
        assert gate > 0
        assert _module(lane, i, "router") > gate * US


def test_module_times_add_up_to_the_layer(lane: LaneMeasure) -> None:
    for layer in lane.stages[0].layers:
        assert sum(t for _, t in layer.modules) == pytest.approx(layer.time_s)


def test_forward_communication_is_hidden_behind_backward_compute(lane: LaneMeasure, independent: dict) -> None:
    """DeepEP kernels run on stream 27 while the other micro-batch's compute runs on streams 7/23:
    that time is reported as hidden, computed here as the overlap with the union of compute kernels."""
    compute = sorted((k["ts"], k["ts"] + k["dur"]) for k in independent["gpu"]
                     if k["args"]["stream"] != 27 and k.get("cat") == "kernel")
    union: list[list[float]] = []
    for start, end in compute:
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])

    def hidden(k: dict) -> float:
        a, b = k["ts"], k["ts"] + k["dur"]
        return sum(max(0.0, min(b, e) - max(a, s)) for s, e in union)

    for region, module in (("dispatch(F)", "dispatch"), ("combine(F)", "combine")):
        kernels = [k for layer in independent["layers"] for k in layer[region]]
        expected_hidden = sum(hidden(k) for k in kernels)
        measured = lane.stages[0].module(module)
        assert measured.hidden_s == pytest.approx(expected_hidden * US, abs=1e-9)
        assert measured.exposed_s == pytest.approx((sum(k["dur"] for k in kernels) - expected_hidden) * US, abs=1e-9)
        assert measured.hidden_s > 0.95 * measured.time_s  # DualPipe hides almost all of it
    assert lane.stages[0].module("dispatch").hidden_s == pytest.approx(26506 * US)
    assert lane.stages[0].module("combine").hidden_s == pytest.approx(34083 * US)


def test_backward_kernels_are_outside_the_forward_step(lane: LaneMeasure, independent: dict) -> None:
    forward = sum(k["dur"] for layer in independent["layers"] for ks in layer.values() for k in ks)
    total = sum(k["dur"] for k in independent["gpu"])
    assert lane.stages[0].kernel_time_s == pytest.approx(forward * US)
    assert lane.outside_steps_s == pytest.approx((total - forward) * US)
    assert lane.kernels == len(independent["gpu"]) == 983
    assert {s.stream for s in lane.streams} == {7, 23, 27}
    assert next(s for s in lane.streams if s.stream == 27).communication_s == pytest.approx(113440 * US)
