"""Evaluating sweep points: the decode-only fast path and the layout search.

A sweep is a list of *units* of work, numbered 0..spec.units-1, so that any worker can evaluate
any range of them from the spec alone:

* without a layout search, unit i is grid point i (the cross product of the --grid axes, the last
  axis varying fastest), simulated once with the deployment and batch it names;
* with a layout search (`Search`: --gpus, --batch), unit i is (grid point, GPU count, PP degree);
  the worker tries every attention TP, FFN TP and expert-parallel size that divides the GPUs of a
  pipeline stage (DP sizes follow), skips layouts `complete_layout` rejects (counted with their
  reasons), and simulates every searched batch that fits in memory, plus the largest that fits
  (even batches only under two-batch overlap, which splits the batch in two).

Only decode is simulated unless the spec asks for prefill (a TTFT target needs it); prefill does
not depend on the decode batch, so it is simulated once per layout: the workload's prefill step
and, where that step packs several prompts (workload.prefill_tokens_per_gpu), one prompt alone,
whose time is the row's TTFT (SimulationResult.single_request_ttft_s). The fast path calls the same
functions `simulate()` does (memory_budget, run_prefill, run_decode as decode_time), minus the work a sweep
does not need.
"""

from __future__ import annotations

import functools
import math
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple


from infersim.cards.deployment import Deployment, Workload
from infersim.cards.engine import EngineCard
from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig, with_variant
from infersim.cards.power import Electricity
from infersim.costing.memo import PricingMemo
from infersim.engine.energy import seconds_by_kind, step_joules, step_joules_by_bound
from infersim.engine.stage import StageResult
from infersim.base.errors import InferSimError, shorten
from infersim.base.records import evolve
from infersim.shapes.kernels import Bound, NoTables
from infersim.run.memory import MemoryResult, memory_budget
from infersim.run.request_limits import pool_problem, served_osl
from infersim.run.simulate import (decode_time_by_bound, prefill_step_tokens, run_prefill, simulate, single_prompt_prefill,
                                   single_request_ttft)
from infersim.run.speculative import drafter_memory
from infersim.launch.build import layout_check
from infersim.launch.common import LaunchRefusal
from infersim.sweep.grid import GridAxis, grid_point, grid_points, grid_size
from infersim.sweep.variants import Base, Deriver, problem_text, with_layout

NAN = float("nan")

#: what a step's dominant bound means as a constraint on throughput
BOUND_NAMES = {
    Bound.COMPUTE: "compute",
    Bound.MEMORY: "memory bandwidth",
    Bound.COMM: "communication",
    Bound.OVERHEAD: "overhead",
    Bound.HOST_LINK: "host link",
}


class Row(NamedTuple):
    """One simulated (or rejected) configuration. Times in seconds, sizes in bytes."""

    point: int  # index of the grid point (see grid_point)
    num_gpus: int
    num_nodes: int
    pp: int
    attn_tp: int
    attn_dp: int
    ffn_tp: int
    ffn_ep: int
    ffn_dp: int
    batch: int  # decode requests per GPU
    tpot_s: float
    tgs: float  # decode tokens per GPU per second
    ttft_s: float  # single-request TTFT (one prompt alone + the API server); NaN unless prefill was simulated
    prefill_tgs: float  # prompt tokens per GPU per second of the workload's prefill step
    bound: str  # what dominates the decode step: compute, memory bandwidth, communication, overhead
    fits: bool  # the batch's KV cache fits beside the weights
    max_batch: int  # the largest decode batch per GPU that fits (whose KV cache fits)
    kv_capacity_bytes: float
    weights_bytes: float
    price: float  # USD per GPU-hour used for cost (0 = unknown)
    status: str = ""  # "" when simulated; otherwise why the configuration was rejected
    # the decode step's energy per output token over all GPUs, J, and mean draw per GPU, W (NaN: the
    # hardware card has no power facts; infersim.engine.energy), and that energy's price per
    # million output tokens at the run's electricity price and PUE
    joules_per_token: float = NAN
    watts_per_gpu: float = NAN
    energy_usd_per_mtok: float = NAN
    # the workload's prefill step: all the prompts it packs (workload.prefill_tokens_per_gpu) together;
    # NaN unless prefill was simulated
    prefill_step_s: float = NAN
    # the engine's default running-request cap per GPU (0 = none): a batch above it fits where the
    # KV cache holds it, and a server runs it with a larger cap (--emit-launch sets one)
    running_cap: int = 0
    # output tokens per request the row was timed with: the workload's OSL, or what the engine's server
    # cuts a longer request to (_refuse_beyond_context; the sweep's note counts such points); 0: rejected
    osl: int = 0

    @property
    def above_running_cap(self) -> bool:
        """A simulated batch above the engine's default running-request cap."""
        return self.ok and 0 < self.running_cap < self.batch

    @property
    def ok(self) -> bool:
        return not self.status

    @property
    def user_tps(self) -> float:
        """Output tokens per second one request sees (1 / TPOT)."""
        return 1.0 / self.tpot_s if self.tpot_s > 0 else NAN

    @property
    def cost_per_mtok(self) -> float:
        """The GPU-hours alone, USD per million output tokens: price * GPUs / (3600 * total tokens/s) * 1e6."""
        if not self.price or not self.tgs or math.isnan(self.tgs):
            return NAN
        return self.price * self.num_gpus / (3600.0 * self.tgs * self.num_gpus) * 1e6

    @property
    def cost_with_energy_per_mtok(self) -> float:
        """USD per million output tokens: the GPU-hours and the decode step's energy."""
        return self.cost_per_mtok + self.energy_usd_per_mtok

    @property
    def cost_includes_energy(self) -> bool:
        """Whether total_cost_per_mtok counts the energy (the hardware card has power facts)."""
        return not math.isnan(self.energy_usd_per_mtok)

    @property
    def total_cost_per_mtok(self) -> float:
        """What a user pays per million output tokens of the decode step (the tables' $/Mtok and the
        Pareto cost): the GPU-hours plus the energy at the run's electricity price and PUE, or the
        GPU-hours alone where the hardware card has no power facts (cost_includes_energy)."""
        return self.cost_with_energy_per_mtok if self.cost_includes_energy else self.cost_per_mtok


NO_ENERGY = (NAN, NAN, NAN)


def _energy(joules: float, step_s: float, tokens_per_gpu: float,
            electricity: Electricity) -> tuple[float, float, float]:
    """(J per output token, W per GPU, energy USD per million output tokens) of a decode step of
    `step_s` taking `joules` on one GPU (step_joules) and yielding `tokens_per_gpu` tokens per GPU;
    NaNs for no tokens."""
    if not tokens_per_gpu > 0:
        return NO_ENERGY
    per_token = joules / tokens_per_gpu
    return per_token, joules / step_s if step_s > 0 else 0.0, electricity.usd(per_token) * 1e6


def _rejected(point: int, problem: str, price: float = 0.0) -> Row:
    return Row(point, 0, 0, 0, 0, 0, 0, 0, 0, 0, NAN, NAN, NAN, NAN, "", False, 0, NAN, NAN, price, problem)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Search:
    """Layout search: GPU counts, decode batches per GPU, and caps on the parallel degrees tried."""

    gpus: tuple[int, ...]
    batches: tuple[int, ...]
    max_pp: int = 8
    max_tp: int = 8
    include_max_batch: bool = True  # also simulate the largest batch that fits (when within the batch range)

    def __post_init__(self) -> None:
        if not self.gpus or any(int(g) != g or g < 1 for g in self.gpus):
            raise InferSimError(f"--gpus: GPU counts must be whole numbers >= 1 (got {list(self.gpus)})")
        if not self.batches or any(int(b) != b or b < 1 for b in self.batches):
            raise InferSimError(f"--batch: decode batches must be whole numbers >= 1 (got {list(self.batches)})")
        if self.max_pp < 1 or self.max_tp < 1:
            raise InferSimError("--max-pp and --max-tp must be at least 1")

    @functools.cached_property
    def units(self) -> tuple[tuple[int, int], ...]:
        """(GPU count, PP degree) pairs; each is one unit of work per grid point (computed once: every
        unit of a search reads it)."""
        return tuple((n, pp) for n in sorted(set(self.gpus)) for pp in divisors(n) if pp <= self.max_pp)

    def configurations_per_point(self, moe: bool) -> int:
        """At most how many configurations one grid point runs: every searched layout (attention TP,
        FFN TP and, for MoE models, every EP dividing what is left) of every (GPU count, PP) unit,
        times every batch and the largest that fits."""
        batches = len(set(self.batches)) + (1 if self.include_max_batch else 0)
        total = 0
        for num_gpus, pp in self.units:
            stage = num_gpus // pp
            tps = [d for d in divisors(stage) if d <= self.max_tp]
            ffn = sum(len(divisors(stage // t)) for t in tps) if moe else len(tps)
            total += len(tps) * ffn * batches
        return total


@dataclass(frozen=True)
class SweepSpec:
    """Everything a worker needs to evaluate any range of units (picklable)."""

    base: Base
    axes: tuple[GridAxis, ...] = ()
    search: Search | None = None
    prefill: bool = False  # also simulate prefill (TTFT); a TTFT target needs it
    skip_unfit: bool = False  # drop batches that do not fit in memory instead of reporting them
    price_per_gpu_hour: float | None = None  # overrides the hardware card's usd_per_gpu_hour

    @property
    def points(self) -> int:
        return grid_size(self.axes)

    @property
    def units_per_point(self) -> int:
        return len(self.search.units) if self.search else 1

    @property
    def units(self) -> int:
        return self.points * self.units_per_point

    def values(self, point: int) -> tuple[Any, ...]:
        return grid_point(self.axes, point)

    def __post_init__(self) -> None:
        swept = [a.path for a in self.axes if a.parts[0] == "speculative"]
        if swept and self.base.config.speculative is None:
            raise InferSimError(f"--grid {swept[0]}: the base config has no speculative section to vary; add one "
                                "(method, draft_model, acceptance_rate) to the config or with --set")


#: the reason ChunkResult.by_point gives a searched layout none of whose batches fits in memory
UNFIT = "no batch fits in memory"


#: the most configurations one sweep simulates: every row is kept in memory (~1.1 KB each, measured:
#: 100,000 rows of a batch grid raised the peak resident set by 110 MB) for the best-per-variant
#: choice, the frontiers and the printed tables, so this bounds a sweep's memory to about 0.6 GB
MAX_SWEEP_CONFIGURATIONS = 500_000
#: the most GPU counts a layout search takes (each is searched over its divisors, per grid point)
MAX_SEARCH_GPU_COUNTS = 4096


def check_sweep_size(spec: SweepSpec) -> None:
    """Refuse, before anything runs, a sweep that could simulate more than MAX_SWEEP_CONFIGURATIONS
    configurations: the product of the grid axes times what the layout search runs per point."""
    points = spec.points
    search = spec.search
    if search is not None and len(set(search.gpus)) > MAX_SEARCH_GPU_COUNTS:
        raise InferSimError(f"--gpus: {len(set(search.gpus)):,} GPU counts; a layout search takes at most "
                            f"{MAX_SEARCH_GPU_COUNTS:,}")
    if points > MAX_SWEEP_CONFIGURATIONS:  # before the search's count: the grid alone is too large
        per_point = 1
    else:
        moe = spec.base.config.model.is_moe or any(a.parts[0] == "model" for a in spec.axes)
        per_point = 1 if search is None else search.configurations_per_point(moe)
    total = points * per_point
    if total <= MAX_SWEEP_CONFIGURATIONS:
        return
    axes = f"{points:,} grid point{'s' if points != 1 else ''}" + (
        f" ({' x '.join(f'{len(a.values):,} {a.path}' for a in spec.axes)})" if len(spec.axes) > 1 else "")
    search_text = f" x up to {per_point:,} layouts and batches per point (--gpus, --batch, --max-pp, --max-tp)" \
        if search is not None and per_point > 1 else ""
    raise InferSimError(f"sweep of {total:,} configurations: {axes}{search_text}; one sweep simulates at "
                        f"most {MAX_SWEEP_CONFIGURATIONS:,} (every row is kept in memory, about 1 KB each): narrow "
                        "the grid or split it over several runs")


@dataclass
class ChunkResult:
    rows: list[Row] = field(default_factory=list)
    units: int = 0  # units evaluated
    rejected: int = 0  # configurations the validator rejected
    unfit: int = 0  # searched batches skipped because their KV cache does not fit
    problems: dict[str, int] = field(default_factory=dict)  # rejection reason -> count
    # grid point -> why searched layouts of it gave no row (rejection reason, or UNFIT) -> count
    by_point: dict[int, dict[str, int]] = field(default_factory=dict)
    # why the engine cannot launch them -> searched layouts left out (the launch module's rule)
    unlaunchable: dict[str, int] = field(default_factory=dict)
    # what the engine's server does to a request longer than it runs whole -> grid points timed with the
    # output it cuts such a request to (_refuse_beyond_context)
    shortened: dict[str, int] = field(default_factory=dict)

    def leave_out(self, point: int, why: str, engine: str) -> None:
        """A searched layout the engine cannot launch: counted by why, and noted for its grid point."""
        _count(self.unlaunchable, why)
        self.note(point, f"{engine} cannot launch it: {why}")

    def reject(self, problem: str, point: int | None = None) -> None:
        self.rejected += 1
        _count(self.problems, problem)
        if point is not None:
            self.note(point, problem)

    def note(self, point: int, reason: str, count: int = 1) -> None:
        """Count why a searched layout of a grid point gave no row (at most 16 reasons per point)."""
        _count(self.by_point.setdefault(point, {}), reason, count, kinds=16)

    def merge(self, other: ChunkResult) -> None:
        self.rows.extend(other.rows)
        self.units += other.units
        self.rejected += other.rejected
        self.unfit += other.unfit
        for point, reasons in other.by_point.items():
            for reason, count in reasons.items():
                self.note(point, reason, count)
        for mine, theirs in ((self.problems, other.problems), (self.unlaunchable, other.unlaunchable),
                             (self.shortened, other.shortened)):
            for what, count in theirs.items():
                _count(mine, what, count)


def _count(table: dict[str, int], what: str, count: int = 1, kinds: int = 64) -> None:
    """Add `count` to `what` in `table`, which keeps at most `kinds` kinds (a sweep's reasons are few;
    a bug's messages could be many)."""
    if what in table or len(table) < kinds:
        table[what] = table.get(what, 0) + count


def _refuse_beyond_context(served_by: tuple[int, str], work: Workload, out: ChunkResult | None = None) -> Workload:
    """The variant's workload as the engine's server takes it (`served_by`: run.request_limits.served_osl
    of its request). One whose requests it refuses (longer than the model's context) has no row to
    time: it is rejected, as the main run does not fit. One whose output it cuts to fit is timed
    with the cut OSL, as the main run simulates it, and counted in `out` for the sweep's note (per
    grid point: the caller passes `out` once per point)."""
    served, said = served_by
    if not served:
        raise InferSimError(said)
    if served == work.osl:
        return work
    if out is not None:
        _count(out.shortened, said)
    return evolve(work, osl=served)


class Evaluator:
    """Evaluates ranges of units of one spec; keeps its caches between calls (one per process)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.deriver = Deriver(spec.base, spec.axes)
        self.tables = spec.base.config.tables
        if spec.base.config.tables_auto and any(a.path.split(".")[0] == "hardware" for a in spec.axes):
            # tables chosen for the base's device would time other or changed devices: roofline for all
            self.tables = NoTables()
        self._memory_key: tuple | None = None
        self._memory: MemoryResult | None = None
        self._pool_problem = ""  # of the last memory result: why its request does not fit the KV pool ('' if it does)
        self._memories: dict[tuple, tuple] = {}
        self._served: dict[tuple, tuple] = {}
        self._prefill_key: tuple | None = None
        self._prefill: tuple[StageResult, StageResult] | None = None
        # speculative decoding changes decode, prefill (drafter prefill) and memory (drafter):
        # such sweeps take the full simulate() path for every point
        self.speculative = spec.base.config.speculative is not None
        self.engine = spec.base.config.engine
        # the plan pieces and kernel costs every point of the sweep shares, for this evaluator's life
        self.memo = PricingMemo()
        # a layout search proposes only layouts the engine can launch: the launch module's own rule
        self.launchable = layout_check(self.engine) if spec.search is not None else None

    # -- pieces ----------------------------------------------------------------------------

    def _memory_for(self, model, hw, dep, work, run) -> MemoryResult:
        """The variant's memory result (kept); InferSimError where its request does not fit the KV pool."""
        # weight offload is sized for the decode batch, so with it the batch is part of the key
        batch = work.decode_batch_per_gpu if dep.weight_offload != "none" else None
        key = (model, hw, dep, work.isl, work.osl, work.prefill_tokens_per_gpu, run, batch)
        # tuples compare element by element, identity first: the cards are mostly the same objects
        if key != self._memory_key:
            # the last result misses whenever a deployment axis varies faster than the batch: look
            # further back, on the identities of the cards and the completed deployment (derived
            # cards and completed layouts are cached, so equal ones are mostly the same object; a
            # miss only recomputes)
            memo_key = (id(model), id(hw), id(dep), work.isl, work.osl, work.prefill_tokens_per_gpu, id(run), batch)
            entry = self._memories.get(memo_key)
            if entry is None:
                drafter = drafter_memory(with_variant(run, model, hw, dep, work)) if self.speculative else None
                mem = memory_budget(model, hw, dep, work, drafter, self.engine,
                                    prefill_step_tokens(work, self.engine, hw, dep), offload=True)
                # a request the engine's scheduler cuts or refuses for its KV pool does not fit the main run
                pooled = pool_problem(with_variant(run, model, hw, dep, work), mem) \
                    if run.engine.context_limit.kv_pool is not None and mem.max_batch_per_gpu >= 1 else []
                if len(self._memories) >= 256:
                    self._memories.clear()
                # the entry holds the cards, deployment and run, so their ids cannot be reused while it exists
                entry = self._memories[memo_key] = (model, hw, dep, run, mem, pooled[0] if pooled else "")
            self._memory, self._pool_problem = entry[4], entry[5]
            self._memory_key = key
        if self._pool_problem:
            raise InferSimError(self._pool_problem)
        return self._memory

    def _served_osl(self, model: ModelCard, engine: EngineCard, work: Workload) -> tuple[int, str]:
        """run.request_limits.served_osl of the variant's request, kept on the identities of the cards
        (derived cards are cached, so equal ones are mostly the same object) and the lengths."""
        key = (id(model), id(engine), work.isl, work.osl)
        entry = self._served.get(key)
        if entry is None:
            if len(self._served) >= 256:
                self._served.clear()
            # the entry holds the cards, so their ids cannot be reused while it exists
            entry = self._served[key] = (model, engine, served_osl(model, engine, work.isl, work.osl))
        return entry[2]

    def _prefill_for(self, model, hw, dep, work) -> tuple[StageResult, StageResult]:
        """(the workload's prefill step, one prompt's prefill alone): the same result twice unless the
        step packs several prompts (as simulate's single_prompt)."""
        key = (model, hw, dep, work.isl, work.prefill_tokens_per_gpu)
        if key != self._prefill_key:
            step = run_prefill(model, hw, dep, work, self.tables, self.engine, memo=self.memo)
            single = single_prompt_prefill(model, hw, dep, work, self.tables, self.engine, memo=self.memo)
            self._prefill = (step, single or step)
            self._prefill_key = key
        assert self._prefill is not None
        return self._prefill

    def _row(self, point, model, hw, dep, work, batch, mem, price, run) -> Row:
        # (single-request TTFT, prefill step's tokens per GPU per second, prefill step time): NaNs
        # unless the spec simulates prefill
        prefill = (NAN, NAN, NAN)
        if self.speculative or dep.weight_offload != "none":
            # weight offload: the fast path does not stream weights, and the offload is sized for this batch
            full = simulate(with_variant(run, model, hw, dep, evolve(work, decode_batch_per_gpu=batch)),
                            self.memo)
            decode = full.decode
            tpot, tgs, bound = decode.tpot_s, decode.tgs, decode.bound
            step = decode.step_time_s
            joules = step_joules(seconds_by_kind(decode), step, hw.power)[0] if hw.power is not None else 0.0
            if dep.weight_offload != "none":
                mem = full.memory
            if self.spec.prefill:
                prefill = (full.single_request_ttft_s, full.prefill.tgs, full.prefill.step_time_s)
        else:
            step, tgs, by_bound = decode_time_by_bound(model, hw, dep, work, batch, self.tables, self.engine,
                                                       memo=self.memo)
            tpot, bound = step, max(by_bound, key=by_bound.__getitem__)
            # the energy only where the card has power facts (else no energy column)
            joules = step_joules_by_bound(by_bound, step, hw.power)[0] if hw.power is not None else 0.0
            if self.spec.prefill:
                packed, single = self._prefill_for(model, hw, dep, work)
                prefill = (single_request_ttft(single, self.engine), packed.tgs, packed.step_time_s)
        energy = NO_ENERGY if hw.power is None else _energy(joules, step, tgs * step, run.electricity)
        # as the main run: a batch fits where its KV cache does (mem.fits: also host memory under weight
        # offload); the engine's default running-request cap is a launch setting, said beside the row
        fits = mem.fits and 1 <= batch <= mem.kv_fit_batch_per_gpu
        return Row(point, dep.num_gpus, dep.num_nodes, dep.pp, dep.attention.tp, dep.attention.dp, dep.ffn.tp,
                   dep.ffn.ep, dep.ffn.dp, batch, tpot, tgs, prefill[0], prefill[1],
                   BOUND_NAMES[bound], fits, mem.kv_fit_batch_per_gpu, mem.kv_capacity_bytes,
                   mem.weights_bytes, price, "", *energy, prefill[2], mem.running_cap_per_gpu, work.osl)

    def _price(self, hw) -> float:
        p = self.spec.price_per_gpu_hour
        return hw.usd_per_gpu_hour if p is None else p

    # -- units -----------------------------------------------------------------------------

    def run(self, start: int, stop: int) -> ChunkResult:
        out = ChunkResult()
        per_point = self.spec.units_per_point
        points = None if self.spec.search is not None else grid_points(self.spec.axes, start, stop)
        for unit in range(start, stop):
            point, sub = divmod(unit, per_point)
            try:
                if points is None:
                    self._search(point, sub, out)
                else:
                    self._point(point, next(points), out)
            except Exception as exc:  # noqa: BLE001 - a bug hit by this row's values: reject it, keep the sweep
                problem = f"internal error ({type(exc).__name__}: {shorten(str(exc), 120)}); please report it"
                out.reject(problem)
                out.rows.append(_rejected(point, problem))
            out.units += 1
        return out

    def _point(self, point: int, values: tuple[Any, ...], out: ChunkResult) -> None:
        try:
            # run_base is cached: the same object for every point with these values
            model, hw, dep, run, work = self.deriver.parts(values)
            work = _refuse_beyond_context(self._served_osl(model, run.engine, work), work, out)
            mem = self._memory_for(model, hw, dep, work, run)
            batch = work.decode_batch_per_gpu
            if batch == "max":
                batch = max(mem.max_batch_per_gpu, 1)
                if dep.overlap == "two-batch" and batch > 1:
                    batch -= batch % 2
            if self.spec.skip_unfit and not (mem.kv_capacity_bytes > 0 and batch <= mem.kv_fit_batch_per_gpu):
                out.unfit += 1
                return
            out.rows.append(self._row(point, model, hw, dep, work, batch, mem, self._price(hw), run))
        except InferSimError as exc:
            problem = problem_text(exc)
            out.reject(problem)
            out.rows.append(_rejected(point, problem))

    def _searched(self, point: int, out: ChunkResult, layout: Deployment, model: ModelCard, hw: HardwareCard,
                  work: Workload, run: RunConfig) -> tuple[Deployment, MemoryResult] | None:
        """A searched layout completed and its memory accounted, or None (counted): one the validator
        rejects, or one the engine cannot launch (left out by the launch module's rule)."""
        try:
            dep = self.deriver.complete(layout, model, hw)
            if self.launchable is not None:
                self.launchable(dep, model)
            return dep, self._memory_for(model, hw, dep, work, run)
        except LaunchRefusal as exc:
            out.leave_out(point, exc.why, exc.title)
        except InferSimError as exc:
            out.reject(problem_text(exc), point)
        return None

    def _search(self, point: int, sub: int, out: ChunkResult) -> None:
        search = self.spec.search
        assert search is not None
        num_gpus, pp = search.units[sub]
        values = self.spec.values(point)
        try:
            model = self.deriver.model(values)
            hw = self.deriver.hardware(values)
            base_dep = self.deriver.deployment(values)
            work = self.deriver.workload(values)
            run = self.deriver.run_base(values)
            work = _refuse_beyond_context(self._served_osl(model, run.engine, work), work, out if sub == 0 else None)
        except InferSimError as exc:  # the variant itself is invalid: report it once per point
            if sub == 0:
                problem = problem_text(exc)
                out.reject(problem)
                out.rows.append(_rejected(point, problem))
            return
        if model.num_hidden_layers % pp:  # no layout of this unit can work: one rejection, not one per layout
            out.reject(f"deployment.pp: num_hidden_layers ({model.num_hidden_layers}) is not divisible by "
                       f"deployment.pp ({pp})", point)
            return
        per_node = hw.peak.gpus_per_node
        if num_gpus > per_node and num_gpus % per_node:
            out.reject(f"deployment.num_gpus: {num_gpus} GPUs do not fill whole {hw.name} nodes of {per_node}", point)
            return
        nodes = 1 if num_gpus <= per_node else num_gpus // per_node
        per_stage = num_gpus // pp
        tps = [d for d in divisors(per_stage) if d <= search.max_tp]
        price = self._price(hw)
        largest = max(search.batches)
        two_batch = base_dep.overlap == "two-batch"
        for attn_tp in tps:
            for ffn_tp in tps:
                eps = divisors(per_stage // ffn_tp) if model.is_moe else [1]
                for ep in eps:
                    layout = with_layout(base_dep, num_gpus, nodes, pp, attn_tp, ffn_tp, ep)
                    searched = self._searched(point, out, layout, model, hw, work, run)
                    if searched is None:
                        continue
                    dep, mem = searched
                    fit = mem.kv_fit_batch_per_gpu if mem.kv_capacity_bytes > 0 else 0
                    if dep.weight_offload != "none":
                        fit = largest  # each row's own simulation offloads what its batch needs and says if it fits
                    batches = [b for b in search.batches if b <= fit]
                    out.unfit += len(search.batches) - len(batches)
                    if not batches:
                        out.note(point, UNFIT)
                    if two_batch:  # two micro-batches need an even batch
                        batches = [b for b in batches if b % 2 == 0]
                        fit -= fit % 2
                    if search.include_max_batch and 1 <= fit <= largest and fit not in batches:
                        batches.append(fit)
                    for batch in batches:
                        try:
                            out.rows.append(self._row(point, model, hw, dep, work, batch, mem, price, run))
                        except InferSimError as exc:  # e.g. an odd batch under two-batch overlap
                            out.reject(problem_text(exc))


def row_config(spec: SweepSpec, row: Row) -> RunConfig:
    """The validated run config a simulated row stands for: its grid point, its searched layout and its
    decode batch (what a launch command realises)."""
    deriver = Deriver(spec.base, spec.axes)
    values = spec.values(row.point)
    model, hw, dep, run, work = deriver.parts(values)
    if spec.search is not None:
        dep = deriver.complete(with_layout(deriver.deployment(values), row.num_gpus, row.num_nodes, row.pp,
                                           row.attn_tp, row.ffn_tp, row.ffn_ep), model, hw)
    return with_variant(run, model, hw, dep, evolve(work, decode_batch_per_gpu=row.batch))


_WORKER = threading.local()


def evaluate_chunk(payload: bytes, start: int, stop: int) -> ChunkResult:
    """Worker entry point: `payload` is the pickled SweepSpec. The unpickled spec and its caches
    stay in the worker between chunks of the same sweep (one evaluator per thread, so thread
    pools and threaded Dask workers are safe)."""
    cached = getattr(_WORKER, "entry", None)
    if cached is None or cached[0] != payload:
        cached = _WORKER.entry = (payload, Evaluator(pickle.loads(payload)))
    return cached[1].run(start, stop)
