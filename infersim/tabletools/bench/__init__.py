"""`infersim mfu bench`: time the kernels the simulator asks about on the GPU it runs on, and write
them as a table directory with provenance, row by row.

    python -m infersim mfu bench --out mfu_tables/measured/h100-sxm/torch-2.11.0/ --time-budget 540

One idea per module, imports pointing down (cases <- plan, environment <- torch_backend, timers <- writer <- runner):
  cases          what one timing is: GEMM, grouped GEMM, attention, elementwise kernel, host probe;
                 the rows and the file it becomes (the imported tables' layout)
  plan           which cases, from the model cards and the comparison grid, in passes (or family by family)
  torch_backend  launching them through PyTorch as HF transformers does; the host probes
  launches       the elementwise kernels' launches, inputs made as HF's code makes them
  budget         budgets of parts run in order of value, their deadlines, and the summary file of a run
  environment    the device, versions and clocks the provenance records
  timers         CUDA events (L2 flushed for memory-bound kernels) or the wall clock (--device cpu)
  writer         the table directory written as rows arrive (always loadable)
  runner         the loop: budget (and per-family budgets), skips, failures, SIGTERM; peak FLOP/s of the device
Tests inject a fake backend and timer; without torch or a CUDA device `TorchBackend.create` raises
NoGpuError (one line, exit 2). `--device cpu` runs the real backend on the CPU with tiny shapes.
"""

from infersim.tabletools.bench.cases import (
    HOST_PROBES,
    AttentionCase,
    BenchCase,
    ElementwiseCase,
    GemmCase,
    GroupedGemmCase,
    HostCase,
    estimated_seconds,
    is_memory_bound,
    table_file,
)
from infersim.tabletools.bench.plan import (
    BENCH_MODELS,
    FAMILIES,
    BenchOptions,
    attention_layouts,
    cases_summary,
    gemm_kn_from_card,
    load_cards,
    plan_cases,
)
from infersim.tabletools.bench.runner import BenchResult, hardware_card_for, host_costs, peaks_for, run_bench
from infersim.tabletools.bench.environment import Environment
from infersim.tabletools.bench.timers import CudaEventTimer, WallClockTimer
from infersim.tabletools.bench.torch_backend import HostResult, NoGpuError, Prepared, TorchBackend
from infersim.tabletools.bench.writer import TableWriter

__all__ = [
    "HOST_PROBES", "AttentionCase", "BenchCase", "ElementwiseCase", "GemmCase", "GroupedGemmCase", "HostCase",
    "estimated_seconds", "is_memory_bound", "table_file", "BENCH_MODELS", "FAMILIES", "BenchOptions",
    "attention_layouts", "cases_summary", "gemm_kn_from_card", "load_cards", "plan_cases", "BenchResult",
    "hardware_card_for", "host_costs", "peaks_for", "run_bench", "CudaEventTimer", "Environment", "HostResult",
    "NoGpuError", "Prepared", "TorchBackend", "WallClockTimer", "TableWriter",
]
