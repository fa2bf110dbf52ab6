"""HF transformers traces (tests/data/traces): steps, layers and modules without knowing kernel names.

The CPU side of these traces is a real recording (torch 2.13 on a CPU: operators with shapes,
nn.Module frames, `prefill` / `decode` record_function regions); the GPU side is synthesised as
PyTorch on an H100 would record it (tests/tracegen/synthesis.py; tests/data/traces/README.md). Every
attributed number is checked against an independent computation here with plain json: kernel ->
launch by correlation -> the operators and nn.Module frames enclosing the launch on its thread.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from infersim.cards import categories as cat
from infersim.trace import LaneMeasure, measure_trace
from infersim.trace.records import SOURCE_OP, SOURCE_RULE

TRACES = REPO_ROOT / "tests" / "data" / "traces"
LLAMA = TRACES / "llama-2-7b-2l-eager-h100-synthesised-p1x128-d2.json.gz"
LLAMA_NOSTACK = TRACES / "llama-2-7b-2l-eager-nostack-h100-synthesised-p1x128-d2.json.gz"
LLAMA_COMPILED = TRACES / "llama-2-7b-2l-compiled-h100-synthesised-p1x128-d2.json.gz"
LLAMA_GRAPHS = TRACES / "llama-2-7b-2l-graphs-h100-synthesised-p1x128-d2.json.gz"
MIXTRAL = TRACES / "mixtral-8x7b-2l-eager-h100-synthesised-p1x128-d2.json.gz"
MIXTRAL_COMPILED = TRACES / "mixtral-8x7b-2l-compiled-h100-synthesised-p1x128-d2.json.gz"
MIXTRAL_GRAPHS = TRACES / "mixtral-8x7b-2l-graphs-h100-synthesised-p1x128-d2.json.gz"
ALL = [LLAMA, LLAMA_NOSTACK, LLAMA_COMPILED, LLAMA_GRAPHS, MIXTRAL, MIXTRAL_COMPILED, MIXTRAL_GRAPHS,
       TRACES / "llama-2-7b-2l-eager-h100-synthesised-p1x64-d4.json.gz",
       TRACES / "mixtral-8x7b-2l-eager-h100-synthesised-p1x64-d4.json.gz"]
US = 1e-6


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def independent_modules(path: Path) -> list[dict[str, float]]:
    """Per step (user region, in order): kernel µs of the modules the frames and operators name."""
    events = _events(path)
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")
             and (e["cat"] == "cpu_op" or e["name"].startswith("nn.Module: "))]
    regions = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    steps: list[dict[str, float]] = [defaultdict(float) for _ in regions]
    for k in (e for e in events if e.get("cat") == "kernel"):
        launch = launches[k["args"]["correlation"]]
        ts = launch["ts"]
        around = [s["name"] for s in spans if s["ts"] <= ts <= s["ts"] + s["dur"]]
        step = next(i for i, r in enumerate(regions) if r["ts"] <= ts <= r["ts"] + r["dur"])
        frames = [n for n in around if n.startswith("nn.Module: ")]
        if "aten::scaled_dot_product_attention" in around:
            steps[step]["attn_core"] += k["dur"]
        elif "aten::linear" in around and any("Attention" in f for f in frames):
            steps[step]["attn_proj"] += k["dur"]
        elif "aten::linear" in around and any("MLP" in f for f in frames):
            steps[step]["dense_ffn"] += k["dur"]
        elif "aten::_grouped_mm" in around:
            steps[step]["moe_experts"] += k["dur"]
        elif "aten::linear" in around and any("Router" in f for f in frames):
            steps[step]["router_gemm"] += k["dur"]
        elif "aten::linear" in around and not any("DecoderLayer" in f for f in frames):
            steps[step]["lm_head_gemm"] += k["dur"]
        steps[step]["total"] += k["dur"]
    return steps


@pytest.fixture(scope="module")
def llama() -> LaneMeasure:
    (lane,) = measure_trace(str(LLAMA))
    return lane


def _steps(lane: LaneMeasure) -> list:
    return sorted((s for stage in lane.stages for s in stage.steps), key=lambda s: s.index)


def _module(step, module: str) -> float:
    return next((m.time_s for m in step.modules if m.module == module), 0.0)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name.replace("-h100-synthesised", "").removesuffix(".json.gz"))
def test_every_step_found_and_attributed(path: Path) -> None:
    """On each test trace: one prefill and the decode steps of the user
    regions, two layers each, at least 95% of kernel time attributed to a module."""
    (lane,) = measure_trace(str(path))
    decode_steps = 4
    assert [(s.stage, len(s.steps)) for s in lane.stages] == [("prefill", 1), ("decode", decode_steps)]
    for stage in lane.stages:
        assert stage.num_layers == 2
        assert all(s.num_layers == 2 for s in stage.steps)
        assert stage.attributed_share() >= 0.95
        assert stage.unmatched == ()
    # the input ids' random fill before the first region has no attention: it joins the first step
    assert lane.outside_steps_kernels == 0
    assert lane.device == "NVIDIA H100 80GB HBM3"


def test_user_regions_are_the_steps_and_frames_the_layers(llama: LaneMeasure) -> None:
    prefill, decode = llama.stages
    assert [s.label for s in _steps(llama)] == ["prefill"] + ["decode"] * 4
    assert {s.step_source for s in _steps(llama)} == {"user region"}
    assert {s.layer_source for s in _steps(llama)} == {"module frames"}
    assert {s.stage_source for s in _steps(llama)} == {"annotation"}
    # every kernel was classified by the operator that launched it: no kernel name had to be known
    assert {a.source for a in prefill.attribution} == {SOURCE_OP}
    reasons = {a.reason for a in prefill.attribution}
    assert {"aten::linear", "aten::scaled_dot_product_attention", "aten::mean", "aten::cat"} <= reasons


def test_modules_equal_the_independent_attribution(llama: LaneMeasure) -> None:
    expected = independent_modules(LLAMA)
    for step, want in zip(_steps(llama), expected):
        assert _module(step, cat.ATTN_PROJ) == pytest.approx(want["attn_proj"] * US)
        assert _module(step, cat.DENSE_FFN) == pytest.approx(want["dense_ffn"] * US)
        assert _module(step, cat.ATTN_CORE) == pytest.approx(want["attn_core"] * US)
        # the LM head: its GEMM plus the final norm's kernels
        assert _module(step, cat.LM_HEAD) > want["lm_head_gemm"] * US > 0
        assert step.kernel_time_s == pytest.approx(want["total"] * US)
    # q, k, v, o of Llama-2-7B are four 4096 x 4096 GEMMs: two layers, eight GEMMs a step
    assert next(m for m in _steps(llama)[0].modules if m.module == cat.ATTN_PROJ).kernels == 8


def test_without_python_frames_the_kernel_pattern_finds_the_same(llama: LaneMeasure) -> None:
    """with_stack=False: no nn.Module frames. Layers come from the attention operator and the
    norm's mean/rsqrt; the GEMMs' modules from their place in the layer."""
    (bare,) = measure_trace(str(LLAMA_NOSTACK))
    for with_frames, without in zip(_steps(llama), _steps(bare)):
        assert without.layer_source == "kernel pattern"
        for module in (cat.ATTN_PROJ, cat.DENSE_FFN, cat.ATTN_CORE):
            assert _module(without, module) == pytest.approx(_module(with_frames, module))
        assert without.kernel_time_s == pytest.approx(with_frames.kernel_time_s)


@pytest.mark.parametrize("path", [LLAMA_COMPILED, LLAMA_GRAPHS], ids=["compiled", "graphs"])
def test_compiled_traces_split_triton_kernels_by_what_they_fuse(llama: LaneMeasure, path: Path) -> None:
    """torch.compile: elementwise work fused into Triton kernels, the norms among them named
    `triton_red_fused_..._rsqrt_...`, mark the layers; GEMMs and attention keep their kernels."""
    (lane,) = measure_trace(str(path))
    for eager, compiled in zip(_steps(llama), _steps(lane)):
        assert compiled.num_layers == 2 and compiled.layer_source == "kernel pattern"
        for module in (cat.ATTN_PROJ, cat.DENSE_FFN, cat.ATTN_CORE):
            assert _module(compiled, module) == pytest.approx(_module(eager, module))
        assert _module(compiled, cat.ELEMENTWISE) < _module(eager, cat.ELEMENTWISE)  # fused: fewer passes
    reasons = {a.reason for stage in lane.stages for a in stage.attribution if a.source == SOURCE_RULE}
    assert "norm" in reasons  # the fused norms, by name
    if path == LLAMA_GRAPHS:
        # one replay per region: no operator launched the replayed kernels, their names classify them; only
        # the eager work around the model (the input ids' fill, the argmax of the next token) has operators
        by_op = {a.reason for stage in lane.stages for a in stage.attribution if a.source == SOURCE_OP}
        assert by_op <= {"aten::randint", "aten::argmax"}


def test_moe_modules_from_operators_and_frames() -> None:
    (lane,) = measure_trace(str(MIXTRAL))
    expected = independent_modules(MIXTRAL)
    for step, want in zip(_steps(lane), expected):
        assert _module(step, cat.MOE_EXPERTS) == pytest.approx(want["moe_experts"] * US)
        assert _module(step, cat.ATTN_PROJ) == pytest.approx(want["attn_proj"] * US)
        # the router: its gate GEMM and its softmax / top-k kernels
        assert _module(step, cat.ROUTER) > want["router_gemm"] * US > 0
        assert _module(step, cat.DENSE_FFN) == 0.0  # no dense MLP in Mixtral
    (compiled,) = measure_trace(str(MIXTRAL_COMPILED))
    for eager, comp in zip(_steps(lane), _steps(compiled)):
        assert _module(comp, cat.MOE_EXPERTS) == pytest.approx(_module(eager, cat.MOE_EXPERTS))


# ---------------------------------------------------------------------------------------------
# Steps without the regions: --step-regions, model forward frames, the repeating pattern


def _rewrite(path: Path, out: Path, rename: dict[str, str] | None = None, drop_annotations: bool = False,
             drop_frames: bool = False) -> Path:
    with gzip.open(path, "rt") as handle:
        doc = json.load(handle)
    events = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation":
            if drop_annotations:
                continue
            if rename and e["name"] in rename:
                e = {**e, "name": rename[e["name"]]}
        if drop_frames and e.get("cat") == "python_function":
            continue
        events.append(e)
    doc["traceEvents"] = events
    with gzip.open(out, "wt") as handle:
        json.dump(doc, handle)
    return out


def test_named_step_regions_and_stage_from_shapes(tmp_path: Path) -> None:
    path = _rewrite(LLAMA, tmp_path / "iterations.json.gz", rename={"prefill": "iteration", "decode": "iteration"})
    (lane,) = measure_trace(str(path), step_regions=("iteration",))
    steps = _steps(lane)
    assert [s.stage for s in steps] == ["prefill"] + ["decode"] * 4
    assert {s.step_source for s in steps} == {"user region"}
    assert steps[0].stage_source == "attention query length 128 (recorded shapes)"
    assert steps[1].stage_source == "attention query length 1 (recorded shapes)"


def test_model_forward_frames_are_steps_without_regions(tmp_path: Path) -> None:
    path = _rewrite(LLAMA, tmp_path / "bare.json.gz", drop_annotations=True)
    (lane,) = measure_trace(str(path))
    steps = _steps(lane)
    assert [(s.stage, s.step_source, s.num_layers) for s in steps] == (
        [("prefill", "model forward frame", 2)] + [("decode", "model forward frame", 2)] * 4)
    assert steps[0].label == "nn.Module: LlamaForCausalLM_0"


def test_repeating_pattern_cuts_unmarked_eager_kernels(tmp_path: Path) -> None:
    """No regions, no frames: one run of eager kernels, cut before each embedding lookup that
    starts another forward pass; the stage from the shapes."""
    path = _rewrite(LLAMA, tmp_path / "plain.json.gz", drop_annotations=True, drop_frames=True)
    (lane,) = measure_trace(str(path))
    steps = _steps(lane)
    assert [(s.stage, s.num_layers) for s in steps] == [("prefill", 2)] + [("decode", 2)] * 4
    assert {s.step_source for s in steps} == {"whole trace, cut at each embedding lookup"}
    (regions,) = measure_trace(str(LLAMA))
    for cut, marked in zip(steps, _steps(regions)):
        assert _module(cut, cat.DENSE_FFN) == pytest.approx(_module(marked, cat.DENSE_FFN))
