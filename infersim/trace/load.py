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
from typing import Any
from collections.abc import Callable

from infersim.trace.checks import (AFTER_LAUNCH, BEFORE_LAUNCH, DUPLICATE, NOT_A_NUMBER, NOT_FINITE, OUTSIDE_LAUNCHES,
                                   EventChecks, KernelColumns, off_launch, repeats_and_overlaps, without_rows)
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


#: the ids a trace's streams and correlations are kept in (64-bit signed, as CUDA and Kineto write them)
_ID_LOW, _ID_HIGH = -(1 << 63), 1 << 63


def _int_or_none(value: Any) -> int | None:
    """A stream or correlation id written as a whole number (an int, a whole float, digits), or None:
    what is not one, or lies outside 64 bits, no CUDA stream or correlation id is."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        # ASCII digits, few enough for 64 bits: int() refuses other digits, a second sign, and more
        # than 4,300 digits
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 19):
            return None
        value = int(text)
    if isinstance(value, int) and _ID_LOW <= value < _ID_HIGH:
        return value
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
    collector = _Collector(op_classes)
    for event in reader:
        collector.add(event)
    return collector.raw_trace(Path(path), reader)


class _Collector:
    """The columns of a RawTrace, filled event by event."""

    def __init__(self, op_classes: dict[str, str | None]) -> None:
        self.op_classes = op_classes
        self.names: dict[str, int] = {}
        self.lanes: dict[Any, int] = {}  # GPU pid as written (int in Kineto) -> lane index
        self.threads: dict[tuple[str, str], int] = {}
        self.k_name, self.k_kind, self.k_lane = array("i"), array("b"), array("i")
        self.k_stream, self.k_corr = array("q"), array("q")
        self.k_start, self.k_dur = array("d"), array("d")
        self.l_name, self.l_thread, self.l_corr, self.l_start = array("i"), array("i"), array("q"), array("d")
        self.w_thread, self.w_start, self.w_end = array("i"), array("d"), array("d")
        self.annotations: list[Annotation] = []
        self.o_name, self.o_thread, self.o_shapes = array("i"), array("i"), array("i")
        self.o_start, self.o_end = array("d"), array("d")
        self.f_name, self.f_thread, self.f_start, self.f_end = array("i"), array("i"), array("d"), array("d")
        self.shape_index: dict[str, int] = {}
        self.skipped = 0
        self.checks = EventChecks()

    @staticmethod
    def intern(table: dict, key: Any) -> int:
        index = table.get(key)
        if index is None:
            index = table[key] = len(table)
        return index

    def add(self, event: dict[str, Any]) -> None:
        category = event.get("cat")
        if event.get("ph") != "X" or not isinstance(category, str):
            return
        if category == "cpu_op" or category == "python_function":
            self._cpu(event, category)  # the bulk of a trace
            return
        kind = _GPU_KINDS.get(category)
        if kind is None and category not in _LAUNCH_CATS and category not in _ANNOTATION_CATS:
            category = category.lower()  # PyTorch <= 1.11 wrote "Kernel", "Memcpy", "Runtime"
            kind = _GPU_KINDS.get(category)
            if kind is None and category not in _LAUNCH_CATS and category not in _ANNOTATION_CATS:
                return  # cpu_op, python_function, ...: not needed
        try:
            start = float(event["ts"])
            duration = float(event.get("dur", 0.0))
            name = event["name"]
        except (KeyError, TypeError, ValueError):
            self._drop(kind, NOT_FINITE)
            return
        if type(event["ts"]) is bool or type(event.get("dur")) is bool:  # float() takes them as 0 and 1
            self._drop(kind, NOT_A_NUMBER)
            return
        if not math.isfinite(start):
            self._drop(kind, NOT_FINITE)
            return
        if not isinstance(name, str):
            self.checks.names_not_text += 1
            name = str(name)
        args = event.get("args")
        if not isinstance(args, dict):
            if args is not None:
                self.checks.args_not_object += 1
            args = {}
        if kind is not None:
            problem = self.checks.duration_problem(duration)
            if problem is not None:
                self.checks.dropped[problem] += 1
                return
            self._gpu(event, kind, start, duration, name, args)
        elif math.isfinite(duration):
            self._host(event, category, start, duration, name, args)
        else:
            self.skipped += 1

    def _drop(self, kind: int | None, reason: str) -> None:
        if kind is None:
            self.skipped += 1
        else:
            self.checks.dropped[reason] += 1

    def _cpu(self, event: dict[str, Any], category: str) -> None:
        """A CPU operator that classifies its kernels, or an nn.Module Python frame."""
        name = event.get("name")
        if not isinstance(name, str):
            return
        if category == "python_function":
            if not name.startswith(MODULE_FRAME_PREFIX):
                return
        else:
            keep_class = self.op_classes.get(name, "?")
            if keep_class == "?":
                keep_class = self.op_classes[name] = op_class(name)
            if keep_class is None:
                return
        try:
            start = float(event["ts"])
            end = start + max(float(event.get("dur", 0.0)), 0.0)
        except (KeyError, TypeError, ValueError):
            self.skipped += 1
            return
        if not (math.isfinite(start) and math.isfinite(end)):
            self.skipped += 1
            return
        thread_index = self.intern(self.threads, (str(event.get("pid", "")), str(event.get("tid", ""))))
        if category == "python_function":
            self.f_name.append(self.intern(self.names, name))
            self.f_thread.append(thread_index)
            self.f_start.append(start)
            self.f_end.append(end)
            return
        # every kept operator launches work: its shapes say what (M, N, K; the bytes it streams)
        args = event.get("args")
        text = shapes_text(args) if isinstance(args, dict) else None
        self.o_name.append(self.intern(self.names, name))
        self.o_thread.append(thread_index)
        self.o_start.append(start)
        self.o_end.append(end)
        self.o_shapes.append(self.intern(self.shape_index, text) if text is not None else -1)

    def _gpu(self, event: dict[str, Any], kind: int, start: float, duration: float, name: str,
             args: dict[str, Any]) -> None:
        # the hot path (millions of kernels): plain ints as Kineto writes them, interned keys
        pid = event.get("pid", args.get("device", "?"))
        if type(pid) is not int and not isinstance(pid, str):
            pid = _lane_key(pid)
        lane_index = self.lanes.get(pid)
        if lane_index is None:
            lane_index = self.lanes[pid] = len(self.lanes)
        name_index = self.names.get(name)
        if name_index is None:
            name_index = self.names[name] = len(self.names)
        stream = args.get("stream")
        if type(stream) is not int or not _ID_LOW <= stream < _ID_HIGH:
            stream = _int_or_none(stream)
            if stream is None:
                stream = _int_or_none(event.get("tid"))
        correlation = args.get("correlation")
        if type(correlation) is not int or not _ID_LOW <= correlation < _ID_HIGH:
            correlation = _int_or_none(correlation)
        self.k_name.append(name_index)
        self.k_kind.append(kind)
        self.k_start.append(start)
        self.k_dur.append(duration)
        self.k_lane.append(lane_index)
        self.k_stream.append(stream if stream is not None else -1)
        self.k_corr.append(correlation if correlation is not None else -1)

    def _host(self, event: dict[str, Any], category: str, start: float, duration: float, name: str,
              args: dict[str, Any]) -> None:
        """A launch, a wait for the GPU, or a user annotation."""
        thread_key = (str(event.get("pid", "")), str(event.get("tid", "")))
        if category not in _LAUNCH_CATS:  # user annotation
            self.annotations.append(Annotation(name, self.intern(self.threads, thread_key), start,
                                               start + max(duration, 0.0)))
            return
        if not any(word in name for word in _LAUNCH_WORDS):
            if any(word in name for word in _WAIT_WORDS):
                self.w_thread.append(self.intern(self.threads, thread_key))
                self.w_start.append(start)
                self.w_end.append(start + max(duration, 0.0))
            return
        correlation = _int_or_none(args.get("correlation"))
        if correlation is None:
            return
        self.l_name.append(self.intern(self.names, name))
        self.l_thread.append(self.intern(self.threads, thread_key))
        self.l_start.append(start)
        self.l_corr.append(correlation)

    def _checked_kernels(self) -> tuple[list[array], int]:
        """The kernel columns without exact repeats (counted), and how many kernels overlap on a stream."""
        columns = [self.k_name, self.k_kind, self.k_start, self.k_dur, self.k_lane, self.k_stream, self.k_corr]
        early, late, stray = off_launch(self.k_corr, self.k_start, self.l_corr, self.l_start)
        if early or late or stray:
            for reason, rows in ((BEFORE_LAUNCH, early), (AFTER_LAUNCH, late), (OUTSIDE_LAUNCHES, stray)):
                if rows:
                    self.checks.dropped[reason] += len(rows)
            columns = without_rows(columns, sorted(early + late + stray))
        k_name, _kind, k_start, k_dur, k_lane, k_stream, _corr = columns
        repeats, overlaps = repeats_and_overlaps(KernelColumns(k_lane, k_stream, k_start, k_dur, k_name))
        if repeats:
            self.checks.dropped[DUPLICATE] += len(repeats)
        return without_rows(columns, repeats), overlaps

    def raw_trace(self, path: Path, reader: ChromeTraceReader) -> RawTrace:
        (k_name, k_kind, k_start, k_dur, k_lane, k_stream, k_corr), overlaps = self._checked_kernels()
        return RawTrace(
            path=path, top_level=reader.top_level, names=tuple(self.names), lanes=_lane_labels(self.lanes),
            threads=tuple(self.threads), kernel_name=k_name, kernel_kind=k_kind, kernel_start_us=k_start,
            kernel_dur_us=k_dur, kernel_lane=k_lane, kernel_stream=k_stream, kernel_correlation=k_corr,
            launch_name=self.l_name, launch_thread=self.l_thread, launch_start_us=self.l_start,
            launch_correlation=self.l_corr, annotations=tuple(self.annotations), wait_thread=self.w_thread,
            wait_start_us=self.w_start, wait_end_us=self.w_end, op_name=self.o_name, op_thread=self.o_thread,
            op_start_us=self.o_start, op_end_us=self.o_end, op_shapes=self.o_shapes,
            shape_texts=tuple(self.shape_index), frame_name=self.f_name, frame_thread=self.f_thread,
            frame_start_us=self.f_start, frame_end_us=self.f_end, events_read=reader.events_read,
            chars_read=reader.chars_read, skipped_events=self.skipped, notes=self.checks.notes(overlaps))
