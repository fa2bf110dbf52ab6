"""One serving-engine instance: continuous batching as the engine card describes it.

Scheduler settings come from the engine card (`settings_from_engine`): a per-step token budget
(the chunk budget; in mixed steps decode tokens count against it too), a running-request cap,
mixed steps or separate prefill and decode passes, prefill-first or decode-first, KV admission
(reserve-full: a request is admitted only when pages for its whole prompt + output are free, so
nothing is ever evicted; on-demand: pages are taken as tokens arrive, and when a decode step would
run out the most recently admitted running request is preempted and later recomputed), the page
size and the prefix cache. In offline mode an engine card's `offline_limits` (trtllm's) reproduce
its benchmark tool's own max_batch_size / max_num_tokens heuristic (`offline_limits`).

Prefix cache: with a hit rate h, the first h x prompt tokens (whole pages) of a request admitted
for the first time are found in the cache; with shared-prefix ids, a request whose prefix id was
prefilled before finds its prefix_tokens there. Cached tokens are not recomputed and their pages,
shared with the cache, are not charged to the request (eviction of cached prefixes is not
modelled). The KV pool counts cache that grows with the context; the bounded per-request state of
sliding-window or recurrent layers is charged by mean field: the pool's tokens are counted at the
growing bytes per token plus a mean-length request's bounded bytes spread over its tokens (exact
when every request has the mean length). Decode-first without mixed steps means a
static batch: prompts are prefilled only when no request is decoding.

Each iteration: arrivals join the waiting queue; waiting requests are admitted FCFS while the cap,
the step's token budget and the KV pages allow; the step is formed (decode requests one token
each, prefill chunks FCFS within the budget) and priced by `StepCoster`; then chunks advance,
finished prompts emit their first token and join decode, decode requests emit a token, finished
requests leave. A request's first token comes out of the step that prefills the last chunk of
its prompt; an arrival during a running step waits for that step to end (continuous batching
admits between steps), so with an otherwise idle engine TTFT is the wait for the step in flight
(at most one step, zero when the engine is idle) plus the prefill of its prompt.

Speed (no per-token Python walk): decode requests are not iterated per step. A global decode
counter k counts decode steps; a request joining decode at k0 with context c0 has context
c0 + (k - k0) at step k, so the batch's context sum is sum(c0 - k0) + n k and completions are a
heap keyed by k0 + remaining output. While a step is pure decode and nothing can change the batch,
the instance jumps over the whole stretch of m steps up to the next event (a completion, an
arrival when the queue is empty, KV exhaustion under on-demand admission, the caller's time limit;
with a decaying future-token reservation (SGLang's) at most RESERVATION_MAX_STRETCH = 32 steps while requests wait) and prices it once at the
stretch's middle context: decode attention is linear in the context, so the stretch's summed time
is exact up to the step-cost bucketing (see infersim.serve.cost).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from infersim.cards.engine import EngineCard, FutureTokenReservation, OfflineLimits
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.cards.deployment import Deployment
from infersim.base.errors import InferSimError, NotPossible
from infersim.serve.cost import StepCoster
from infersim.serve.workload import Request
from infersim.base.units import dtype_bytes

RESERVATION_MAX_STRETCH = 32  # decode steps skipped at once while requests wait on a decaying reservation


@dataclass(frozen=True)
class SchedulerSettings:
    """How one engine instance schedules (per instance, not per GPU)."""

    token_budget: int  # tokens one step processes (prefill chunks, plus decode tokens in mixed steps)
    max_running: int  # running-request cap (0 = bounded by KV pages only)
    mixed: bool  # prefill chunks and decode requests share one forward pass
    policy: str  # prefill-first | decode-first
    admission: str  # reserve-full | on-demand
    page_size: int
    chunked: bool  # prompts longer than the room left in a step run in chunks
    prefix_cache: bool
    kv_capacity_tokens: int  # KV pool of the instance, tokens
    reservation: FutureTokenReservation | None  # KV held for running requests' future tokens (engine card)
    origin: str  # where the budget and cap come from
    max_chunk: int = 0  # largest chunk of one prompt per step (the per-rank budget under attention DP; 0 = budget)
    # attention-DP ranks sharing the instance's budget: each runs its own executor, so without
    # chunking each rank takes whole prompts into its own share of the budget (and the first one
    # past it), not one prompt for the whole instance
    dp_ranks: int = 1

    def describe(self) -> str:
        cap = str(self.max_running) if self.max_running else "KV-bound"
        return (f"token budget {self.token_budget} per step ({'chunked' if self.chunked else 'whole prompts'}), "
                f"running cap {cap}, {'mixed steps' if self.mixed else 'separate prefill and decode passes'}, "
                f"{self.policy}, KV {self.admission} in pages of {self.page_size}, "
                f"prefix cache {'on' if self.prefix_cache else 'off'}, KV pool {self.kv_capacity_tokens:,} tokens "
                f"({self.origin})")


def _round_up(value: float, step: int) -> int:
    return int(-(-value // step) * step)


def checkpoint_bytes_per_weight(model: ModelCard, dep: Deployment, limits: OfflineLimits) -> float:
    """Bytes per parameter the benchmark tool's heuristic charges the whole model (the engine card's
    offline_limits: trtllm-bench lists FP8 and NVFP4 checkpoints). Routed experts stored narrower
    than their GEMM inputs are a weight-only checkpoint (GPT-OSS's MXFP4 experts: W4A16 or W4A8
    MXFP4), which the tool does not list, though the weights really take far less."""
    prec = dep.precision
    if model.is_moe and dtype_bytes(prec.expert_weight_dtype) < dtype_bytes(prec.expert_gemm_dtype):
        return limits.other_bytes_per_weight
    return limits.bytes_per_weight.get(prec.weight_dtype, limits.other_bytes_per_weight)


def offline_limits(config: RunConfig, isl: float, osl: float) -> tuple[int, int]:
    """The engine's offline benchmark tool's own (request cap, token budget) when not given, from
    the engine card's `offline_limits` (trtllm-bench's max_batch_size / max_num_tokens heuristic)."""
    from infersim.run.memory import total_parameters

    limits = config.engine.offline_limits
    if limits is None:
        raise InferSimError(f"engine {config.engine.name} has no offline_limits")
    model, dep, hw = config.model, config.deployment, config.hardware
    weight_bytes = checkpoint_bytes_per_weight(model, dep, limits)
    kv_bytes = dtype_bytes(dep.precision.kv_cache)
    tp = dep.attention.tp
    head_dim = model.head_dim if not model.is_mla else (model.kv_lora_rank + model.qk_rope_head_dim) / 2
    kv_heads = model.num_key_value_heads if not model.is_mla else 1
    kv_per_token = 2 * model.num_hidden_layers * max(tp, kv_heads) * head_dim * kv_bytes
    kv_memory = (hw.peak.hbm_bytes * dep.gpus_per_stage * dep.pp
                 - total_parameters(model) * weight_bytes) * limits.kv_memory_fraction
    if kv_memory <= 0:
        raise NotPossible(f"{limits.tool} heuristic: {model.name}'s weights do not fit in {dep.num_gpus} x {hw.name}")
    fit = kv_memory / kv_per_token / (isl + osl)
    raw_batch = min(fit, limits.max_batch) / dep.pp
    raw_tokens = min(raw_batch * (1 + isl / osl), limits.max_tokens)
    return limits.rounded(raw_batch, limits.batch_rounding), limits.rounded(raw_tokens, limits.token_rounding)


def settings_from_engine(config: RunConfig, mean_isl: float, mean_osl: float, offline: bool,
                         prefix_cache: bool | None = None, prefill_only: bool = False) -> SchedulerSettings:
    """Scheduler settings of one instance of `config`'s deployment under its engine card."""
    from infersim.run.memory import memory_budget
    from infersim.cards.deployment import Workload

    engine: EngineCard = config.engine
    dep, hw = config.deployment, config.hardware
    if dep.pp > 1:
        raise InferSimError("serve: pipeline parallelism (deployment.pp > 1) is not modelled by the serving "
                            "simulator; use pp: 1 (replicas model data parallelism)")
    sched = engine.scheduler
    dp = dep.attention.dp
    hbm = hw.peak.hbm_bytes
    per_gpu = engine.chunk_tokens(hbm, dp)  # per attention-DP rank
    budget = per_gpu * dp if per_gpu else 0  # the instance's DP ranks each take a budget per step
    cap = engine.max_running_requests(hbm)
    chunked = budget > 0
    origin = f"engine card {engine.name} {engine.version}"
    if offline and engine.offline_limits is not None:
        cap, budget = offline_limits(config, mean_isl, mean_osl)
        chunked = engine.offline_limits.chunked
        origin = f"{engine.offline_limits.tool} heuristic max_batch_size {cap}, max_num_tokens {budget}"
        if dp > 1:  # every attention-DP rank runs its own executor under these limits
            cap, budget = cap * dp, budget * dp
            origin += f" per attention-DP rank, x{dp} ranks"
    if not budget:
        budget = 1 << 30  # no chunk budget: whole prompts, any number per step
    workload = Workload(isl=max(1, round(mean_isl)), osl=max(1, round(mean_osl)), decode_batch_per_gpu=1)
    step_tokens = min(budget // dp if budget < (1 << 30) else round(mean_isl), 1 << 20)
    memory = memory_budget(config.model, hw, dep, workload, None, engine, max(1, step_tokens))
    if memory.kv_capacity_bytes <= 0:
        raise NotPossible(f"does not fit: {config.model.name}'s weights need {memory.weights_bytes / 1e9:.2f} GB per GPU "
                          f"of {hbm / 1e9:.2f} GB, {memory.reserved_bytes / 1e9:.2f} GB of it reserved by {engine.name}")
    # the pool is counted in tokens of the cache that grows with the context; the bounded cache
    # (sliding-window KV up to the window, recurrent state) of a mean-length request is spread over
    # its tokens, so a request of mean length is charged its whole footprint (Llama-4's chunked
    # layers hold every token of a 2k-token request: 3 of its 4 layers)
    per_token = memory.kv_bytes_per_token_per_gpu + memory.bounded_bytes_per_request_per_gpu / max(1, memory.request_context)
    capacity = int(memory.kv_capacity_bytes / per_token) * dp if per_token > 0 else 1 << 40
    return SchedulerSettings(
        token_budget=budget, max_running=cap, mixed=sched.mixed_batches and not prefill_only, policy=sched.policy,
        admission=sched.kv_admission, page_size=engine.page_size(hw, config.model.is_mla), chunked=chunked,
        prefix_cache=sched.prefix_cache if prefix_cache is None else prefix_cache, kv_capacity_tokens=capacity,
        reservation=sched.future_reservation if sched.kv_admission == "on-demand" else None, origin=origin,
        max_chunk=per_gpu if chunked and dp > 1 and per_gpu else 0, dp_ranks=dp)


class RequestState:
    """A request's progress inside an instance (mutable; records are made from it at the end)."""

    __slots__ = ("req", "prompt_total", "prompt_done", "generated", "cached", "scheduled_s", "first_token_s",
                 "finish_s", "join_k", "ctx_join", "reserve_join", "finish_k", "kv_charge", "preemptions",
                 "version", "instance", "ready_s", "shared", "client")

    def __init__(self, req: Request, ready_s: float | None = None, prefilled: bool = False) -> None:
        self.req = req
        self.prompt_total = req.input_tokens
        self.prompt_done = req.input_tokens if prefilled else 0
        self.generated = 1 if prefilled else 0
        self.cached = 0
        self.scheduled_s = -1.0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.join_k = 0
        self.ctx_join = 0
        self.reserve_join = 0
        self.finish_k = 0
        self.kv_charge = 0.0
        self.preemptions = 0
        self.version = 0
        self.instance = -1
        self.ready_s = req.arrival_s if ready_s is None else ready_s  # when it reaches this instance
        self.shared = 0  # shared-prefix tokens served from another request's pages
        self.client = -1  # closed loop: the client that sent it


@dataclass
class InstanceStats:
    steps: int = 0  # engine steps simulated
    iterations: int = 0  # loop iterations (a skipped-over decode stretch counts once)
    busy_s: float = 0.0
    busy_joules: float = 0.0  # energy of one of the instance's GPUs over its steps (0 without power facts)
    inflight_integral: float = 0.0  # integral of requests in the instance (waiting + running) over time
    kv_integral: float = 0.0  # integral of KV tokens in use over busy time
    kv_peak: float = 0.0
    preemptions: int = 0
    tokens_emitted: int = 0  # output tokens this instance produced (prefill first tokens + decode tokens)
    # inter-token gaps: seconds, and the tokens that saw each (typed arrays: 16 bytes a sample)
    itl_gaps: array = field(default_factory=lambda: array("d"))
    itl_tokens: array = field(default_factory=lambda: array("q"))

    def itl(self, gap: float, tokens: int) -> None:
        self.itl_gaps.append(gap)
        self.itl_tokens.append(tokens)


class Instance:
    """One engine instance (one copy of the deployment). Feed requests with `add`, run with `run`."""

    def __init__(self, settings: SchedulerSettings, coster: StepCoster, index: int = 0,
                 prefill_only: bool = False) -> None:
        self.s = settings
        self.coster = coster
        self.index = index
        self.prefill_only = prefill_only
        self.now = 0.0
        self.pending: deque[RequestState] = deque()
        self.waiting: deque[RequestState] = deque()
        self.prefilling: list[RequestState] = []
        self.heap: list[tuple[int, int, int, RequestState]] = []
        self.members: list[RequestState] = []  # decode members in admission order (lazy, for preemption)
        self.k = 0
        self.n_dec = 0
        self.ctx_base = 0  # sum over decode members of (ctx_join - join_k)
        self.reserve_base = 0  # with a future-token reservation: sum of (min(remaining, cap) + join_k)
        self.kv_fixed = 0.0  # pages held outside the decode context sum (see module docstring)
        reserve = settings.reservation
        self._initial_ratio = reserve.initial_ratio if reserve else 0.0
        self._min_ratio = self._initial_ratio * reserve.final_fraction if reserve else 0.0
        self._ratio_decay = (self._initial_ratio - self._min_ratio) / reserve.decay_steps if reserve else 0.0
        self._reserve_cap = reserve.cap_tokens if reserve else 0
        self.ratio = self._initial_ratio
        self.seen_prefixes: set[str] = set()
        self.prefix_hit_rate = 0.0
        self.last_decode_end = 0.0  # end of the last step that gave decode requests a token
        self.new_joiners = 0  # requests that joined decode since that step (their last token: last_join_s)
        self.last_join_s = 0.0
        self.sink: Callable[[RequestState], None] | None = None  # where finished requests go
        self.stats = InstanceStats()
        self._seq = 0
        self.slack = (settings.page_size - 1) / 2 if settings.admission == "on-demand" else 0.0

    # -- bookkeeping -------------------------------------------------------------------------

    @property
    def load(self) -> int:
        """Requests in this instance (pending included), for least-loaded routing."""
        return len(self.pending) + len(self.waiting) + len(self.prefilling) + self.n_dec

    def add(self, state: RequestState) -> None:
        """Queue a request that reaches this instance at state.ready_s (not before the last one)."""
        state.instance = self.index
        self.pending.append(state)

    def kv_used(self) -> float:
        if self.s.admission == "reserve-full":
            return self.kv_fixed
        return self.kv_fixed + self.ctx_base + self.n_dec * self.k

    def _pages(self, tokens: float) -> int:
        return _round_up(tokens, self.s.page_size)

    def _arrive(self) -> None:
        pending, now = self.pending, self.now
        while pending and pending[0].ready_s <= now:
            r = pending.popleft()
            self.stats.inflight_integral += now - r.ready_s
            self.waiting.append(r)

    # -- admission -----------------------------------------------------------------------------

    def _admit(self) -> None:
        s = self.s
        waiting = self.waiting
        if not waiting:
            return
        pending_tokens = sum(r.prompt_total - r.prompt_done for r in self.prefilling)
        room = s.token_budget - (self.n_dec if s.mixed else 0)
        while waiting:
            if s.max_running and len(self.prefilling) + self.n_dec >= s.max_running:
                return
            r = waiting[0]
            prefilled = r.prompt_done >= r.prompt_total
            # without chunking each attention-DP rank takes a whole prompt of its own even past its
            # share of the budget, so admission keeps one pending prompt per rank in reach
            if not prefilled and pending_tokens >= room and (s.chunked or len(self.prefilling) >= s.dp_ranks):
                return
            cached = 0
            if not prefilled and s.prefix_cache and r.preemptions == 0:
                if r.req.prefix_id and r.req.prefix_id in self.seen_prefixes:
                    cached = r.req.prefix_tokens
                elif self.prefix_hit_rate:
                    cached = int(self.prefix_hit_rate * r.req.input_tokens)
                cached = min(cached // s.page_size * s.page_size, r.prompt_total - 1)
            remaining_out = r.req.output_tokens - r.generated
            if s.admission == "reserve-full":
                charge = float(self._pages(r.prompt_total - cached + remaining_out))
                if self.kv_fixed + charge > s.kv_capacity_tokens:
                    return
            else:
                charge = float(r.prompt_total - cached) + self.slack
                need = self.kv_used() + charge
                if s.reservation:
                    reserve = max(0, self.reserve_base - self.n_dec * self.k) + min(remaining_out, self._reserve_cap)
                    need += self.ratio * reserve
                if need > s.kv_capacity_tokens:
                    if not (self.n_dec == 0 and not self.prefilling):
                        return
                    if r.prompt_total - cached + remaining_out > s.kv_capacity_tokens:
                        raise NotPossible(f"request {r.req.id}: {r.prompt_total} + {remaining_out} tokens do not fit "
                                          f"in the instance's KV cache of {s.kv_capacity_tokens:,} tokens")
            waiting.popleft()
            if r.scheduled_s < 0:
                r.scheduled_s = self.now
            if prefilled:
                self.new_joiners += 1
                self.last_join_s = max(self.last_join_s, r.ready_s)
            r.cached = cached
            r.shared = cached  # cached pages belong to the prefix cache, shared: not charged to this request
            r.kv_charge = charge
            self.kv_fixed += charge
            if prefilled:
                self._join_decode(r)
            else:
                r.prompt_done = cached
                pending_tokens += r.prompt_total - cached
                self.prefilling.append(r)

    def _join_decode(self, r: RequestState) -> None:
        """r's prompt is in the KV cache and it has emitted r.generated tokens; decode the rest."""
        r.join_k = self.k
        r.ctx_join = r.prompt_total + 1
        r.finish_k = self.k + r.req.output_tokens - r.generated
        r.version += 1
        self.n_dec += 1
        self.ctx_base += r.ctx_join - r.join_k
        if self.s.admission == "on-demand":
            # decode context takes over the prompt's pages; keep the page slack, drop shared-prefix tokens
            self.kv_fixed += self.slack - r.kv_charge - r.shared
            r.kv_charge = self.slack - r.shared
        if self.s.reservation:
            r.reserve_join = min(r.req.output_tokens - r.generated, self._reserve_cap) + r.join_k
            self.reserve_base += r.reserve_join
        self._seq += 1
        heapq.heappush(self.heap, (r.finish_k, self._seq, r.version, r))
        members = self.members
        members.append(r)
        if len(members) > 2 * self.n_dec + 64:  # drop those that left, so finished requests are not held
            self.members = [m for m in members if m.version % 2]

    def _leave_decode(self, r: RequestState) -> None:
        self.n_dec -= 1
        self.ctx_base -= r.ctx_join - r.join_k
        self.kv_fixed -= r.kv_charge
        r.kv_charge = 0.0
        if self.s.reservation:
            self.reserve_base -= r.reserve_join
        r.version += 1

    def _preempt_for(self, needed: float) -> None:
        """On-demand admission: free pages for the next decode step by preempting the most recently
        admitted decode requests (recomputed later from their prompt and the tokens they made)."""
        while self.n_dec and self.kv_used() > self.s.kv_capacity_tokens - needed:
            r = self.members.pop()
            if r.version % 2 == 0:  # no longer decoding (finished or already preempted)
                continue
            r.generated += self.k - r.join_k
            self._leave_decode(r)
            r.prompt_total = r.req.input_tokens + r.generated
            r.prompt_done = 0
            r.preemptions += 1
            self.stats.preemptions += 1
            self.waiting.appendleft(r)
            self.ratio = self._initial_ratio

    # -- the loop ------------------------------------------------------------------------------

    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.n_dec)

    def run(self, until: float = math.inf, on_finish: Callable[[RequestState], None] | None = None,
            wait_for_arrivals: bool = False) -> None:
        """Run steps that start before `until` (all work when infinite). With `wait_for_arrivals`,
        stop before any iteration that would start without a pending arrival: the caller has not
        given this instance its next request yet, and a step's length looks ahead to it."""
        stats = self.stats
        while True:
            self._arrive()
            if wait_for_arrivals and not self.pending:
                return
            if self.idle():
                if not self.pending or self.pending[0].ready_s >= until:
                    return
                self.now = max(self.now, self.pending[0].ready_s)
                self.last_decode_end = self.now
                continue
            if self.now >= until:
                return
            self._admit()
            self._step(until, on_finish)
            stats.iterations += 1

    def _step(self, until: float, on_finish: Callable[[RequestState], None] | None) -> None:
        s = self.s
        stats = self.stats
        chunks: list[tuple[RequestState, int]] = []
        decode = self.n_dec > 0
        if s.mixed:
            room = s.token_budget - self.n_dec
            chunks = self._take_chunks(room)
        elif self.prefilling and (s.policy == "prefill-first" or not decode):
            chunks = self._take_chunks(s.token_budget)
            decode = False
        if decode and s.admission == "on-demand":
            self._preempt_for(0.0)
            decode = self.n_dec > 0
            if not decode and not chunks and self.prefilling:
                chunks = self._take_chunks(s.token_budget)
        n = self.n_dec if decode else 0
        if not chunks and not n:
            raise NotPossible(f"serve: instance {self.index} cannot schedule anything: the first waiting request "
                              f"needs more KV cache than the {s.kv_capacity_tokens:,} tokens of the pool")
        count_in = len(self.waiting) + len(self.prefilling) + self.n_dec
        if chunks:
            tokens = sum(q for _r, q in chunks)
            weighted = sum(q * (r.prompt_done + q) for r, q in chunks)
            dt, joules = self.coster.cost_energy(n, self.ctx_base + n * self.k, len(chunks), tokens, weighted)
            m = 1
        else:
            m = self._stretch_length(n, until)
            dt, joules = self.coster.cost_energy(n, self.ctx_base + n * (self.k + (m - 1) / 2), 0, 0, 0.0)
            if until < math.inf:
                m = min(m, max(1, math.ceil((until - self.now) / dt)))
            if not self.waiting and self.pending:
                m = min(m, max(1, math.ceil((self.pending[0].ready_s - self.now) / dt)))
        span = dt * m
        kv = self.kv_used() + (n * (m - 1) / 2 if s.admission == "on-demand" else 0.0)
        stats.kv_integral += kv * span
        stats.kv_peak = max(stats.kv_peak, kv + (n * (m - 1) / 2 if s.admission == "on-demand" else 0.0))
        stats.inflight_integral += count_in * span
        stats.busy_s += span
        stats.busy_joules += joules * m
        stats.steps += m
        self.now += span
        if n:
            first_end = self.now - span + dt
            joiners = min(self.new_joiners, n)
            if n - joiners:
                stats.itl(first_end - self.last_decode_end, n - joiners)
            if joiners:
                stats.itl(first_end - self.last_join_s, joiners)
            self.new_joiners = 0
            if m > 1:
                stats.itl(dt, n * (m - 1))
            self.last_decode_end = self.now
            stats.tokens_emitted += n * m
            self.k += m
            if s.reservation:
                self.ratio = max(self._min_ratio, self.ratio - m * self._ratio_decay)
            heap = self.heap
            while heap and heap[0][0] <= self.k:
                _fk, _seq, version, r = heapq.heappop(heap)
                if version != r.version:
                    continue
                r.generated = r.req.output_tokens
                self._leave_decode(r)
                self._finish(r, on_finish)
        for r, q in chunks:
            r.prompt_done += q
            if r.prompt_done < r.prompt_total:
                continue
            self.prefilling.remove(r)
            if r.req.prefix_id:
                self.seen_prefixes.add(r.req.prefix_id)
            r.generated += 1
            stats.tokens_emitted += 1
            if r.first_token_s < 0:
                r.first_token_s = self.now
            if r.generated >= r.req.output_tokens or self.prefill_only:
                self.kv_fixed -= r.kv_charge
                r.kv_charge = 0.0
                self._finish(r, on_finish)
            else:
                self._join_decode(r)
                self.new_joiners += 1
                self.last_join_s = self.now
        if chunks and not n and not self.n_dec - self.new_joiners:
            self.last_decode_end = self.now

    def _finish(self, r: RequestState, on_finish: Callable[[RequestState], None] | None) -> None:
        r.finish_s = self.now
        if self.sink is not None:
            self.sink(r)
        if on_finish is not None:
            on_finish(r)

    def _take_chunks(self, room: int) -> list[tuple[RequestState, int]]:
        if not self.s.chunked and self.s.dp_ranks > 1:
            return self._take_whole_prompts_per_rank(room)
        chunks = []
        for r in self.prefilling:
            if room <= 0:
                break
            left = r.prompt_total - r.prompt_done
            if self.s.chunked:
                q = min(left, room, self.s.max_chunk) if self.s.max_chunk else min(left, room)
            elif left <= room or not chunks:
                q = left  # whole prompts only; the first one runs even past the budget
            else:
                break
            chunks.append((r, q))
            room -= q
        return chunks

    def _take_whole_prompts_per_rank(self, room: int) -> list[tuple[RequestState, int]]:
        """Whole prompts in arrival order, each onto the first attention-DP rank whose share of the
        room holds it, or onto a rank that has none yet (its first prompt runs even past its share,
        as on one executor); stops at the first prompt no rank takes."""
        ranks = self.s.dp_ranks
        share = room / ranks
        if share <= 0:
            return []
        rooms = [share] * ranks
        taken = [False] * ranks
        chunks = []
        for r in self.prefilling:
            left = r.prompt_total - r.prompt_done
            rank = next((i for i in range(ranks) if not taken[i] or left <= rooms[i]), None)
            if rank is None:
                break
            chunks.append((r, left))
            rooms[rank] -= left
            taken[rank] = True
        return chunks

    def _stretch_length(self, n: int, until: float) -> int:
        """Decode steps until the batch could change (see module docstring)."""
        heap = self.heap
        while heap and heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)
        m = heap[0][0] - self.k if heap else 1
        if self.s.admission == "on-demand" and n:
            free = self.s.kv_capacity_tokens - self.kv_used()
            m = min(m, int(free // n) + 1)
        if self.waiting and self.s.reservation and self.ratio > self._min_ratio:
            m = min(m, RESERVATION_MAX_STRETCH)
        return max(1, m)
