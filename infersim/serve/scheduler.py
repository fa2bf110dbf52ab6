"""One serving-engine instance: continuous batching as the engine card describes it.

Scheduler settings come from the engine card (infersim.serve.settings): a per-step token budget,
a running-request cap, mixed steps or separate prefill and decode passes, prefill-first or
decode-first, KV admission (reserve-full or on-demand with preemption), the page size, the prefix
cache. Decode-first without mixed steps means a static batch: prompts are prefilled only when no
request is decoding.

Prefix cache: a request that names its prompt's segments (token identity) is looked up in the
instance's `PrefixCache` (infersim.serve.prefix_cache) when admitted: the blocks it finds are not
recomputed, and are pinned while it runs; when its prompt is prefilled, its blocks join the cache
(pinned), and when it leaves, its output joins them and everything it pinned becomes evictable.
The pool holds the running requests' own tokens and the cache's pinned blocks; unpinned cached
blocks fill what is left and are evicted least recently used when the pool needs the room (before
each admission, at the highest use since the last eviction). A request found in the host tier waits
in its first prefill step for its blocks to come back over the host link. A trace's shared-prefix
ids name one segment. Without token identity, `--prefix-hit-rate h` finds the first h x prompt
tokens (whole pages) of a request admitted for the first time in the cache, a rate, not a cache.
The KV pool counts cache that grows with the context; the bounded per-request state of
sliding-window or recurrent layers is charged by mean field: the pool's tokens are counted at the
growing bytes per token plus a mean-length request's bounded bytes spread over its tokens.

Each iteration: arrivals join the waiting queue (an arrival that finds `max_waiting` requests
waiting is left waiting, never admitted: the overload guard); waiting requests are admitted FCFS
while the cap, the step's token budget and the KV pages allow; the step is formed (decode requests
one token each, prefill chunks FCFS within the budget) and priced by `StepCoster`; then chunks
advance, finished prompts emit their first token and join decode, decode requests emit a token,
finished requests leave. A request's first token comes out of the step that prefills the last
chunk of its prompt; an arrival during a running step waits for that step to end, so with an
otherwise idle engine TTFT is the wait for the step in flight plus the prefill of its prompt.
An overlap scheduler forms step k+1 while step k runs: a busy engine's arrival joins step k+2 (settings).

Speculative decoding: a decode step gives every decode request the expected number of tokens E of
one verification (infersim.run.speculative), fractional: the token clock below advances by E a step,
and a request finishes at the first step that reaches its output length.

Speed (no per-token Python walk): decode requests are not iterated per step. A token clock k counts
the tokens every decode request has gained; a request joining decode at k0 with context c0 has
context c0 + (k - k0), so the batch's context sum is sum(c0 - k0) + n k and completions are a heap
keyed by k0 + remaining output. While a step is pure decode and nothing can change the batch, the
instance jumps over the whole stretch of m steps up to the next event (a completion, an arrival
when the queue is empty, KV exhaustion under on-demand admission, the caller's time limit; with a
decaying future-token reservation (SGLang's) at most RESERVATION_MAX_STRETCH steps while requests
wait) and prices it once at the stretch's middle context: decode attention is linear in the
context, so the stretch's summed time is exact up to the step-cost bucketing (infersim.serve.cost).
An offline instance (every request waiting from t = 0) is given its requests as it takes them: it
runs ahead while `low_water` of them wait, more than one admission pass can take.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from infersim.base.errors import NotPossible
from infersim.serve.cost import StepCoster
from infersim.serve.prefix_cache import Match, PrefixCache
from infersim.serve.quantiles import EXACT_LIMIT, Samples
from infersim.base.units import round_up
from infersim.serve.settings import SchedulerSettings
from infersim.serve.workload import Request

RESERVATION_MAX_STRETCH = 32  # decode steps skipped at once while requests wait on a decaying reservation


class RequestState:
    """A request's progress inside an instance (mutable; records are made from it at the end)."""

    __slots__ = ("req", "prompt_total", "prompt_done", "generated", "cached", "scheduled_s", "first_token_s",
                 "finish_s", "join_k", "ctx_join", "reserve_join", "finish_k", "kv_charge", "preemptions",
                 "version", "instance", "ready_s", "shared", "client", "path", "found", "host_cached", "load_s")

    def __init__(self, req: Request, ready_s: float | None = None, prefilled: bool = False) -> None:
        self.req = req
        self.prompt_total = req.input_tokens
        self.prompt_done = req.input_tokens if prefilled else 0
        self.generated = 1 if prefilled else 0
        self.cached = 0  # prompt tokens found in the prefix cache at admission
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
        self.shared = 0  # prompt tokens the prefix cache holds for it (not charged to it)
        self.client = -1  # closed loop: the client that sent it
        self.path: list | None = None  # prefix-cache nodes it pins
        self.found: Match | None = None  # what it found in the cache at admission
        self.host_cached = 0  # of `cached`, tokens brought back from the host tier
        self.load_s = 0.0  # host-tier copy its first prefill step waits for


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
    dropped: int = 0  # arrivals that found the queue full
    tokens_emitted: float = 0  # output tokens this instance produced (prefill first tokens + decode tokens)
    itl_sink: Samples | None = None  # inter-token gaps (seconds), weighted by the tokens that saw them

    def itl(self, gap: float, tokens: int) -> None:
        sink = self.itl_sink
        if sink is None:
            return
        values, weights = sink.values, sink.weights
        if values is not None and weights is not None and len(values) < EXACT_LIMIT:
            values.append(gap)  # the samples' own arrays while they are exact (weighted from the start)
            weights.append(tokens)
        else:
            sink.add(gap, tokens)


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
        self.heap: list[tuple[float, int, int, RequestState]] = []
        self.members: list[RequestState] = []  # decode members in admission order (lazy, for preemption)
        self.k: float = 0  # token clock (see module docstring)
        self.step_tokens: float = getattr(coster, "tokens_per_step", 1)  # tokens a decode step gives a request
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
        self.prefix_hit_rate = 0.0
        self.cache: PrefixCache | None = None
        if settings.prefix_cache:
            self.cache = PrefixCache(settings.page_size,
                                     settings.host_kv_tokens // settings.page_size if settings.host_kv_tokens else 0)
        self.intake_s = 0.0  # arrivals up to this time join the next step (overlap: the last step's start)
        self.last_decode_end = 0.0  # end of the last step that gave decode requests a token
        self.new_joiners = 0  # requests that joined decode since that step (their last token: last_join_s)
        self.last_join_s = 0.0
        self.sink: Callable[[RequestState], None] | None = None  # where finished requests go
        self.drop_sink: Callable[[Request], None] | None = None  # where requests left waiting go
        self.max_waiting = 0  # queue bound (0: none)
        self.limit = math.inf  # a caller's later deadline: no step starts at or after it (a send it must see first)
        self.low_water: float = math.inf  # offline: run ahead while this many wait
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
        return round_up(tokens, self.s.page_size)

    def _arrive(self) -> None:
        """Arrivals the next step's scheduling sees join the waiting queue; with `max_waiting`, an
        arrival that finds that many waiting is left waiting (the overload guard)."""
        pending, now = self.pending, self.now
        if not pending or pending[0].ready_s > now:  # nothing arrived yet (the cutoff is never past now)
            return
        waiting, cap, stats = self.waiting, self.max_waiting, self.stats
        cutoff = now if self.idle() else min(now, self.intake_s)
        while pending and pending[0].ready_s <= cutoff:
            r = pending.popleft()
            if cap and len(waiting) >= cap and r.scheduled_s < 0:
                stats.dropped += 1
                if self.drop_sink is not None:
                    self.drop_sink(r.req)
                continue
            stats.inflight_integral += now - r.ready_s
            waiting.append(r)

    # -- admission -----------------------------------------------------------------------------

    def _admit(self) -> None:
        s = self.s
        waiting = self.waiting
        if not waiting or s.max_running and len(self.prefilling) + self.n_dec >= s.max_running:
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
            req = r.req
            if prefilled or not (s.prefix_cache and (req.segments or req.prefix_id or self.prefix_hit_rate)):
                cached, found, pin_tokens = 0, None, 0
            else:
                cached, found, pin_tokens = self._lookup(r)
            charge = self._charge(r, cached, pin_tokens)
            if charge is None:
                return
            waiting.popleft()
            self._take(r, cached, found, charge)
            if not prefilled:
                pending_tokens += r.prompt_total - cached

    def _lookup(self, r: RequestState) -> tuple[int, Match | None, int]:
        """(prompt tokens found in the prefix cache, the cache's match, tokens pinning it adds to the pool)."""
        s = self.s
        if not s.prefix_cache:
            return 0, None, 0
        segments = _segments(r.req)
        if segments and self.cache is not None:
            found = self.cache.match(segments, r.prompt_total)
            block = self.cache.block
            return (found.gpu_blocks + found.host_blocks) * block, found, _pin_tokens(found, block)
        if self.prefix_hit_rate and r.preemptions == 0:
            cached = int(self.prefix_hit_rate * r.req.input_tokens)
            return min(cached // s.page_size * s.page_size, r.prompt_total - 1), None, 0
        return 0, None, 0

    def _charge(self, r: RequestState, cached: int, pin_tokens: int) -> float | None:
        """KV pages admitting r takes (None: they are not free now)."""
        s = self.s
        remaining_out = r.req.output_tokens - r.generated
        if s.admission == "reserve-full":
            charge = float(self._pages(r.prompt_total - cached + remaining_out))
            need = self.kv_fixed + charge + pin_tokens
        else:
            charge = float(r.prompt_total - cached) + self.slack
            need = self.kv_used() + charge + pin_tokens
            if s.reservation:
                reserve = max(0, self.reserve_base - self.n_dec * self.k) + min(remaining_out, self._reserve_cap)
                need += self.ratio * reserve
        if not (self.n_dec or self.prefilling):  # alone, it runs now or never (SchedulerSettings.fits_alone)
            # a prefill instance holds a prompt until its first token, and hands it on
            s.refuse_unfit(r.req.id, r.req.input_tokens,
                           1 if self.prefill_only and s.admission == "on-demand" else r.req.output_tokens)
            return None if need > s.kv_capacity_tokens and s.admission == "reserve-full" else charge
        return None if need > s.kv_capacity_tokens else charge

    def _take(self, r: RequestState, cached: int, found: Match | None, charge: float) -> None:
        """Admit r (popped from waiting)."""
        prefilled = r.prompt_done >= r.prompt_total
        if r.scheduled_s < 0:
            r.scheduled_s = self.now
        if prefilled:
            self.new_joiners += 1
            self.last_join_s = max(self.last_join_s, r.ready_s)
        r.cached = cached
        r.shared = cached  # cached pages belong to the prefix cache, shared: not charged to this request
        r.kv_charge = charge
        self.kv_fixed += charge
        if found is not None and self.cache is not None:
            self.kv_fixed += self.cache.pin(found, self.now)
            r.path, r.found = found.path, found
            r.host_cached = found.host_blocks * self.cache.block
            r.load_s = r.host_cached * self.s.host_load_s_per_token
        if prefilled:
            self._join_decode(r)
        else:
            r.prompt_done = cached
            self.prefilling.append(r)
        cache = self.cache
        if cache is not None and cache.gpu_blocks > cache.pinned_blocks:
            self._fit_cache()

    def _fit_cache(self) -> None:
        """Evict unpinned cached blocks that no longer fit beside what the pool uses."""
        cache = self.cache
        if cache is None or cache.gpu_blocks <= cache.pinned_blocks:
            return
        free = self.s.kv_capacity_tokens - self.kv_used()
        if cache.evictable_tokens > free:
            cache.fit(free)

    def _cache_prompt(self, r: RequestState) -> None:
        """r's prompt is prefilled: its blocks join the cache, pinned, and leave its own charge."""
        assert self.cache is not None and r.found is not None
        segments = _segments(r.req)
        r.path, moved = self.cache.insert_prompt(r.found, segments, r.req.input_tokens, ("own", r.req.id), self.now)
        r.found = None
        r.kv_charge -= moved
        r.shared += moved

    def _release(self, r: RequestState, with_output: bool) -> None:
        assert self.cache is not None and r.path is not None
        key = (r.req.output_key if r.req.output_key is not None else ("out", r.req.id)) if with_output else None
        self.kv_fixed -= self.cache.release(r.path, key, r.req.output_tokens, self.now)
        r.path = r.found = None

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
            r.generated += int(self.k - r.join_k)
            self._leave_decode(r)
            if r.path is not None:
                self._release(r, with_output=False)
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
        given this instance its next request yet, and a step's length looks ahead to it (an offline
        instance runs on while `low_water` requests wait)."""
        stats = self.stats
        while True:
            self._arrive()
            if wait_for_arrivals and not self.pending and len(self.waiting) < self.low_water:
                return
            if self.idle():
                if not self.pending or self.pending[0].ready_s >= until:
                    return
                self.now = max(self.now, self.pending[0].ready_s)
                self.last_decode_end = self.now
                continue
            horizon = min(until, self.limit)
            if self.now >= horizon:
                return
            self._admit()
            self._step(horizon, on_finish)
            stats.iterations += 1

    def _form_step(self) -> tuple[list[tuple[RequestState, int]], int]:
        """The step's prefill chunks and its decode requests."""
        s = self.s
        chunks: list[tuple[RequestState, int]] = []
        decode = self.n_dec > 0
        if s.mixed:
            chunks = self._take_chunks(s.token_budget - self.n_dec)
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
        return chunks, n

    def _price(self, chunks: list[tuple[RequestState, int]], n: int, until: float) -> tuple[float, int, float]:
        """(seconds of one step, steps in the stretch, joules of one step on one GPU)."""
        if chunks:
            tokens = sum(q for _r, q in chunks)
            weighted = sum(q * (r.prompt_done + q) for r, q in chunks)
            dt, joules = self.coster.cost_energy(n, self.ctx_base + n * self.k, len(chunks), tokens, weighted)
            for r, _q in chunks:
                if r.load_s:  # the host tier's copy of its cached blocks comes first
                    dt += r.load_s
                    r.load_s = 0.0
            return dt, 1, joules
        m = self._stretch_length(n, until)
        dt, joules = self.coster.cost_energy(n, self.ctx_base + n * (self.k + (m - 1) * self.step_tokens / 2),
                                             0, 0, 0.0)
        if until < math.inf:
            m = min(m, max(1, math.ceil((until - self.now) / dt)))
        if not self.waiting and self.pending:
            m = min(m, max(1, math.ceil((self.pending[0].ready_s - self.now) / dt)))
        return dt, m, joules

    def _step(self, until: float, on_finish: Callable[[RequestState], None] | None) -> None:
        stats = self.stats
        chunks, n = self._form_step()
        count_in = len(self.waiting) + len(self.prefilling) + self.n_dec
        dt, m, joules = self._price(chunks, n, until)
        span = dt * m
        growth = n * (m - 1) * self.step_tokens / 2 if self.s.admission == "on-demand" else 0.0
        kv = self.kv_used() + growth
        stats.kv_integral += kv * span
        if kv + growth > stats.kv_peak:
            stats.kv_peak = kv + growth
        stats.inflight_integral += count_in * span
        stats.busy_s += span
        stats.busy_joules += joules * m
        stats.steps += m
        self.now += span
        self.intake_s = self.now - dt if self.s.intake_one_step_ahead else self.now
        if n:
            self._advance_decode(n, m, dt, span, on_finish)
        if chunks:
            self._advance_chunks(chunks, on_finish)
            if not n and not self.n_dec - self.new_joiners:
                self.last_decode_end = self.now

    def _advance_decode(self, n: int, m: int, dt: float, span: float,
                        on_finish: Callable[[RequestState], None] | None) -> None:
        stats = self.stats
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
        stats.tokens_emitted += n * m * self.step_tokens
        self.k += m * self.step_tokens
        if self.s.reservation:
            self.ratio = max(self._min_ratio, self.ratio - m * self._ratio_decay)
        cache = self.cache
        if cache is not None and cache.gpu_blocks > cache.pinned_blocks:
            self._fit_cache()  # the stretch's tokens took their pages before any request left
        heap = self.heap
        while heap and heap[0][0] <= self.k:
            _fk, _seq, version, r = heapq.heappop(heap)
            if version != r.version:
                continue
            r.generated = r.req.output_tokens
            self._leave_decode(r)
            self._finish(r, on_finish)

    def _advance_chunks(self, chunks: list[tuple[RequestState, int]],
                        on_finish: Callable[[RequestState], None] | None) -> None:
        for r, q in chunks:
            r.prompt_done += q
            if r.prompt_done < r.prompt_total:
                continue
            self.prefilling.remove(r)
            if r.found is not None:
                self._cache_prompt(r)
            r.generated += 1
            self.stats.tokens_emitted += 1
            if r.first_token_s < 0:
                r.first_token_s = self.now + self.s.client_lag_s
            if r.generated >= r.req.output_tokens or self.prefill_only:
                self.kv_fixed -= r.kv_charge
                r.kv_charge = 0.0
                self._finish(r, on_finish)
            else:
                self._join_decode(r)
                self.new_joiners += 1
                self.last_join_s = self.now

    def _finish(self, r: RequestState, on_finish: Callable[[RequestState], None] | None) -> None:
        r.finish_s = self.now + self.s.client_lag_s
        if r.path is not None:
            self._release(r, with_output=not self.prefill_only)
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
        e = self.step_tokens
        m = heap[0][0] - self.k if heap else 1
        if e != 1:
            m = math.ceil(m / e - 1e-9)
        if self.s.admission == "on-demand" and n:
            free = self.s.kv_capacity_tokens - self.kv_used()
            m = min(m, int(free // (n * e)) + 1)
        if self.waiting and self.s.reservation and self.ratio > self._min_ratio:
            m = min(m, RESERVATION_MAX_STRETCH)
        return max(1, int(m))


def _pin_tokens(found: Match, block: int) -> int:
    """Tokens pinning `found` adds to the pool: blocks of nodes nobody pins yet, and host blocks
    brought back."""
    return (sum(node.gpu for node in found.path if node.ref == 0) + found.host_blocks) * block


def _segments(req: Request) -> tuple:
    """The request's token identity: its segments, or a trace's shared-prefix id as one segment."""
    if req.segments or not req.prefix_id:
        return req.segments
    return ((("prefix", req.prefix_id), req.prefix_tokens),)
