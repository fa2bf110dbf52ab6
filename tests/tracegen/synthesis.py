"""A GPU trace synthesised from a real CPU trace: test data for attribution, steps and tables.

No GPU was available when this was written, so the test traces of HF transformers models are
built in two halves:

1. the CPU side is *recorded*: `benchmarks/gpu/record_traces.py` runs the model on a CPU under
   `torch.profiler` with `record_shapes=True, with_stack=True` (every `cpu_op` with its input
   shapes, every Python frame with the `nn.Module` frames, the user's `record_function` regions);
2. the GPU side is *synthesised* here, as PyTorch on an H100 would record it: each CPU operator
   that does work on the device gets a `cudaLaunchKernel` inside it and a kernel on stream 7 with
   the same `correlation`, named as the CUDA build of PyTorch names it (cuBLAS `nvjet_sm90_tst_*`,
   cuDNN `cudnn_generated_fort_native_sdpa_sm90_*`, `CatArrayBatchedCopy`, `reduce_kernel<...MeanOps`,
   CUTLASS grouped GEMM, ATen elementwise kernels). Only the CPU-only dispatch of attention is
   renamed to the CUDA one (`_scaled_dot_product_flash_attention_for_cpu` ->
   `_scaled_dot_product_cudnn_attention`). Durations come from a simple H100 cost model (below);
   the CPU side is re-timed as an eager launch loop (a few microseconds per operator and frame,
   the CPU waiting for the GPU at the end of each user region, where the recording synchronises).

`mode="compiled"` rewrites the same kernels as torch.compile (Inductor) would launch them: runs of
elementwise work between GEMMs / attention fused into Triton kernels named after the ATen ops
they fuse (`triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3` is a norm), launched with
`cuLaunchKernel` from CPU operators of the same name inside `Torch-Compiled Region: 0/0`, GEMMs as
extern `aten::mm`, no nn.Module frames. `mode="graphs"` replays each step's kernels from one
`cudaGraphLaunch` (all sharing its correlation, as CUDA-graph replays do).

The kernels and their durations (a simple H100 cost model, deliberately independent of the
simulator's) are tracegen.synthesis_kernels'. GPU side (microseconds): a kernel starts 5 after
its launch call when the GPU is idle (launch latency), 1 after the previous kernel on a busy stream
(0.4 inside a CUDA-graph replay).
CPU side (the eager launch loop): 4 per operator that launches, before its launch call, 3 per
cudaLaunchKernel, 1.5 per operator that launches nothing, 1 per Python frame, 4 per nn.Module call, 2
per annotation, the GPU waited for at the end of each user region. The recording's own CPU times are
not kept (they are a CPU running the kernels' work itself), so the host costs these traces carry are
this model's.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infersim.trace.operators import op_class
from tracegen.synthesis_kernels import (ELEMENTWISE_BANDWIDTH, ELEMENTWISE_FIXED_US, KernelSpec, elementwise_us,
                                              kernels_for)

DEVICE_NAME = "NVIDIA H100 80GB HBM3"
DEVICE_PROPERTIES = [{"id": 0, "name": DEVICE_NAME, "totalGlobalMem": 85520809984, "computeMajor": 9,
                      "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                      "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
                      "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
                      "sharedMemPerMultiprocessor": 233472}]
STREAM = 7

LAUNCH_LATENCY_US = 5.0  # kernel start after its launch call starts
KERNEL_GAP_US = 1.0  # back-to-back kernels on one stream
GRAPH_GAP_US = 0.4  # back-to-back kernels of a CUDA-graph replay

# the CPU side of an eager launch loop (microseconds)
FRAME_US = 1.0  # a Python frame
MODULE_FRAME_US = 4.0  # an nn.Module call (hooks, __call__)
OP_US = 1.5  # an ATen operator that launches nothing
LAUNCH_OP_US = 4.0  # an operator that launches, before the launch call
LAUNCH_CALL_US = 3.0  # cudaLaunchKernel
ANNOTATION_US = 2.0

_RENAMED_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_cudnn_attention"}
# leaf operators that launch nothing on a GPU either
_NO_KERNEL = frozenset({"aten::resize_", "aten::lift_fresh", "aten::detach_", "aten::alias", "aten::clone",
                        "aten::contiguous", "aten::zeros", "aten::ones", "aten::full", "aten::to",
                        "aten::_to_copy", "aten::empty", "aten::empty_like", "aten::empty_strided",
                        "aten::scalar_tensor", "aten::zeros_like", "aten::ones_like", "aten::new_zeros"})
# operators that make the CPU wait for the GPU (a device-to-host copy of a count or a value)
_SYNCING = frozenset({"aten::nonzero", "aten::_local_scalar_dense", "aten::item", "aten::masked_select",
                      "aten::unique", "aten::_unique2", "aten::bincount", "aten::repeat_interleave"})

# ---------------------------------------------------------------------------------------------
# Re-timing the CPU side and placing the GPU side


@dataclass
class _Node:
    event: dict[str, Any]
    children: list[_Node] = field(default_factory=list)

    @property
    def cat(self) -> str:
        return self.event.get("cat", "")

    @property
    def end(self) -> float:
        return float(self.event["ts"]) + float(self.event.get("dur", 0.0))


def _tree(events: list[dict[str, Any]]) -> list[_Node]:
    events = sorted(events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
    roots: list[_Node] = []
    stack: list[_Node] = []
    for event in events:
        node = _Node(event)
        start = float(event["ts"])
        while stack and stack[-1].end < start:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


# operators the CUDA build runs as one kernel (or a fixed few) of its own: the CPU build's
# internals below them (mean = sum + div_, mm's resolve_conj, ...) do not exist on a GPU and are dropped
_ATOMIC = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "mean", "sum", "argmax", "max", "amax", "_softmax",
                     "softmax", "_log_softmax", "topk", "sort", "argsort", "cat", "index_select", "_grouped_mm",
                     "_scaled_dot_product_cudnn_attention", "pow", "rsqrt", "silu", "mul", "add", "sub", "neg", "cos",
                     "sin", "div", "div_", "copy_", "fill_", "zero_", "histc", "cumsum", "index_add_", "index_copy_",
                     "index_put_", "nonzero", "random_", "arange", "gather", "scatter", "mul_", "add_", "where"})


def _does_work(name: str) -> bool:
    return op_class(name) is not None and name not in _NO_KERNEL


def _has_work_below(node: _Node) -> bool:
    return any((c.cat == "cpu_op" and _does_work(c.event["name"])) or _has_work_below(c) for c in node.children)


def _launching(node: _Node) -> bool:
    """Whether this CPU operator launches its own kernels on a GPU (renaming it first); the CPU
    internals of an operator the GPU runs as one kernel are removed from the tree."""
    name = node.event["name"] = _RENAMED_OPS.get(node.event["name"], node.event["name"])
    if not _does_work(name):
        return False
    if name.split("::", 1)[-1] in _ATOMIC:
        node.children = [c for c in node.children if c.cat != "cpu_op"]
        return True
    return not _has_work_below(node)


class _Emitter:
    """Walks the CPU tree in program order: new CPU times, launches, and the GPU stream."""

    def __init__(self, pid: Any, tid: Any, first_correlation: int = 100_000) -> None:
        self.pid, self.tid = pid, tid
        self.out: list[dict[str, Any]] = []
        self.gpu_free = 0.0
        self.correlation = first_correlation
        self.kernels = 0

    def _runtime(self, name: str, ts: float, dur: float, corr: int, external: Any, cat: str = "cuda_runtime") -> None:
        args: dict[str, Any] = {"cbid": 211 if name == "cudaLaunchKernel" else 307, "correlation": corr}
        if external is not None:
            args["External id"] = external
        self.out.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": round(ts, 3),
                         "dur": round(dur, 3), "args": args})
        self.out.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": round(ts, 3), "cat": "ac2g",
                         "name": "ac2g"})

    def gpu_event(self, spec: KernelSpec, start: float, corr: int, external: Any) -> float:
        args: dict[str, Any] = {"queued": 0, "device": 0, "context": 1, "stream": STREAM, "correlation": corr}
        if external is not None:
            args["External id"] = external
        if spec.category == "kernel":
            args.update({"registers per thread": 128, "shared memory": 0, "grid": [132, 1, 1], "block": [384, 1, 1]})
        self.out.append({"ph": "X", "cat": spec.category, "name": spec.name, "pid": 0, "tid": STREAM,
                         "ts": round(start, 3), "dur": round(spec.dur_us, 3), "args": args})
        self.out.append({"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": round(start, 3), "cat": "ac2g",
                         "name": "ac2g", "bp": "e"})
        self.kernels += 1
        return start + spec.dur_us

    def launch(self, spec: KernelSpec, at: float, external: Any) -> float:
        """A launch call at CPU time `at`; returns the CPU time after it."""
        self.correlation += 1
        api = "cudaMemcpyAsync" if spec.category == "gpu_memcpy" else spec.api
        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        self._runtime(api, at, LAUNCH_CALL_US, self.correlation, external, cat)
        start = max(at + LAUNCH_LATENCY_US, self.gpu_free + KERNEL_GAP_US)
        self.gpu_free = self.gpu_event(spec, start, self.correlation, external)
        return at + LAUNCH_CALL_US

    def synchronize(self, at: float, name: str = "cudaDeviceSynchronize") -> float:
        """The CPU waits for the GPU: returns the CPU time it goes on at."""
        self.correlation += 1
        end = max(at + 1.0, self.gpu_free + 2.0)
        self._runtime(name, at, end - at, self.correlation, None)
        return end


def _eager_walk(node: _Node, cursor: float, emitter: _Emitter) -> float:
    event = node.event
    cat = node.cat
    start = cursor
    if cat == "cpu_op":
        name = event["name"]
        args = event.get("args") or {}
        specs = kernels_for(event["name"], args) if _launching(node) else []
        name = event["name"]
        if specs:
            cursor += LAUNCH_OP_US
            for spec in specs:
                cursor = emitter.launch(spec, cursor, args.get("External id")) + 0.5
            if name in _SYNCING:
                cursor = emitter.synchronize(cursor, "cudaStreamSynchronize")
        else:
            cursor += OP_US / 2
    elif cat == "python_function":
        cursor += (MODULE_FRAME_US if event["name"].startswith("nn.Module: ") else FRAME_US) / 2
    else:
        cursor += ANNOTATION_US / 2
    for child in node.children:
        cursor = _eager_walk(child, cursor + 0.2, emitter)
    if cat == "cpu_op":
        cursor += OP_US / 2
    elif cat == "python_function":
        cursor += (MODULE_FRAME_US if event["name"].startswith("nn.Module: ") else FRAME_US) / 2
    else:  # the recording synchronises at the end of each region
        cursor = emitter.synchronize(cursor)
        cursor += ANNOTATION_US / 2
    event["ts"] = round(start, 3)
    event["dur"] = round(cursor - start, 3)
    return cursor


# ---------------------------------------------------------------------------------------------
# torch.compile: Inductor's fused Triton kernels and extern GEMMs


_REDUCTION_OPS = frozenset({"mean", "sum", "amax", "max", "argmax", "_softmax", "softmax", "var", "var_mean",
                            "topk"})
# what Inductor leaves to ATen (extern kernels and fallbacks): GEMMs, attention, and ops it does not lower
_EXTERN = ("mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_cudnn_attention", "topk", "sort", "argsort",
           "histc", "nonzero")


@dataclass
class _Fused:
    ops: list[str]
    moved: float
    reduction: bool


def _compiled_items(root: _Node) -> list[tuple[str, Any]]:
    """The launches of one forward as Inductor runs them: ("extern", (op name, args, specs)) and
    ("triton", _Fused) items in program order. Elementwise runs between extern kernels fuse; a
    reduction ends a fused kernel (Inductor fuses a reduction with the pointwise work after it in
    the same kernel as a norm's mul)."""
    items: list[tuple[str, Any]] = []
    current: _Fused | None = None

    def visit(node: _Node) -> None:
        nonlocal current
        if node.cat == "cpu_op":
            if _launching(node):
                name = node.event["name"]
                base = name.split("::", 1)[-1]
                args = node.event.get("args") or {}
                specs = kernels_for(name, args)
                if not specs:
                    return
                if base in _EXTERN:
                    current = None
                    items.append(("extern", (name, args, specs)))
                    return
                moved = max(s.dur_us - ELEMENTWISE_FIXED_US for s in specs) * ELEMENTWISE_BANDWIDTH / 1e6
                if current is None or (current.reduction and base in _REDUCTION_OPS):
                    current = _Fused([], 0.0, False)
                    items.append(("triton", current))
                if base not in current.ops:
                    current.ops.append(base)
                current.moved = max(current.moved, moved)
                current.reduction = current.reduction or base in _REDUCTION_OPS
                return
        for child in node.children:
            visit(child)

    visit(root)
    return items


def _triton_name(fused: _Fused, index: int) -> str:
    kind = "red" if fused.reduction else "poi"
    ops = "_".join(sorted({("_to_copy" if o == "copy_" else o.rstrip("_")) for o in fused.ops}))
    return f"triton_{kind}_fused_{ops}_{index}"


def _compiled_forward(forward: _Node, emitter: _Emitter, cursor: float, graphs: bool, ext_ids: list[int]) -> float:
    """Replace one model forward's CPU tree by a compiled region and launch its kernels."""
    items = _compiled_items(forward)
    pid, tid = emitter.pid, emitter.tid
    region = {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": pid, "tid": tid,
              "args": {"External id": ext_ids[0], "Record function id": 0}}
    ext_ids[0] += 1
    emitter.out.append(region)
    start = cursor
    cursor += 20.0  # guards, the wrapper's argument checks
    specs: list[tuple[KernelSpec, Any]] = []
    triton_index = 0
    for kind, item in items:
        if kind == "extern":
            name, args, kernel_specs = item
            specs += [(s, (name, args)) for s in kernel_specs]
        else:
            kname = _triton_name(item, triton_index)
            triton_index += 1
            specs.append((KernelSpec(kname, elementwise_us(item.moved * 1.3), api="cuLaunchKernel"), (kname, None)))
    if graphs:
        emitter.correlation += 1
        corr = emitter.correlation
        emitter._runtime("cudaGraphLaunch", cursor, 12.0, corr, None)
        gpu = max(cursor + LAUNCH_LATENCY_US, emitter.gpu_free + KERNEL_GAP_US)
        for spec, _ in specs:
            gpu = emitter.gpu_event(spec, gpu, corr, None) + GRAPH_GAP_US
        emitter.gpu_free = gpu - GRAPH_GAP_US
        cursor += 14.0
    else:
        for spec, (name, args) in specs:
            ext = ext_ids[0]
            ext_ids[0] += 1
            op = {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": round(cursor, 3),
                  "args": {"External id": ext, "Record function id": 0}}
            if args is not None:
                op["args"].update({k: v for k, v in args.items() if k in ("Input Dims", "Input type", "Concrete Inputs",
                                                                         "Input Strides")})
            else:
                op["args"].update({"kernel_backend": "triton", "stream": 0})
            cursor += 2.0
            cursor = emitter.launch(spec, cursor, ext) + 0.5
            op["dur"] = round(cursor - float(op["ts"]), 3)
            emitter.out.append(op)
            cursor += 1.0
    cursor += 5.0
    region["ts"] = round(start, 3)
    region["dur"] = round(cursor - start, 3)
    return cursor


def _compiled_walk(node: _Node, cursor: float, emitter: _Emitter, graphs: bool, ext_ids: list[int]) -> float:
    """Re-time the tree; each outermost model forward becomes a compiled region."""
    event = node.event
    if node.cat == "python_function" and event["name"].startswith("nn.Module: "):
        return _compiled_forward(node, emitter, cursor, graphs, ext_ids)
    if node.cat == "cpu_op":  # outside the model (sampling, inputs): eager as recorded
        cursor = _eager_walk(node, cursor, emitter)
        _collect(node, emitter.out)
        return cursor
    start = cursor
    own = ANNOTATION_US if node.cat == "user_annotation" else FRAME_US if node.cat == "python_function" else OP_US
    cursor += own / 2
    for child in node.children:
        cursor = _compiled_walk(child, cursor + 0.2, emitter, graphs, ext_ids)
    if node.cat == "user_annotation":
        cursor = emitter.synchronize(cursor)
    cursor += own / 2
    event["ts"] = round(start, 3)
    event["dur"] = round(cursor - start, 3)
    emitter.out.append(event)
    return cursor


def _collect(node: _Node, out: list[dict[str, Any]]) -> None:
    out.append(node.event)
    for child in node.children:
        _collect(child, out)


# ---------------------------------------------------------------------------------------------
# Public entry points


def synthesise(cpu_events: Iterable[dict[str, Any]], mode: str = "eager", keep_python_frames: bool = True
               ) -> list[dict[str, Any]]:
    """The events of a GPU trace built on the recorded CPU events (see the module docstring).

    mode: eager, compiled (Inductor: Triton + extern GEMMs) or graphs (compiled, replayed from
    one CUDA graph per step). keep_python_frames=False drops every python_function event, as a
    profile without with_stack would have none."""
    if mode not in ("eager", "compiled", "graphs"):
        raise ValueError(f"mode {mode!r}: expected eager, compiled or graphs")
    events = [copy.deepcopy(e) for e in cpu_events]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function",
                                                                          "user_annotation")]
    if not timed:
        raise ValueError("no CPU events to build on")
    main_thread = max({(e["pid"], e["tid"]) for e in timed},
                      key=lambda key: sum(1 for e in timed if (e["pid"], e["tid"]) == key))
    timed = [e for e in timed if (e["pid"], e["tid"]) == main_thread]
    roots = _tree(timed)
    emitter = _Emitter(*main_thread)
    cursor = float(min(e["ts"] for e in timed))
    emitter.gpu_free = cursor
    out: list[dict[str, Any]]
    if mode == "eager":
        for root in roots:
            cursor = _eager_walk(root, cursor + 1.0, emitter)
        out = []
        for root in roots:
            _collect(root, out)
        out += emitter.out
    else:
        ext_ids = [10_000_000]
        for root in roots:
            cursor = _compiled_walk(root, cursor + 1.0, emitter, mode == "graphs", ext_ids)
        out = emitter.out
    if not keep_python_frames:
        out = [e for e in out if e.get("cat") != "python_function"]
    gpu_meta = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "python"}},
                {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "ts": 0, "args": {"labels": "GPU 0"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": STREAM, "ts": 0,
                 "args": {"name": f"stream {STREAM} "}}]
    return meta + gpu_meta + sorted(out, key=lambda e: float(e.get("ts", 0.0)))


def kineto_text(event: dict[str, Any]) -> str:
    """One event in the layout the profiler writes (braces alone on their lines, args one level deeper),
    so that a written trace is read the way a recorded one is."""
    if event.get("ph") != "X":
        return "  {\n    " + json.dumps(event)[1:-1] + "\n  }"
    head = ", ".join(f"{json.dumps(k)}: {json.dumps(event[k])}" for k in ("ph", "cat", "name", "pid", "tid")
                     if k in event)
    times = ", ".join(f"{json.dumps(k)}: {json.dumps(event[k])}" for k in ("ts", "dur") if k in event)
    rest = {k: v for k, v in event.items() if k not in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
    lines = [f"    {head},", f"    {times}" + ("," if "args" in event or rest else "")]
    if rest:
        lines.append("    " + json.dumps(rest)[1:-1] + ("," if "args" in event else ""))
    if "args" in event:
        body = json.dumps(event["args"])[1:-1]
        lines += ["    \"args\": {", f"      {body}", "    }"]
    return "  {\n" + "\n".join(lines) + "\n  }"


def write_trace_document(out: str | Path, top: dict[str, Any], events: Iterable[dict[str, Any]]) -> Path:
    """Write a trace (gzipped when the name ends in .gz) in the profiler's layout."""
    out = Path(out)
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wt", encoding="utf-8") as handle:  # type: ignore[operator]
        handle.write("{\n")
        for key, value in top.items():
            handle.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        handle.write('  "traceEvents": [\n')
        handle.write(",\n".join(kineto_text(e) for e in events))
        handle.write("\n  ]\n}\n")
    return out


def read_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        return json.load(handle)


def write_synthesised(cpu_trace: str | Path, out: str | Path, mode: str = "eager", keep_python_frames: bool = True,
                      note: str = "") -> Path:
    """Read a recorded CPU trace, synthesise its GPU side, write it (gzipped when `out` ends in .gz)."""
    doc = read_trace(cpu_trace)
    events = synthesise(doc["traceEvents"], mode, keep_python_frames)
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    top["deviceProperties"] = DEVICE_PROPERTIES
    top["with_stack"] = 1 if keep_python_frames else 0
    top["synthesised"] = note or (f"GPU side synthesised by tests/tracegen/synthesis.py (mode {mode}) from the CPU trace "
                                  f"{Path(cpu_trace).name}, recorded with torch {doc.get('torch_version', '?')} on a CPU")
    return write_trace_document(out, top, events)
