"""How `mfu bench` times a launch: CUDA events on a GPU (L2 flushed before memory-bound kernels),
the wall clock for `--device cpu` smoke runs (which prove the harness and measure no GPU).
"""

from __future__ import annotations

import statistics
import time
from typing import Any
from collections.abc import Callable

from infersim.tabletools.bench.cases import BenchCase, ElementwiseCase, TimedCase, is_memory_bound



class CudaEventTimer:
    """Warm-up launches (at least `warmup` and `min_warmup_seconds`), then `repeats` runs each between
    two CUDA events, the median kept. Long kernels get fewer repeats (at least 3, about `max_timed_seconds`
    of timed work). Before each timed run of a memory-bound GEMM, grouped GEMM or attention case a buffer
    twice the L2 size is written, so its weights and cache come from HBM as in a real step; elementwise
    cases keep L2 warm (in an eager chain their input is the previous kernel's output)."""

    def __init__(self, torch: Any, l2_bytes: int, warmup: int = 5, repeats: int = 20,
                 min_warmup_seconds: float = 0.01, max_timed_seconds: float = 0.25) -> None:
        self.torch = torch
        self.warmup = warmup
        self.repeats = repeats
        self.min_warmup_seconds = min_warmup_seconds
        self.max_timed_seconds = max_timed_seconds
        self._flush = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")
        self.description = (f"CUDA events around each run, median of up to {repeats} runs (at least 3, about "
                            f"{max_timed_seconds:g} s of timed work) after >= {warmup} warm-up runs and >= "
                            f"{min_warmup_seconds * 1e3:g} ms; a {2 * l2_bytes / 2**20:.0f} MiB buffer written before "
                            f"each run of memory-bound GEMM, grouped GEMM and attention kernels (intensity < 300 "
                            f"FLOP/byte) to flush L2; elementwise kernels with L2 warm")

    def measure(self, case: TimedCase, launch: Callable[[], Any]) -> float:
        torch = self.torch
        flush = is_memory_bound(case) and not isinstance(case, ElementwiseCase)
        began = time.perf_counter()
        runs = 0
        while runs < self.warmup or time.perf_counter() - began < self.min_warmup_seconds:
            launch()
            runs += 1
            if runs % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        per_run = (time.perf_counter() - began) / runs
        repeats = max(3, min(self.repeats, int(self.max_timed_seconds / max(per_run, 1e-9))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            if flush:
                self._flush.zero_()
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events) * 1e-3


class WallClockTimer:
    """For `--device cpu` smoke runs: CPU kernels run synchronously, so the wall time of each call is
    its time. Median of `repeats` after `warmup` calls."""

    def __init__(self, warmup: int = 1, repeats: int = 3) -> None:
        self.warmup = warmup
        self.repeats = repeats
        self.description = f"wall clock around each call on the CPU, median of {repeats} after {warmup} warm-up calls"

    def measure(self, case: BenchCase, launch: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            launch()
        samples = []
        for _ in range(self.repeats):
            began = time.perf_counter()
            launch()
            samples.append(time.perf_counter() - began)
        return statistics.median(samples)
