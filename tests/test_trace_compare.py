"""Measured vs predicted: module rows, errors, ordering, and the `compare` command (text and JSON)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT, shared_reference

from infersim.base.errors import InferSimError
from infersim.cards import categories as cat
from infersim.trace import compare_lane, measure_trace
from infersim.trace import cli as trace_cli
from infersim.trace.compare import compare_stage, predicted_module_times
from tracegen.synthetic import TraceBuilder, dense_step, write_trace

US = 1e-6


@dataclass(frozen=True)
class Op:
    name: str
    module: str
    layers: int
    time_s: float
    group: str = "layers"


@dataclass(frozen=True)
class Stage:
    step_time_s: float
    num_layers: int
    operations: tuple[Op, ...]
    tokens_per_gpu: int = 512

    @property
    def tgs(self) -> float:
        return self.tokens_per_gpu / self.step_time_s


# a prediction for two dense layers (dense_step(2)): per layer attn_core 40 µs (measured 51),
# dense_ffn 130 µs (measured 100), attn_proj 50 µs (= measured); LM head 20 µs once per step
PREDICTED = Stage(0.0006, 2, (
    Op("attn_core", cat.ATTN_CORE, 2, 80 * US),
    Op("gate_up", cat.DENSE_FFN, 2, 160 * US), Op("down", cat.DENSE_FFN, 2, 100 * US),
    Op("qkv_proj", cat.ATTN_PROJ, 2, 100 * US),
    Op("lm_head", cat.LM_HEAD, 1, 20 * US, "per step"),
    Op("scheduler", cat.OVERHEAD, 1, 30 * US, "per step"),
))


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = TraceBuilder()
    start = b.cpu_us
    b.eager(dense_step(2))
    b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
    return write_trace(tmp_path_factory.mktemp("cmp") / "run-TP-0.trace.json.gz", b.drain())


def test_predicted_module_times_per_step_and_per_layer() -> None:
    times = predicted_module_times(PREDICTED)
    assert times[cat.DENSE_FFN] == pytest.approx((260 * US, 130 * US))
    assert times[cat.LM_HEAD] == pytest.approx((20 * US, 20 * US))  # per step: per layer = per step


def test_modules_compared_largest_gap_first(trace: Path) -> None:
    (lane,) = measure_trace(str(trace))
    (comp,) = compare_lane(lane, PREDICTED, PREDICTED)
    assert comp.stage == "prefill"
    rows = {r.module: r for r in comp.modules}
    ffn = rows[cat.DENSE_FFN]
    assert (ffn.measured_s, ffn.predicted_s) == pytest.approx((200 * US, 260 * US))
    assert ffn.error == pytest.approx(0.30)
    assert ffn.per_layer_error == pytest.approx(0.30)
    core = rows[cat.ATTN_CORE]
    assert core.measured_per_layer_s == pytest.approx(51 * US)
    assert core.error == pytest.approx(80 / 102 - 1)
    assert rows[cat.ATTN_PROJ].error == pytest.approx(0.0)
    # measured but not predicted: all-reduce and elementwise
    assert rows[cat.ALL_REDUCE].predicted_s == 0.0 and rows[cat.ALL_REDUCE].error == pytest.approx(-1.0)
    # the predicted overhead (the engine's host time) against the GPU idle in the step: the builder leaves
    # 1 µs between its 30 back-to-back kernels, and the step annotation is no region the host waits in, so
    # the step is the GPU span
    stage = lane.stages[0]
    assert stage.wall_s == stage.step_time_s
    assert rows[cat.OVERHEAD].measured_s == pytest.approx(stage.step_time_s - stage.busy_s) == pytest.approx(29 * US)
    assert rows[cat.OVERHEAD].error == pytest.approx(30 / 29 - 1)
    gaps = [abs(r.gap_s) for r in comp.modules]
    assert gaps == sorted(gaps, reverse=True)
    assert comp.modules[0].module == cat.DENSE_FFN  # 60 µs, the largest gap
    assert comp.step_error == pytest.approx(0.0006 / comp.measured_step_s - 1)


def test_layer_count_mismatch_is_noted(trace: Path) -> None:
    (lane,) = measure_trace(str(trace))
    other = Stage(0.001, 61, PREDICTED.operations)
    comp = compare_stage(lane.stages[0], other, "prefill")
    assert any("2 layers per step, the simulation 61" in n for n in comp.notes)


def test_unmarked_stage_is_compared_as_requested(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.eager(dense_step(2))
    (lane,) = measure_trace(str(write_trace(tmp_path / "plain.json", b.drain())))
    assert lane.stages[0].stage == "unknown"
    decode = Stage(0.0009, 2, PREDICTED.operations)
    (comp,) = compare_lane(lane, PREDICTED, decode, unknown_as="decode")
    assert comp.stage == "decode" and comp.predicted_step_s == 0.0009
    assert "compared with decode" in comp.notes[0]


# ---------------------------------------------------------------------------------------------
# The command


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="infersim")
    trace_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", *argv])
    code = args.handler(args)
    return code, capsys.readouterr().out


def test_trace_only_text(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["--trace", str(trace), "--steps"], capsys)
    assert code == 0
    assert "== prefill: 1 step (step annotation), 2 layers per step (from kernel pattern) ==" in out
    assert "per layer (µs)" in out and "per step (ms)" in out
    line = next(row for row in out.splitlines() if row.startswith("dense_ffn"))
    assert line.split()[1:3] == ["0.200", "100.0"]  # ms per step, µs per layer
    assert "unclassified kernels: none" in out
    assert "step[EXTEND bs=1 toks=512]" in out


def test_trace_only_json(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["--trace", str(trace), "--format", "json"], capsys)
    assert code == 0
    (lane,) = json.loads(out)["lanes"]
    (stage,) = lane["stages"]
    assert stage["stage"] == "prefill" and stage["num_layers"] == 2
    ffn = next(m for m in stage["modules"] if m["module"] == "dense_ffn")
    assert ffn["time_s"] == pytest.approx(200 * US) and ffn["per_layer_s"] == pytest.approx(100 * US)
    assert stage["layers"][1]["modules"]["attn_core"] == pytest.approx(51 * US)


def test_real_trace_text_lists_four_layers(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_reference("traces", "deepseek-v3-train-ep64-h800.json")
    code, out = _run(["--trace", str(path)], capsys)
    assert code == 0
    assert "4 layers per step (from annotations)" in out
    header = next(row for row in out.splitlines() if row.startswith("module (µs)"))
    assert header.split()[2:] == ["layer", "0", "layer", "1", "layer", "2", "layer", "3"]
    total = next(row for row in out.splitlines() if row.startswith("total"))
    assert total.split()[1:] == ["21945.0", "22613.0", "26211.0", "26622.0"]


def test_compare_with_mocked_simulation(trace: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    result = SimpleNamespace(prefill=PREDICTED, decode=PREDICTED, warnings=())
    monkeypatch.setattr(trace_cli, "_simulate", lambda args, extra=(): (None, result))
    code, out = _run(["--trace", str(trace), "--config", "any.yaml"], capsys)
    assert code == 0
    table = out[out.index("per module, largest gap first"):]
    first_row = table.splitlines()[3]
    assert first_row.split()[:5] == ["dense_ffn", "0.200", "0.260", "0.060", "+30.0%"]
    code, out = _run(["--trace", str(trace), "--config", "any.yaml", "--format", "json"], capsys)
    (comp,) = json.loads(out)["lanes"][0]["comparisons"]
    assert comp["modules"][0]["module"] == "dense_ffn"
    assert comp["modules"][0]["error"] == pytest.approx(0.30)
    assert comp["predicted_step_s"] == pytest.approx(0.0006)


def test_compare_against_the_real_simulator(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO_ROOT / "configs" / "qwen3-30b.yaml"
    if not config.exists():
        pytest.skip("bundled example config not present")
    code, out = _run(["--trace", str(trace), "--config", str(config), "--format", "json"], capsys)
    assert code == 0
    (comp,) = json.loads(out)["lanes"][0]["comparisons"]
    assert comp["stage"] == "prefill" and comp["predicted_step_s"] > 0
    predicted = {m["module"] for m in comp["modules"] if m["predicted_s"] > 0}
    assert {"attn_core", "attn_proj", "moe_experts", "lm_head"} <= predicted


def test_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InferSimError, match="no such file"):
        _run(["--trace", str(tmp_path / "none.json")], capsys)
    with pytest.raises(InferSimError, match="r.jsonl: file not found"):
        _run(["--bench-result", str(tmp_path / "r.jsonl")], capsys)
    (tmp_path / "r.jsonl").write_text('{"batch_size": 8, "input_len": 64, "output_len": 4, "prefill_latency": 0.1}\n')
    with pytest.raises(InferSimError, match="needs the run to predict the same batch with: --config FILE, or --model "
                                            "and --hardware"):
        _run(["--bench-result", str(tmp_path / "r.jsonl")], capsys)
    with pytest.raises(InferSimError, match="--layers-per-step 0"):
        _run(["--trace", str(tmp_path), "--layers-per-step", "0"], capsys)
    with pytest.raises(SystemExit):  # argparse: --trace and --bench-result exclude each other
        _run(["--trace", "a", "--bench-result", "b"], capsys)
