"""Design-space sweeps, target search and cost-speed Pareto frontiers.

Python API::

    from infersim.sweep import load_base, parse_grid, SweepSpec, Search, Targets, run_sweep
    base = load_base("qwen3-30b.yaml")                     # load and validate once
    spec = SweepSpec(base, tuple(parse_grid(["model.num_key_value_heads=2,4,8",
                                             "workload.decode_batch_per_gpu=16..256"])))
    result = run_sweep(spec)                                # or run_sweep(spec, executor=any_executor)
    best = best_per_variant(spec, result.rows, Targets(tpot_ms=50))   # one Best per variant

    search = SweepSpec(base, search=Search(gpus=(1, 2, 4, 8), batches=(1, 8, 64, 512)))
    fronts = frontiers(search, run_sweep(search).rows, Targets())    # variant -> frontier rows

`run_sweep` accepts any concurrent.futures.Executor (process or thread pools, a Dask
`client.get_executor()`); see the module docs of grid, evaluate, runner and analysis.
"""

from infersim.sweep.analysis import (
    Best,
    Targets,
    best_per_variant,
    binding_constraint,
    dominates,
    feasible,
    frontiers,
    pareto_indices,
    point_of,
)
from infersim.sweep.evaluate import Row, Search, SweepSpec
from infersim.sweep.grid import GridAxis, expand_range, expand_values, parse_grid
from infersim.sweep.cluster import dask_executor
from infersim.sweep.runner import SweepResult, run_sweep
from infersim.sweep.variants import Base, from_config, load_base

__all__ = [
    "Base", "Best", "GridAxis", "Row", "Search", "SweepResult", "SweepSpec", "Targets", "best_per_variant",
    "binding_constraint", "dask_executor", "dominates", "expand_range", "expand_values", "feasible", "from_config",
    "frontiers", "load_base", "parse_grid", "pareto_indices", "point_of", "run_sweep",
]
