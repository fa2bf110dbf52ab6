"""Parse rate and memory of trace comparison on a large synthetic SGLang trace.

    python benchmarks/trace_parse_rate.py            # ~200 MB uncompressed
    python benchmarks/trace_parse_rate.py --mb 1000  # the 1 GB case
    python benchmarks/trace_parse_rate.py --gzip     # gzipped, as SGLang writes it

Writes the trace into a temporary directory (deleted afterwards), then times three passes:
streaming every event (reader only), collecting kernels / launches / annotations, and the full
measured breakdown. Prints MB/s of uncompressed text and the peak resident memory after each
pass (ru_maxrss: the process peak so far, so each line bounds everything before it).
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

from infersim.trace import ChromeTraceReader, load_trace, measure_trace  # noqa: E402
from infersim.trace.synthetic import (KernelSpec, MEMCPY_HTOD, SAMPLING, TraceBuilder, dense_step,  # noqa: E402
                                      metadata_events)

MB = 1e6


def peak_rss_mb() -> float:
    # Linux reports kilobytes, macOS bytes
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / MB


def generate(path: Path, target_bytes: float, compress: bool, layers: int) -> tuple[float, int, int]:
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
    parser.add_argument("--layers", type=int, default=32, help="layers per forward pass (default 32)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / ("bench-TP-0.trace.json" + (".gz" if args.gzip else ""))
        t0 = time.perf_counter()
        size, events, kernels = generate(path, args.mb * MB, args.gzip, args.layers)
        t1 = time.perf_counter()
        on_disk = path.stat().st_size
        print(f"generated {size / MB:.0f} MB uncompressed ({on_disk / MB:.0f} MB on disk), {events} events, "
              f"{kernels} GPU activities in {t1 - t0:.1f} s; peak RSS so far {peak_rss_mb():.0f} MB")

        t0 = time.perf_counter()
        count = sum(1 for _ in ChromeTraceReader(path))
        dt = time.perf_counter() - t0
        print(f"stream events:      {count} events in {dt:.1f} s = {size / MB / dt:.1f} MB/s; "
              f"peak RSS {peak_rss_mb():.0f} MB")

        t0 = time.perf_counter()
        raw = load_trace(path)
        dt = time.perf_counter() - t0
        print(f"collect kernels:    {raw.kernel_count} GPU activities, {len(raw.launch_name)} launches in {dt:.1f} s "
              f"= {size / MB / dt:.1f} MB/s; peak RSS {peak_rss_mb():.0f} MB")
        del raw

        t0 = time.perf_counter()
        (lane,) = measure_trace(str(path))
        dt = time.perf_counter() - t0
        steps = {s.stage: len(s.steps) for s in lane.stages}
        print(f"full breakdown:     {steps} steps, {lane.kernels} kernels in {dt:.1f} s = {size / MB / dt:.1f} MB/s; "
              f"peak RSS {peak_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
