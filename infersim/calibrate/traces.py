"""Profiler traces as calibration input: kernel time per module, measured against the simulation.

A trace (PyTorch profiler / Kineto, the files `compare --trace` reads) is measured by
infersim.trace.measure_trace and compared with the simulation of its run config by
infersim.trace.compare_lane, exactly as `compare --trace` does: each traced stage (prefill, decode)
gives, per module (attention core, projections, FFN, norms, all-reduce, ...), the kernel time per
layer on both sides (per step for a module outside the layers: embedding, LM head), so a trace of
a few layers (a pipeline stage, a cut-down profile) compares with the whole model's simulation.
Each such module time is one measured point (`kernel_ms`), and one experiment of the fit: held out, a module is predicted by the kernel-family time scales fitted on the other
modules and stages, so a scale carries over only if the modules of its family agree.

The simulator's kernel-family time scales (hardware.derates.kernel_time_scale) multiply its module
times family by family, so the trace determines them; host time (the `overhead` row: the GPU idle
in a step) is not a kernel time and is not fitted from a trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.cards import categories as cat

#: the metric of a traced module's kernel time per layer (per step outside the layers), milliseconds
TRACE_METRIC = "kernel_ms"


@dataclass(frozen=True)
class TracedModule:
    """One module of one traced stage: where to find it again in a comparison."""

    trace: str
    rank: str
    lane: Any  # infersim.trace.LaneMeasure
    stage: str  # the predicted stage it is compared with (prefill / decode)
    module: str

    @property
    def point(self) -> str:
        return f"{self.stage}:{self.module}"


def _comparisons(config: Any, lane: Any) -> Any:
    from infersim.run.simulate import simulate
    from infersim.trace import compare_lane

    result: Any = simulate(config)  # its stages are what compare_lane's protocol reads
    return compare_lane(lane, result.prefill, result.decode, "prefill")


def traced_comparisons(config: Any, traced: TracedModule) -> Any:
    """The comparisons of `traced`'s lane with the simulation of `config`: what every module of that
    lane is predicted from (compute once per lane and constants, read per module)."""
    return _comparisons(config, traced.lane)


def predict_traced(config: Any, traced: TracedModule, comparisons: Any = None) -> dict[tuple[str, str], float]:
    """(stage:module, kernel_ms) -> the simulated kernel time per layer of the module, in ms, from
    `comparisons` (traced_comparisons of the same config) when given."""
    for comparison in comparisons if comparisons is not None else _comparisons(config, traced.lane):
        if comparison.stage != traced.stage:
            continue
        for row in comparison.modules:
            if row.module == traced.module:
                return {(traced.point, TRACE_METRIC): row.predicted_per_layer_s * 1e3}
    return {(traced.point, TRACE_METRIC): 0.0}


def load_traces(paths: list[Path], config_path: str | None) -> tuple[list[tuple[TracedModule, float]], list[str]]:
    """Each module measured in each traced stage of `paths` (rank 0 of each), with its measured kernel
    time per layer in ms; and, in words, each module that cannot be fitted (nothing predicted for it,
    or nothing measured)."""
    from infersim.run.config import load_run_config
    from infersim.trace import measure_trace

    if paths and config_path is None:
        raise InferSimError("--trace: give --config RUN.yaml, the model, GPUs, engine and batch the trace ran")
    if not paths:
        return [], []
    config = load_run_config(config_path)
    points: list[tuple[TracedModule, float]] = []
    unused: list[str] = []
    for path in paths:
        if not path.exists():
            raise InferSimError(f"--trace {path}: no such file")
        lanes = measure_trace(str(path))
        if not any(lane.stages for lane in lanes):
            raise InferSimError(f"--trace {path}: no forward steps found (no attention kernel and no step "
                                "annotation; `compare --trace` shows what the trace holds)")
        for lane in lanes:
            for comparison in _comparisons(config, lane):
                for row in comparison.modules:
                    traced = TracedModule(str(path), lane.rank, lane, comparison.stage, row.module)
                    if row.module == cat.OVERHEAD:
                        continue  # host time, not a kernel family's
                    measured, predicted = row.measured_per_layer_s, row.predicted_per_layer_s
                    if measured <= 0 or predicted <= 0:
                        unused.append(f"{path.name} {traced.point}: measured {measured * 1e3:.4g} ms, predicted "
                                      f"{predicted * 1e3:.4g} ms per layer; not fitted")
                        continue
                    points.append((traced, measured * 1e3))
    return points, unused
