"""What a trace measurement hands back: time per step, per layer and per module of one GPU.

Seconds throughout; times are relative to the lane's first kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGES = ("prefill", "decode", "unknown")

# how a kernel's module was decided (reported per stage: which way each kernel was classified)
SOURCE_OP = "cpu op"  # the CPU operator (and nn.Module frames) that launched it
SOURCE_RULE = "name rule"  # kernel_rules.yaml (or --rules)
SOURCE_FAMILY = "kernel family"  # the library the name belongs to (cuBLAS, CUTLASS, cuDNN, Triton, ATen)
SOURCE_NONE = "unclassified"
SOURCES = (SOURCE_OP, SOURCE_RULE, SOURCE_FAMILY, SOURCE_NONE)


@dataclass(frozen=True)
class ModuleTime:
    """One module's kernel time in a step (or the mean over a stage's steps)."""

    module: str
    time_s: float  # kernel time per step, all streams
    per_layer_s: float  # kernel time inside layers / layers (per step time when it never runs in a layer)
    exposed_s: float  # not overlapped by compute on another stream (= time_s for compute modules)
    hidden_s: float  # overlapped by compute on another stream (communication only)
    kernels: float  # launches per step


@dataclass(frozen=True)
class LayerTime:
    index: int
    time_s: float  # kernel time of the layer, all streams
    modules: tuple[tuple[str, float], ...]  # (module, seconds), largest first


@dataclass(frozen=True)
class StepMeasure:
    index: int
    label: str  # the annotation, graph replay or group the step came from
    stage: str
    step_source: str  # how the step was found
    layer_source: str  # "annotations", "module frames" or "kernel pattern"
    start_s: float
    span_s: float  # first kernel start to last kernel end
    busy_s: float  # time at least one kernel runs
    kernel_time_s: float  # sum of kernel durations (streams added)
    num_layers: int
    modules: tuple[ModuleTime, ...]
    stage_source: str = ""  # how the stage was told: the annotation's name, the attention's query length, ...
    # the host side (trace.host): the step's wall time and the CPU's work on it
    wall_s: float = 0.0  # the step's time: its CPU extent where the host waited in it for the last kernel, else span_s
    wall_source: str = ""  # which of the two, in words
    synchronous: bool = False  # the wall time is the CPU extent's (the host waited in it for the last kernel)
    host_extent: str = ""  # the CPU extent: "region 'decode'", "model forward frame", "" (none found)
    host_work_s: float = 0.0  # the host's own work in that extent (its waits for the GPU taken out)
    launches: int = 0  # launch calls (a CUDA-graph replay counts once)
    layer_launch_s: float = 0.0  # host time between consecutive launches inside the decoder layers
    layer_launch_gaps: int = 0  # how many such spacings

    @property
    def gpu_idle_s(self) -> float:
        """Time in the step the GPU runs nothing: it waits for the host (launches, Python, the host's
        work before the first kernel) or for back-to-back kernels to start."""
        return max(0.0, self.wall_s - self.busy_s)


@dataclass(frozen=True)
class UnmatchedKernel:
    name: str
    count: int
    time_s: float


@dataclass(frozen=True)
class Attribution:
    """Kernels of a stage classified one way (SOURCES) on one ground (an operator, rule or family)."""

    source: str
    reason: str  # e.g. "aten::linear", "attn.core", "cuBLAS GEMM"
    kernels: int
    time_s: float  # over all the stage's steps


@dataclass(frozen=True)
class StageMeasure:
    """Measured time of one stage: the mean over its steps."""

    stage: str
    steps: tuple[StepMeasure, ...]
    num_layers: int  # the most common layer count of the steps
    step_time_s: float  # mean GPU span of a step
    busy_s: float
    kernel_time_s: float
    modules: tuple[ModuleTime, ...]  # largest first
    layers: tuple[LayerTime, ...]  # per layer index, mean over the steps with the usual layer count
    unmatched: tuple[UnmatchedKernel, ...]
    notes: tuple[str, ...] = ()
    attribution: tuple[Attribution, ...] = ()  # largest time first
    wall_s: float = 0.0  # mean wall time of a step (StepMeasure.wall_s)
    wall_source: str = ""  # how the steps' wall times were measured (the most common way)
    host_work_s: float = 0.0  # mean host work per step in its CPU extent (0: no extent found)
    launches: float = 0.0  # mean launch calls per step

    @property
    def gpu_idle_s(self) -> float:
        """Mean time per step the GPU waits (for the host, or between back-to-back kernels)."""
        return max(0.0, self.wall_s - self.busy_s)

    @property
    def launch_spacing_s(self) -> float | None:
        """Host seconds per launch inside the decoder layers over the stage's steps, or None."""
        gaps = sum(s.layer_launch_gaps for s in self.steps)
        return sum(s.layer_launch_s for s in self.steps) / gaps if gaps else None

    def module(self, name: str) -> ModuleTime | None:
        return next((m for m in self.modules if m.module == name), None)

    def attributed_share(self) -> float:
        """Share of the stage's kernel time attributed to a module (not unmatched)."""
        total = sum(a.time_s for a in self.attribution)
        if total <= 0:
            return 0.0
        return 1.0 - sum(a.time_s for a in self.attribution if a.source == SOURCE_NONE) / total


@dataclass(frozen=True)
class StreamTime:
    stream: int
    kernel_time_s: float
    kernels: int
    communication_s: float  # of which communication kernels


@dataclass(frozen=True)
class LaneMeasure:
    """Everything measured on one GPU (one rank) of one trace file."""

    path: str
    rank: str
    stages: tuple[StageMeasure, ...]
    streams: tuple[StreamTime, ...]
    kernels: int
    kernel_time_s: float
    outside_steps_s: float  # kernel time in no step (backward passes, warm-up, idle-batch work)
    outside_steps_kernels: int
    notes: tuple[str, ...] = ()
    device: str = ""  # the GPU's name from deviceProperties, when the trace has it

    def stage(self, name: str) -> StageMeasure | None:
        return next((s for s in self.stages if s.stage == name), None)


@dataclass(frozen=True)
class AnalysisOptions:
    stage: str | None = None  # only this stage; None: every stage found
    layers_per_step: int | None = None  # split unmarked eager kernels into steps of this many layers
    file_stage: str | None = None  # stage from the file name (-EXTEND / -DECODE)
    rank_label: str = ""  # rank from the file name
    lane: str | None = None  # GPU lane of a merged file (its pid); None = every lane
    step_regions: tuple[str, ...] = ()  # user annotation names that mark one step each (--step-regions)
