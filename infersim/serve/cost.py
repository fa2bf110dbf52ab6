"""Step cost of one serving iteration, from the stage engine, memoised on bucketed shapes.

How a step is composed. One iteration of an engine instance holds `c` prefill chunks (q_i new
prompt tokens on top of p_i cached ones) and `n` decode requests with contexts ctx_j. It is priced
by `build_step_plan` + `stage_time_by_bound` (run_stage's time without its per-operation results; the
stage engine stays the only place that prices a step, the engine card's software overhead included)
over per-GPU sequences:
  - prefill chunks as c sequences of q = T / c new tokens each (T = sum q_i) attending to
    kv = the token-weighted mean of (p_i + q_i): GEMMs, norms and collectives see the total T,
    attention sees each chunk's own context (exact for one chunk, the common case);
  - decode requests as n sequences of one token at their mean context (decode attention reads
    every cached token once, so its cost is linear in the context and the mean is exact), priced
    with the decode attention kernel even beside prompt chunks (absorbed MLA, generation-phase
    attention), as engines split a mixed batch;
  - under attention data parallelism the step is set by the busiest DP rank: it holds
    ceil(n / dp) decode requests and ceil(c / dp) chunks with their share of the tokens (a single
    prompt is not split over ranks: with fewer chunks than ranks one rank prefills a whole chunk);
    the routed experts (all-to-all MoE) see the mean tokens over the ranks, (T + n) / (dp x tp) per
    GPU, since every rank's experts serve every rank's tokens: a prompt on one rank adds one
    prompt of expert work to the group, not one per rank;
  - the stage engine's sequences are per GPU and an attention TP group of tp GPUs processes tp times
    them, so the rank's decode work is given as ceil(count / tp) requests per GPU; its prefill
    chunks are the group's (SequenceBatch across_tp: each chunk's tokens spread over the group's
    GPUs, attention run once per chunk with each GPU's heads).
  - with speculative decoding (the config's `speculative` section) a decode request feeds its token
    and the k drafted ones: the model's step verifies q = k + 1 tokens per request (attending to
    the context and to each other, as infersim.run.speculative prices it, with the engine as it runs
    a speculative step), and the drafter adds k passes of one token per decode request plus one
    pass over the step's prompt chunks (it prefills them too), without a second scheduler overhead.
    Each step yields E(k) tokens per request in expectation (`tokens_per_step`), which the
    scheduler's token clock advances by. `lookahead: auto` is resolved once, at one request per GPU.
Memoisation and its error bound. Every length (T, kv, mean decode context) and every count above
EXACT_BELOW is rounded to the nearest point of a geometric grid of ratio `width` (default 1.04),
i.e. by at most a factor sqrt(width) = 1.0198. Step time is non-decreasing and at most linear in
each of these sizes, so rounding changes a step by at most +-2% (+-4% for prefill attention, which
is linear in q and in kv at once), not counting GEMM tile padding where a rounded token count
crosses a 64-row tile edge (memory-bound decode GEMMs are insensitive to it). Rounding goes both
ways on a log grid, so over many steps the errors largely cancel.
Sharing prices between runs. A step's price reads only its `StepPricing` record: the model,
deployment, hardware and engine cards, the kernel tables and the bucket width (and, with
speculative decoding, the whole run config: its drafter and `lookahead: auto` read the workload).
Runs whose records are equal (a validation's points that differ in lengths, rates or request
counts) price the same steps alike, so an owner of many runs creates one `StepPriceBook` and passes
it to each: every coster then reads the prices the earlier runs found, and still counts the shapes
its own run priced (`priced`) as if it were alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infersim.cards.deployment import Deployment
from infersim.cards.engine import EngineCard
from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.costing.memo import PricingMemo
from infersim.engine.energy import step_joules_by_bound
from infersim.engine.stage import stage_time_by_bound
from infersim.modules.step import build_step_plan
from infersim.shapes.kernels import KernelTables
from infersim.shapes.plan import SequenceBatch

EXACT_BELOW = 16  # counts below this are priced exactly
DEFAULT_WIDTH = 1.04
# a step as the stage engine is given it: (per-GPU sequences, stage, experts' tokens per GPU, graph padding,
# the drafter's (prompt chunk, decode requests per rank, their context) or None)
StageArguments = tuple[tuple[SequenceBatch, ...], str | None, float, int, tuple[SequenceBatch | None, int, int] | None]


@dataclass(frozen=True)
class StepShape:
    """A bucketed step: per-instance counts and lengths after rounding."""

    decode_requests: int
    decode_context: int
    prefill_chunks: int
    prefill_tokens: int
    prefill_context: int


@dataclass(frozen=True)
class StepPricing:
    """What the price of a step is made of: the coster reads nothing else of the run config, so two
    runs with equal records price every step alike (compared by value, the tables by identity: a
    table directory is loaded once per process; not hashable: cards hold mappings)."""

    model: ModelCard
    deployment: Deployment
    hardware: HardwareCard
    tables: KernelTables
    engine: EngineCard
    width: float
    speculative_run: RunConfig | None  # with speculative decoding: the drafter and lookahead read the whole run

    @classmethod
    def of(cls, config: RunConfig, width: float) -> StepPricing:
        return cls(config.model, config.deployment, config.hardware, config.tables, config.engine, width,
                   config if config.speculative is not None else None)


class StepPrices:
    """Prices of bucketed steps under one StepPricing, and its grid points and speculative lookahead."""

    def __init__(self, inputs: StepPricing) -> None:
        self.inputs = inputs
        self.steps: dict[tuple[int, int, int, int, int], tuple[float, float]] = {}
        self.by_arguments: dict[StageArguments, tuple[float, float]] = {}  # the steps' prices by what they give the stage engine
        self.grid: dict[int, int] = {}  # whole number -> its point on the bucket grid
        self.lookahead: tuple[int, float, bool] | None = None  # speculative: (k, E(k), chosen by auto)


class StepPriceBook:
    """Step prices kept across the serving runs of one owner: a StepPrices per pricing record (found
    by equality) and one PricingMemo for the plan pieces and kernel costs of all of them."""

    def __init__(self) -> None:
        self.pricing = PricingMemo()
        self._prices: list[StepPrices] = []

    def prices(self, inputs: StepPricing) -> StepPrices:
        for kept in self._prices:
            if kept.inputs == inputs:
                return kept
        self._prices.append(StepPrices(inputs))
        return self._prices[-1]


class StepCoster:
    """Prices steps of one deployment; `cost(...)` is memoised on the bucketed shape (in `book`, when
    given, shared with the other runs of its owner that have the same StepPricing)."""

    def __init__(self, config: RunConfig, width: float = DEFAULT_WIDTH, book: StepPriceBook | None = None) -> None:
        if not width >= 1.0:
            raise ValueError("bucket width must be >= 1")
        self.inputs = inputs = StepPricing.of(config, width)
        shared = book.prices(inputs) if book is not None else StepPrices(inputs)
        self.width = width
        self._log_width = math.log(width) if width > 1 else 0.0
        self.dp = inputs.deployment.attention.dp
        self.tp = inputs.deployment.attention.tp
        self._memo: dict[tuple[int, int, int, int, int], tuple[float, float]] = {}  # this run's shapes
        self._shared = shared.steps
        self._by_arguments = shared.by_arguments
        self._grid = shared.grid
        self.priced = 0  # step shapes this run priced (its memo misses; the book may have held their prices)
        self.sms = inputs.hardware.derates.deepep_normal_sms
        # plan pieces and kernel costs the priced steps share
        self.pricing = book.pricing if book is not None else PricingMemo()
        self.lookahead = 0  # speculative tokens verified per decode request and step
        self.tokens_per_step: float = 1  # expected tokens a decode step gives each request
        self.lookahead_auto = False
        self.engine = inputs.engine
        if inputs.speculative_run is not None:
            from infersim.run.speculative import serving_lookahead, speculative_engine

            if shared.lookahead is None:
                shared.lookahead = serving_lookahead(inputs.speculative_run)
            self.lookahead, self.tokens_per_step, self.lookahead_auto = shared.lookahead
            self.engine = speculative_engine(inputs.engine)

    def bucket(self, value: float) -> int:
        """`value` (rounded to a whole number first) on the geometric grid (counts below EXACT_BELOW
        and width 1 stay exact); memoised per whole number."""
        whole = int(value + 0.5)
        point = self._grid.get(whole)
        if point is None:
            if whole < EXACT_BELOW or not self._log_width:
                point = max(0, whole)
            else:
                point = int(round(math.exp(round(math.log(whole) / self._log_width) * self._log_width)))
            self._grid[whole] = point
        return point

    def cost(self, decode_requests: int, decode_context_sum: float, prefill_chunks: int, prefill_tokens: int,
             prefill_context_weighted: float) -> float:
        """Seconds of one step. decode_context_sum: sum of the decode requests' contexts (the KV
        length each attends to, its new token included); prefill_context_weighted: sum over chunks of
        q_i x (p_i + q_i)."""
        return self.cost_energy(decode_requests, decode_context_sum, prefill_chunks, prefill_tokens,
                                prefill_context_weighted)[0]

    def cost_energy(self, decode_requests: int, decode_context_sum: float, prefill_chunks: int, prefill_tokens: int,
                    prefill_context_weighted: float) -> tuple[float, float]:
        """(seconds, joules on one GPU) of one step (arguments as `cost`); joules 0 when the hardware
        card has no power facts (infersim.engine.energy)."""
        b = self.bucket
        n = b(decode_requests)
        ctx = b(decode_context_sum / decode_requests) if decode_requests else 0
        c = prefill_chunks
        t = b(prefill_tokens) if c else 0
        kv = b(prefill_context_weighted / prefill_tokens) if c else 0
        key = (n, ctx, c, t, kv)
        priced = self._memo.get(key)
        if priced is None:
            priced = self._shared.get(key)
            if priced is None:
                priced = self._shared[key] = self.price_energy(StepShape(n, ctx, c, t, kv))
            self._memo[key] = priced
            self.priced += 1
        return priced

    def price(self, shape: StepShape) -> float:
        """Run the stage engine on one (already bucketed) step: its seconds."""
        return self.price_energy(shape)[0]

    def price_energy(self, shape: StepShape) -> tuple[float, float]:
        """Run the stage engine on one (already bucketed) step: (seconds, joules on one GPU).
        Bucketed shapes that give the stage engine the same arguments (ranks and GPUs splitting
        counts alike, prompt chunks of the same size) are priced once."""
        key = self._stage_arguments(shape)
        priced = self._by_arguments.get(key)
        if priced is None:
            priced = self._by_arguments[key] = self._run(*key)
        return priced

    def _stage_arguments(self, shape: StepShape) -> StageArguments:
        """What pricing `shape` gives the stage engine: the per-GPU sequences, the stage the plan
        is built for, the experts' tokens per GPU and the graph padding; with speculative decoding
        also what the drafter is given (the prompt chunk, decode requests per rank and their context)."""
        dp, tp = self.dp, self.tp
        seqs = []
        padding = 0
        chunk = None
        if shape.prefill_chunks:
            rank_chunks = -(-shape.prefill_chunks // dp)
            rank_tokens = shape.prefill_tokens * rank_chunks / shape.prefill_chunks
            q = max(1, round(rank_tokens / rank_chunks))
            chunk = SequenceBatch(rank_chunks, q, max(q, shape.prefill_context), across_tp=tp > 1)
            seqs.append(chunk)
        cfg = self.inputs
        verify = 1 + self.lookahead  # tokens each decode request feeds
        rank_requests = -(-shape.decode_requests // dp)
        if shape.decode_requests:
            per_gpu = -(-rank_requests // tp)
            if not shape.prefill_chunks:  # a pure decode step replays a graph at the padded batch
                padded = cfg.engine.graph_padded_batch(per_gpu, cfg.hardware.peak.hbm_bytes, tp,
                                                       cfg.deployment.gpus_per_stage, cfg.hardware)
                padding = (padded - per_gpu) * verify
            seqs.append(SequenceBatch(per_gpu, verify, max(1, shape.decode_context) + verify - 1))
        expert_tokens = 0.0
        if shape.prefill_chunks and dp > 1:  # unequal ranks: the experts see the mean, not the busiest
            expert_tokens = (shape.prefill_tokens + shape.decode_requests * verify) / (dp * tp)
        draft = (chunk, rank_requests, shape.decode_context) if self.lookahead else None
        return tuple(seqs), "decode" if verify > 1 and not chunk else None, expert_tokens, padding, draft

    def _run(self, seqs: tuple[SequenceBatch, ...], stage_name: str | None, expert_tokens: float, padding: int,
             draft: tuple[SequenceBatch | None, int, int] | None) -> tuple[float, float]:
        """(seconds, joules on one GPU) of a step the stage engine is given these arguments for."""
        cfg = self.inputs
        plan = build_step_plan(cfg.model, cfg.deployment, seqs, self.sms, stage=stage_name,
                               expert_tokens_per_gpu=expert_tokens, graph_padding=padding, memo=self.pricing)
        # the step's time and its seconds per bound, without per-operation results (none is shown)
        seconds, by_bound = stage_time_by_bound(plan, cfg.hardware, cfg.tables, self.engine, self.pricing)
        power = cfg.hardware.power
        joules = step_joules_by_bound(by_bound, seconds, power)[0] if power is not None else 0.0
        if draft is not None:
            draft_s = self._draft_seconds(*draft)
            # the drafter runs the same kinds of kernels on the same GPUs: its time draws the
            # target step's mean power
            joules += draft_s * joules / seconds if seconds > 0 else 0.0
            seconds += draft_s
        return seconds, joules

    def _draft_seconds(self, chunk: SequenceBatch | None, rank_requests: int, context: int) -> float:
        """The drafter's share of a speculative step: k one-token passes over the decode requests
        and one pass over the prompt chunks."""
        from infersim.run.speculative import drafter_step_time

        cfg = self.inputs.speculative_run
        assert cfg is not None
        seconds = 0.0
        if rank_requests:
            draft_tp = cfg.draft_deployment.attention.tp if cfg.draft_deployment is not None else self.tp
            per_gpu = -(-rank_requests // draft_tp)
            seconds += self.lookahead * drafter_step_time(cfg, (SequenceBatch(per_gpu, 1, max(1, context)),))
        if chunk is not None:
            seconds += drafter_step_time(cfg, (chunk,))
        return seconds
