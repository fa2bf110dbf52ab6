"""The host side of a step: how long the CPU worked on it, and how long the GPU waited for the CPU.

An eager PyTorch step is launched kernel by kernel from Python. Where the host is slower than the
GPU (small models, small batches, HF transformers' eager code) the GPU idles between kernels and the
step's time is the host's, so a trace's kernel times alone cannot say how long a step takes. The
CPU side of the trace can:

- **the step's CPU extent**: the step annotation it came from (the user's `record_function` region,
  SGLang's `step[...]`), else the model's forward frame (`nn.Module: LlamaForCausalLM_0`, with_stack);
- **the host's waits** inside it: `cudaDeviceSynchronize`, `cudaStreamSynchronize`, ... (the host
  does no work of its own while the GPU catches up);
- **the step's wall time**: the extent's span where the host waited inside it for the step's last
  kernel (a region that ends with a synchronisation, as a benchmark loop or generate()'s stopping
  check does): then the region is the whole step as its user saw it, host work before the first
  kernel included. Elsewhere (a region the CPU leaves before the GPU finishes, as SGLang's overlap
  scheduler does, or no extent at all) the step's time is the GPU span, first kernel to last;
- **the host's time per launch inside the decoder layers**: the spacing of consecutive launch calls
  whose kernels run in the layers, the host's waits between them taken out. It holds the launch call,
  the ATen dispatch and the Python (module calls, views, operators that launch nothing) between two
  kernels: the cost per kernel of eager model code on this host, whether or not the GPU was waiting.

Times here are the trace's microseconds; `records` converts to seconds.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from infersim.trace.attribution import Kernel, Lane
from infersim.trace.load import RawTrace


@dataclass(frozen=True)
class StepHost:
    """The CPU side of one step (trace microseconds)."""

    extent: str  # what the CPU extent is ("user region 'decode'", "model forward frame"), "" when none
    span_us: float  # the extent's CPU span (0 without one)
    wait_us: float  # the host waiting for the GPU inside the extent
    synchronous: bool  # the host waited inside the extent until the step's last kernel had run
    launches: int  # launch calls of the step's kernels (a CUDA-graph replay counts once)
    layer_launch_us: float  # host time between consecutive launches inside the decoder layers, waits out
    layer_launch_gaps: int  # how many such spacings

    @property
    def work_us(self) -> float:
        """The host's own work on the step: its extent less its waits."""
        return max(0.0, self.span_us - self.wait_us)


class HostWaits:
    """The host's waits for the GPU, per CPU thread, merged and sorted (for overlap sums)."""

    def __init__(self, raw: RawTrace) -> None:
        spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for i in range(len(raw.wait_thread)):
            spans[raw.wait_thread[i]].append((raw.wait_start_us[i], raw.wait_end_us[i]))
        self.by_thread: dict[int, tuple[array, array, array]] = {}
        for thread, items in spans.items():
            items.sort()
            starts, ends = array("d"), array("d")
            for start, end in items:
                if starts and start <= ends[-1]:
                    ends[-1] = max(ends[-1], end)
                else:
                    starts.append(start)
                    ends.append(end)
            cumulative = array("d", [0.0])
            for start, end in zip(starts, ends):
                cumulative.append(cumulative[-1] + end - start)
            self.by_thread[thread] = (starts, ends, cumulative)

    def within(self, thread: int, start: float, end: float) -> float:
        """Microseconds the host waited on `thread` between start and end."""
        found = self.by_thread.get(thread)
        if found is None or end <= start:
            return 0.0
        starts, ends, cumulative = found
        lo = bisect_right(ends, start)  # first wait ending after start
        hi = bisect_left(starts, end)  # waits starting before end
        if hi <= lo:
            return 0.0
        total = cumulative[hi] - cumulative[lo]
        total -= max(0.0, start - starts[lo])  # clip the first and last to [start, end]
        total -= max(0.0, ends[hi - 1] - end)
        return max(0.0, total)

    def last_end(self, thread: int, start: float, end: float) -> float | None:
        """End of the last wait on `thread` that starts inside [start, end], or None."""
        found = self.by_thread.get(thread)
        if found is None:
            return None
        starts, ends, _ = found
        i = bisect_right(starts, end) - 1
        if i < 0 or starts[i] < start:
            return None
        return ends[i]


def _extent(lane: Lane, kernels: Sequence[Kernel], annotation: int) -> tuple[str, int, float, float] | None:
    """(what, thread, start, end) of the step's CPU extent: its step annotation, else the one model
    forward frame its kernels were launched in."""
    raw = lane.raw
    if annotation >= 0:
        ann = raw.annotations[annotation]
        return f"region '{ann.name}'", ann.thread, ann.start_us, ann.end_us
    frames = {lane.model_frame[k.position] for k in kernels} - {-1}
    if len(frames) != 1:
        return None
    (frame,) = frames
    return ("model forward frame", raw.frame_thread[frame], raw.frame_start_us[frame], raw.frame_end_us[frame])


def step_host(lane: Lane, waits: HostWaits, kernels: Sequence[Kernel], annotation: int) -> StepHost:
    """The CPU side of one step (see the module docstring)."""
    raw = lane.raw
    launch_rows: dict[int, Kernel] = {}
    for k in kernels:
        row = lane.launch[k.position]
        if row >= 0 and row not in launch_rows:
            launch_rows[row] = k
    extent = _extent(lane, kernels, annotation)
    span = wait = 0.0
    synchronous = False
    what = ""
    if extent is not None:
        what, thread, start, end = extent
        span = end - start
        wait = waits.within(thread, start, end)
        last_kernel = max(k.end_us for k in kernels)
        last_wait = waits.last_end(thread, start, end)
        synchronous = last_wait is not None and last_wait >= last_kernel
    # launch spacing inside the layers, per thread, in call order
    by_thread: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    for row, k in launch_rows.items():
        by_thread[raw.launch_thread[row]].append((raw.launch_start_us[row], k.layer >= 0 and not lane.graph[k.position]))
    gap_us, gaps = 0.0, 0
    for thread, calls in by_thread.items():
        calls.sort()
        for (t0, in0), (t1, in1) in zip(calls, calls[1:]):
            if in0 and in1:
                gap_us += (t1 - t0) - waits.within(thread, t0, t1)
                gaps += 1
    return StepHost(what, span, wait, synchronous, len(launch_rows), gap_us, gaps)
