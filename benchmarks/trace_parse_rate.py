"""Parse rate and memory of trace comparison on a large trace.

    python benchmarks/trace_parse_rate.py                   # ~200 MB uncompressed, HF eager pattern
    python benchmarks/trace_parse_rate.py --mb 1000         # the 1 GB case (target: under 60 s, under 500 MB)
    python benchmarks/trace_parse_rate.py --pattern sglang  # kernel-dense SGLang steps and CUDA-graph replays
    python benchmarks/trace_parse_rate.py --gzip            # gzipped, as the profiler writes it

The default pattern tiles the HF transformers eager trace of tests/data/traces (Llama-2-7B cut to
two layers, with_stack=True, record_shapes=True: python frames and nn.Module frames around every
CPU operator, a `prefill` and four `decode` user regions, a launch per operator) until the file is
as large as asked, shifting times, correlation and External ids. That is the CPU-heavy mix of a real
eager profile (most events are python_function and cpu_op), and it exercises every part of the
CPU-context sweep: user regions, operators, module frames. `--pattern sglang` writes the old
kernel-dense trace (SGLang step annotations, CUDA-graph decode replays, CPU noise).

Writes the trace into a temporary directory (deleted afterwards), then times three passes:
streaming every event (reader only), collecting kernels / launches / operators / annotations, and
the full measured breakdown. Prints MB/s of uncompressed text and the peak resident memory after
each pass (ru_maxrss: the process peak so far, so each line bounds everything before it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the synthetic-trace generator

from infersim.trace import ChromeTraceReader, load_trace, measure_trace  # noqa: E402
from tracegen.synthesis import kineto_text  # noqa: E402
from tracegen.synthetic import (KernelSpec, MEMCPY_HTOD, SAMPLING, TraceBuilder, dense_step,  # noqa: E402
                                metadata_events)

MB = 1e6
HF_TILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / \
    "llama-2-7b-2l-eager-h100-synthesised-p1x128-d2.json.gz"


def peak_rss_mb() -> float:
    # Linux reports kilobytes, macOS bytes
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / MB


def generate_hf(path: Path, target_bytes: float, compress: bool, tile: Path = HF_TILE) -> tuple[float, int, int]:
    """The HF eager tile repeated until the file holds target_bytes. Returns (bytes, events, kernels)."""
    with gzip.open(tile, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    events = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    times = [float(e["ts"]) for e in events if "ts" in e]
    span = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in events if "ts" in e) - min(times) + 1000.0
    top_corr = max([e.get("args", {}).get("correlation", 0) for e in events] + [e.get("id", 0) for e in events
                                                                                if isinstance(e.get("id"), int)])
    top_ext = max(e.get("args", {}).get("External id", 0) for e in events)
    # pre-serialise each event once with placeholders for the fields that shift per copy
    templates = []
    for e in events:
        args = e.get("args", {})
        templates.append((dict(e), "correlation" in args, "External id" in args, isinstance(e.get("id"), int)))
    opener = gzip.open if compress else open
    written = 0.0
    count = kernels = 0
    with opener(path, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": ' + json.dumps(doc.get("deviceProperties", []))
                + ',\n  "record_shapes": 1,\n  "with_stack": 1,\n  "traceEvents": [\n')
        out.write(head)
        written += len(head)
        text = ",\n".join(kineto_text(e) for e in meta)
        out.write(text)
        written += len(text)
        copy = 0
        while written < target_bytes:
            dt, dc, de = copy * span, copy * (top_corr + 1), copy * (top_ext + 1)
            parts = []
            for event, has_corr, has_ext, has_id in templates:
                e = dict(event)
                e["ts"] = round(float(e["ts"]) + dt, 3)
                if has_corr or has_ext:
                    args = dict(e["args"])
                    if has_corr:
                        args["correlation"] += dc
                    if has_ext:
                        args["External id"] += de
                    e["args"] = args
                if has_id:
                    e["id"] += dc
                parts.append(kineto_text(e))
            text = ",\n" + ",\n".join(parts)
            out.write(text)
            written += len(text)
            count += len(parts)
            kernels += sum(1 for e, *_ in templates if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
            copy += 1
        tail = '\n  ],\n  "traceName": "tiled"\n}\n'
        out.write(tail)
        written += len(tail)
    return written, count, kernels


def generate_sglang(path: Path, target_bytes: float, compress: bool, layers: int) -> tuple[float, int, int]:
    """Prefill + decode steps with CPU noise (python frames, aten ops) like a with_stack SGLang trace.
    Returns (uncompressed bytes, events, kernels)."""
    builder = TraceBuilder(cpu_noise=3)
    opener = gzip.open if compress else open
    written = 0.0
    events = kernels = 0
    with opener(path, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        head = '{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},\n  "traceEvents": [\n'
        out.write(head)
        written += len(head)
        first = True
        for event in metadata_events():
            text = ("  " if first else ",\n  ") + json.dumps(event)
            out.write(text)
            written += len(text)
            first = False
        step = 0
        while written < target_bytes:
            if step % 16 == 0:
                start = builder.cpu_us
                builder.eager(dense_step(layers))
                builder.annotation("step[EXTEND bs=4 toks=8192]", start, builder.cpu_us + 1)
            else:
                builder.graph_replay(dense_step(layers, 0.2))
                builder.eager([KernelSpec(SAMPLING, 5.0, join=True), KernelSpec(MEMCPY_HTOD, 2.0)])
            builder.idle(200.0)
            step += 1
            for event in builder.drain():
                text = ",\n  " + json.dumps(event)
                out.write(text)
                written += len(text)
                events += 1
                kernels += event.get("cat") in ("kernel", "gpu_memcpy")
        tail = '\n  ],\n  "traceName": "synthetic"\n}\n'
        out.write(tail)
        written += len(tail)
    return written, events, kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="uncompressed trace size in MB (default 200)")
    parser.add_argument("--gzip", action="store_true", help="write and read the trace gzipped")
    parser.add_argument("--pattern", choices=("hf", "sglang"), default="hf", help="trace pattern (default hf)")
    parser.add_argument("--layers", type=int, default=32, help="sglang pattern: layers per forward pass (default 32)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the full breakdown to FILE")
    parser.add_argument("--keep", metavar="PATH", type=Path,
                        help="write the trace to PATH and keep it; an existing PATH is measured as it is")
    parser.add_argument("--only-breakdown", action="store_true", help="time the full breakdown only")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as directory:
        path = args.keep or Path(directory) / ("bench-TP-0.trace.json" + (".gz" if args.gzip else ""))
        if args.keep is not None and args.keep.exists():
            size = float(args.keep.stat().st_size) if not args.keep.name.endswith(".gz") else args.mb * MB
            print(f"measuring {path} ({size / MB:.0f} MB)", flush=True)
        else:
            t0 = time.perf_counter()
            if args.pattern == "hf":
                size, events, kernels = generate_hf(path, args.mb * MB, args.gzip)
            else:
                size, events, kernels = generate_sglang(path, args.mb * MB, args.gzip, args.layers)
            print(f"generated {size / MB:.0f} MB uncompressed ({path.stat().st_size / MB:.0f} MB on disk), {events} "
                  f"events, {kernels} GPU activities in {time.perf_counter() - t0:.1f} s ({args.pattern} pattern); "
                  f"peak RSS so far {peak_rss_mb():.0f} MB", flush=True)

        def timed(label: str, work, describe) -> object:  # type: ignore[no-untyped-def]
            wall, cpu = time.perf_counter(), time.process_time()
            result = work()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"{label:<19} {describe(result)} in {wall:.1f} s wall ({cpu:.1f} s CPU) = {size / MB / wall:.1f} MB/s; "
                  f"peak RSS {peak_rss_mb():.0f} MB", flush=True)
            return result

        if not args.only_breakdown:
            timed("stream events:", lambda: sum(1 for _ in ChromeTraceReader(path)), lambda n: f"{n} events")
            timed("collect events:", lambda: load_trace(path),
                  lambda raw: f"{raw.kernel_count} GPU activities, {len(raw.launch_name)} launches, "
                              f"{len(raw.op_name)} operators, {len(raw.frame_name)} module frames, "
                              f"{len(raw.annotations)} annotations")
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            lanes = timed("full breakdown:", lambda: profiler.runcall(measure_trace, str(path)), lambda _: "")
            profiler.dump_stats(args.profile)
        else:
            lanes = timed("full breakdown:", lambda: measure_trace(str(path)),
                          lambda lanes: f"{ {s.stage: len(s.steps) for s in lanes[0].stages} } steps, "
                                        f"{lanes[0].kernels} kernels")
        del lanes
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
