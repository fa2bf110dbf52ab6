"""Collect the few events trace comparison needs from a streamed trace, in compact columns.

Kept: GPU activities (kernels, memcpy, memset), the CPU launch calls they correlate with (so a
kernel can be placed inside the CPU context of its launch), the host's waits for the GPU
(`cudaDeviceSynchronize`, `cudaStreamSynchronize`, ...: the time the host did no work of its own),
user annotations, the CPU operators that say what their kernels do (`operators.op_class`: GEMMs,
attention, norms, elementwise ...; with their recorded input shapes: M, N, K of a GEMM, the
tensors an elementwise kernel streams) and the `nn.Module` Python frames.
Everything else (other Python frames, views and allocations, flow arrows, metadata) is dropped as
it streams by. Names are interned and numbers live in typed arrays, so a rank with a million
kernels costs tens of MB. Times stay in the trace's microseconds here; the analysis converts to
seconds.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from infersim.trace.operators import MODULE_FRAME_PREFIX, op_class, shapes_text
from infersim.trace.reader import FLOW, ChromeTraceReader

KIND_KERNEL = 0
KIND_MEMCPY = 1
KIND_MEMSET = 2
_GPU_KINDS = {"kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "gpu_memset": KIND_MEMSET,
              "memcpy": KIND_MEMCPY, "memset": KIND_MEMSET}
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime"})
_ANNOTATION_CATS = frozenset({"user_annotation"})
# CPU calls that start GPU work; other runtime calls (event queries, attribute setters) are noise
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")
# CPU calls in which the host waits for the GPU (its own work stops until the device catches up)
_WAIT_WORDS = ("Synchronize",)


@dataclass(frozen=True)
class Annotation:
    name: str
    thread: int  # index into RawTrace.threads
    start_us: float
    end_us: float


@dataclass(frozen=True)
class RawTrace:
    """One trace file's kernels, launches and annotations (times in trace microseconds)."""

    path: Path
    top_level: dict[str, Any]
    names: tuple[str, ...]  # interned kernel and launch names
    lanes: tuple[str, ...]  # GPU lanes: the pid of GPU events (the device in Kineto traces)
    threads: tuple[tuple[str, str], ...]  # CPU (pid, tid) of launches and annotations
    kernel_name: array
    kernel_kind: array
    kernel_start_us: array
    kernel_dur_us: array
    kernel_lane: array
    kernel_stream: array
    kernel_correlation: array
    launch_name: array
    launch_thread: array
    launch_start_us: array
    launch_correlation: array
    annotations: tuple[Annotation, ...]
    # the host waiting for the GPU (cudaDeviceSynchronize, cudaStreamSynchronize, ...), per CPU thread
    wait_thread: array = field(default_factory=lambda: array("i"))
    wait_start_us: array = field(default_factory=lambda: array("d"))
    wait_end_us: array = field(default_factory=lambda: array("d"))
    # CPU operators that classify their kernels (operators.op_class), as columns
    op_name: array = field(default_factory=lambda: array("i"))  # index into names
    op_thread: array = field(default_factory=lambda: array("i"))
    op_start_us: array = field(default_factory=lambda: array("d"))
    op_end_us: array = field(default_factory=lambda: array("d"))
    op_shapes: array = field(default_factory=lambda: array("i"))  # index into shape_texts, -1: none recorded
    shape_texts: tuple[str, ...] = ()
    # nn.Module Python frames (with_stack=True)
    frame_name: array = field(default_factory=lambda: array("i"))  # index into names
    frame_thread: array = field(default_factory=lambda: array("i"))
    frame_start_us: array = field(default_factory=lambda: array("d"))
    frame_end_us: array = field(default_factory=lambda: array("d"))
    events_read: int = 0
    chars_read: int = 0
    skipped_events: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kernel_count(self) -> int:
        return len(self.kernel_start_us)

    @property
    def has_shapes(self) -> bool:
        """Whether the profile recorded operator input shapes (record_shapes=True)."""
        return bool(self.shape_texts)

    def device_name(self, lane: int | None = None) -> str | None:
        """The GPU's name from the trace's deviceProperties (the lane's device when it is a number)."""
        props = self.top_level.get("deviceProperties")
        if not isinstance(props, list) or not props:
            return None
        wanted = None
        if lane is not None and self.lanes[lane].lstrip("-").isdigit():
            wanted = int(self.lanes[lane])
        for entry in props:
            if isinstance(entry, dict) and (wanted is None or entry.get("id") == wanted):
                name = entry.get("name")
                return str(name) if name else None
        return None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _lane_key(pid: Any) -> Any:
    """A GPU pid as a dict key: kept when hashable, else its JSON text (a list or object in the file)."""
    try:
        hash(pid)
        return pid
    except TypeError:
        return json.dumps(pid, sort_keys=True, default=str)


def _lane_labels(lanes: dict[Any, int]) -> tuple[str, ...]:
    labels = [str(pid) for pid in lanes]
    if len(set(labels)) != len(labels):  # 0 and "0" in one merged file: keep them apart
        labels = [f"{pid!r}" for pid in lanes]
    return tuple(labels)


# categories never needed: flow arrows, instant events, the profiler's own spans, GPU projections of annotations
_UNNEEDED_CATS = frozenset({FLOW, "ac2g", "cpu_instant_event", "Trace", "fwdbwd", "gpu_user_annotation",
                            "python_function_instant", "kernel_instant", "overhead"})


def _unwanted(op_classes: dict[str, str | None]) -> Callable[[str, str], bool]:
    """The reader's skip predicate: events dropped before they are parsed (see ChromeTraceReader)."""
    def unwanted(category: str, raw_name: str) -> bool:
        if category == "python_function":
            return not raw_name.startswith(MODULE_FRAME_PREFIX)
        if category == "cpu_op":
            if "\\" in raw_name:
                return False  # escapes in the name: decide on the parsed event
            found = op_classes.get(raw_name, "?")
            if found == "?":
                found = op_classes[raw_name] = op_class(raw_name)
            return found is None
        if category in _LAUNCH_CATS:
            return not any(word in raw_name for word in _LAUNCH_WORDS + _WAIT_WORDS)
        return category in _UNNEEDED_CATS
    return unwanted


def load_trace(path: str | Path) -> RawTrace:
    """Stream one trace file and keep kernels, launches and annotations."""
    op_classes: dict[str, str | None] = {}  # per operator name: its class (None: dropped)
    reader = ChromeTraceReader(path, skip=_unwanted(op_classes))
    names: dict[str, int] = {}
    lanes: dict[Any, int] = {}  # GPU pid as written (int in Kineto) -> lane index
    threads: dict[tuple[str, str], int] = {}
    k_name, k_kind, k_lane, k_stream, k_corr = array("i"), array("b"), array("i"), array("q"), array("q")
    k_start, k_dur = array("d"), array("d")
    l_name, l_thread, l_corr = array("i"), array("i"), array("q")
    l_start = array("d")
    w_thread, w_start, w_end = array("i"), array("d"), array("d")
    annotations: list[Annotation] = []
    o_name, o_thread, o_shapes = array("i"), array("i"), array("i")
    o_start, o_end = array("d"), array("d")
    f_name, f_thread = array("i"), array("i")
    f_start, f_end = array("d"), array("d")
    shape_index: dict[str, int] = {}
    skipped = 0

    def intern(table: dict, key: Any) -> int:
        index = table.get(key)
        if index is None:
            index = table[key] = len(table)
        return index

    for event in reader:
        category = event.get("cat")
        if event.get("ph") != "X" or not isinstance(category, str):
            continue
        if category == "cpu_op" or category == "python_function":
            # the bulk of a trace: decide on the name before anything else is read
            name = event.get("name")
            if not isinstance(name, str):
                continue
            if category == "python_function":
                if not name.startswith(MODULE_FRAME_PREFIX):
                    continue
                keep_class = None
            else:
                keep_class = op_classes.get(name, "?")
                if keep_class == "?":
                    keep_class = op_classes[name] = op_class(name)
                if keep_class is None:
                    continue
            try:
                start = float(event["ts"])
                end = start + max(float(event.get("dur", 0.0)), 0.0)
            except (KeyError, TypeError, ValueError):
                skipped += 1
                continue
            if not (math.isfinite(start) and math.isfinite(end)):
                skipped += 1
                continue
            thread_index = intern(threads, (str(event.get("pid", "")), str(event.get("tid", ""))))
            if category == "python_function":
                f_name.append(intern(names, name))
                f_thread.append(thread_index)
                f_start.append(start)
                f_end.append(end)
                continue
            # every kept operator launches work: its shapes say what (M, N, K; the bytes it streams)
            shape_id = -1
            args = event.get("args")
            text = shapes_text(args) if isinstance(args, dict) else None
            if text is not None:
                shape_id = intern(shape_index, text)
            o_name.append(intern(names, name))
            o_thread.append(thread_index)
            o_start.append(start)
            o_end.append(end)
            o_shapes.append(shape_id)
            continue
        kind = _GPU_KINDS.get(category)
        if kind is None and category not in _LAUNCH_CATS and category not in _ANNOTATION_CATS:
            category = category.lower()  # PyTorch <= 1.11 wrote "Kernel", "Memcpy", "Runtime"
            kind = _GPU_KINDS.get(category)
            if kind is None and category not in _LAUNCH_CATS and category not in _ANNOTATION_CATS:
                continue  # cpu_op, python_function, ...: the bulk of a trace, not needed
        try:
            start = float(event["ts"])
            duration = float(event.get("dur", 0.0))
            name = event["name"]
        except (KeyError, TypeError, ValueError):
            skipped += 1
            continue
        if not (math.isfinite(start) and math.isfinite(duration)):  # NaN/Infinity in the file: not a time
            skipped += 1
            continue
        if not isinstance(name, str):
            name = str(name)
        args = event.get("args")
        if not isinstance(args, dict):
            args = {}
        if kind is not None:
            # the hot path (millions of kernels): plain ints as Kineto writes them, interned keys
            pid = event.get("pid", args.get("device", "?"))
            if type(pid) is not int and not isinstance(pid, str):
                pid = _lane_key(pid)
            lane_index = lanes.get(pid)
            if lane_index is None:
                lane_index = lanes[pid] = len(lanes)
            name_index = names.get(name)
            if name_index is None:
                name_index = names[name] = len(names)
            stream = args.get("stream")
            if type(stream) is not int:
                stream = _int_or_none(stream)
                if stream is None:
                    stream = _int_or_none(event.get("tid"))
            correlation = args.get("correlation")
            if type(correlation) is not int:
                correlation = _int_or_none(correlation)
            k_name.append(name_index)
            k_kind.append(kind)
            k_start.append(start)
            k_dur.append(duration if duration > 0.0 else 0.0)
            k_lane.append(lane_index)
            k_stream.append(stream if stream is not None else -1)
            k_corr.append(correlation if correlation is not None else -1)
            continue
        thread_key = (str(event.get("pid", "")), str(event.get("tid", "")))
        if category in _LAUNCH_CATS:
            if not any(word in name for word in _LAUNCH_WORDS):
                if any(word in name for word in _WAIT_WORDS):
                    w_thread.append(intern(threads, thread_key))
                    w_start.append(start)
                    w_end.append(start + max(duration, 0.0))
                continue
            correlation = _int_or_none(args.get("correlation"))
            if correlation is None:
                continue
            l_name.append(intern(names, name))
            l_thread.append(intern(threads, thread_key))
            l_start.append(start)
            l_corr.append(correlation)
        else:  # user annotation
            annotations.append(Annotation(name, intern(threads, thread_key), start, start + max(duration, 0.0)))

    return RawTrace(
        path=Path(path), top_level=reader.top_level, names=tuple(names), lanes=_lane_labels(lanes),
        threads=tuple(threads), kernel_name=k_name, kernel_kind=k_kind, kernel_start_us=k_start,
        kernel_dur_us=k_dur, kernel_lane=k_lane, kernel_stream=k_stream, kernel_correlation=k_corr,
        launch_name=l_name, launch_thread=l_thread, launch_start_us=l_start, launch_correlation=l_corr,
        annotations=tuple(annotations), wait_thread=w_thread, wait_start_us=w_start, wait_end_us=w_end,
        op_name=o_name, op_thread=o_thread, op_start_us=o_start, op_end_us=o_end,
        op_shapes=o_shapes, shape_texts=tuple(shape_index), frame_name=f_name, frame_thread=f_thread,
        frame_start_us=f_start, frame_end_us=f_end, events_read=reader.events_read, chars_read=reader.chars_read,
        skipped_events=skipped)
