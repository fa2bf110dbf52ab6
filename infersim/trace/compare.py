"""Measured (trace) against predicted (simulation): per module, per layer and per step.

The simulator side is read through a small protocol (a stage result with `step_time_s`,
`num_layers` and `operations` carrying `module`, `time_s` and `layers`), so this module does not
import the simulator and works with any object of that shape.

Errors are relative: (predicted - measured) / measured, None where nothing was measured. Rows are
ordered by the absolute gap per step, largest first: the module to look at first.

The step is compared whole: the measured step is its wall time (the CPU extent of a step the host
waits in, else the GPU span; records.StepMeasure.wall_s) against TTFT / TPOT. Its kernels are
compared module by module, and the time in the step the GPU runs nothing (wall - GPU busy: the GPU
waiting for the host's launches and Python, or between back-to-back kernels) is the measured
counterpart of the prediction's `overhead` (the engine's exposed host time per step: fixed work,
step_cpu, launches beyond the GPU time). So both sides' rows add up to their step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from infersim.cards import categories as cat
from infersim.trace.records import LaneMeasure, StageMeasure


class PredictedOperation(Protocol):
    module: str
    layers: int
    time_s: float


class PredictedStage(Protocol):
    step_time_s: float
    num_layers: int
    operations: Sequence[PredictedOperation]


def relative_error(predicted: float, measured: float) -> float | None:
    if measured <= 0:
        return None
    return (predicted - measured) / measured


@dataclass(frozen=True)
class ModuleComparison:
    module: str
    measured_s: float  # kernel time per step
    predicted_s: float
    measured_per_layer_s: float
    predicted_per_layer_s: float
    measured_exposed_s: float  # communication not hidden behind compute on another stream
    measured_hidden_s: float

    @property
    def gap_s(self) -> float:
        return self.predicted_s - self.measured_s

    @property
    def error(self) -> float | None:
        return relative_error(self.predicted_s, self.measured_s)

    @property
    def per_layer_error(self) -> float | None:
        return relative_error(self.predicted_per_layer_s, self.measured_per_layer_s)


@dataclass(frozen=True)
class StageComparison:
    stage: str  # the predicted stage compared against
    measured: StageMeasure
    measured_step_s: float  # wall time of a step (mean; StageMeasure.wall_s, else the GPU span)
    predicted_step_s: float  # TTFT (prefill) / TPOT (decode) of the simulation
    measured_layers: int
    predicted_layers: int
    modules: tuple[ModuleComparison, ...]  # largest |gap| first
    notes: tuple[str, ...] = ()

    @property
    def step_error(self) -> float | None:
        return relative_error(self.predicted_step_s, self.measured_step_s)


def predicted_module_times(stage: PredictedStage) -> dict[str, tuple[float, float]]:
    """module -> (seconds per step, seconds per layer). Per layer divides the in-layer time by
    the stage's layer count; a module that only runs once per step (LM head) keeps its step time."""
    per_step: dict[str, float] = {}
    in_layers: dict[str, float] = {}
    for op in stage.operations:
        per_step[op.module] = per_step.get(op.module, 0.0) + op.time_s
        if _is_layer_operation(op):
            in_layers[op.module] = in_layers.get(op.module, 0.0) + op.time_s
    layers = max(stage.num_layers, 1)
    return {m: (t, in_layers[m] / layers if in_layers.get(m) else t) for m, t in per_step.items()}


def _is_layer_operation(op: PredictedOperation) -> bool:
    group = getattr(op, "group", None)
    if group is not None and group != "":
        return group != "per step"
    return op.layers > 1


def compare_stage(measured: StageMeasure, predicted: PredictedStage, stage: str,
                  notes: Iterable[str] = ()) -> StageComparison:
    predicted_times = predicted_module_times(predicted)
    wall = measured.wall_s if measured.wall_s > 0 else measured.step_time_s
    idle = max(0.0, wall - measured.busy_s)
    rows = []
    for module in sorted(set(predicted_times) | {m.module for m in measured.modules} | {cat.OVERHEAD}):
        m = measured.module(module)
        p_step, p_layer = predicted_times.get(module, (0.0, 0.0))
        # overhead: the GPU idle in the step (the host's time the GPU waits for) beside any overhead kernels;
        # a per-step time, so its per-layer column is the step's too
        extra = idle if module == cat.OVERHEAD else 0.0
        measured_s = (m.time_s if m else 0.0) + extra
        if measured_s == 0.0 and p_step == 0.0:
            continue
        rows.append(ModuleComparison(
            module=module, measured_s=measured_s, predicted_s=p_step,
            measured_per_layer_s=(m.per_layer_s if m else 0.0) + extra, predicted_per_layer_s=p_layer,
            measured_exposed_s=(m.exposed_s if m else 0.0) + extra, measured_hidden_s=m.hidden_s if m else 0.0))
    rows.sort(key=lambda r: (-abs(r.gap_s), r.module))
    all_notes = list(notes)
    if measured.num_layers and predicted.num_layers and measured.num_layers != predicted.num_layers:
        all_notes.append(f"the trace shows {measured.num_layers} layers per step, the simulation "
                         f"{predicted.num_layers}: per-step times differ for that reason too "
                         "(pipeline stage? two-batch overlap runs each layer's kernels twice)")
    if predicted_times.get(cat.OVERHEAD) or idle:
        all_notes.append(f"overhead: predicted = the engine's exposed host time per step (fixed work, step_cpu, "
                         f"launches beyond the GPU time); measured = the GPU idle in the step ({idle * 1e3:.3f} ms: "
                         f"the step's wall time less GPU busy time, the GPU waiting for the host or between "
                         f"back-to-back kernels) plus any batch-preparation kernels")
    return StageComparison(stage, measured, wall, predicted.step_time_s, measured.num_layers,
                           predicted.num_layers, tuple(rows), tuple(all_notes))


def compare_lane(lane: LaneMeasure, prefill: PredictedStage, decode: PredictedStage,
                 unknown_as: str = "prefill") -> tuple[StageComparison, ...]:
    """Compare each measured stage of a lane with the predicted stage of the same name; steps the
    trace does not mark as prefill or decode are compared with `unknown_as`."""
    out = []
    for measured in lane.stages:
        stage = measured.stage if measured.stage in ("prefill", "decode") else unknown_as
        notes = [] if measured.stage == stage else [
            f"the trace does not say whether its steps are prefill or decode: compared with {stage} "
            "(choose with --stage)"]
        out.append(compare_stage(measured, prefill if stage == "prefill" else decode, stage, notes))
    return tuple(out)
