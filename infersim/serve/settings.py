"""Scheduler settings of one serving-engine instance, from its engine card.

`settings_from_engine` reads the engine card: a per-step token budget (the chunk budget; in mixed
steps decode tokens count against it too), a running-request cap, mixed steps or separate prefill
and decode passes, prefill-first or decode-first, KV admission (reserve-full: a request is admitted
only when pages for its whole prompt + output are free, so nothing is ever evicted; on-demand:
pages are taken as tokens arrive, and when a decode step would run out the most recently admitted
running request is preempted and later recomputed), the page size and the prefix cache. In offline
mode an engine card's `offline_limits` (trtllm's) reproduce its benchmark tool's own
max_batch_size / max_num_tokens heuristic (`offline_limits`). The KV pool is what the engine's
memory policy leaves after the weights (a speculative drafter's weights and cache included).

A host (CPU) tier of the prefix cache (`with_host_tier`) exists only where the engine card says how
the engine enables one (scheduler.host_kv_tier): its capacity is the host memory the run gives the
instance, in tokens at the instance's KV bytes per token (every GPU keeps its own shard, so a token
takes the per-GPU bytes on each of the instance's GPUs), and a token comes back over every GPU's
host link in parallel at the hardware card's PCIe bandwidth x efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from infersim.cards.engine import EngineCard, OfflineLimits
from infersim.cards.engine_scheduler import FutureTokenReservation
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.cards.deployment import Deployment, dp_attention_ranks
from infersim.base.texttable import counted
from infersim.base.errors import InferSimError, NotPossible
from infersim.base.units import dtype_bytes, round_up

if TYPE_CHECKING:
    from infersim.run.memory import MemoryResult


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
    host_kv_tokens: int = 0  # host (CPU) tier of the prefix cache, tokens (0: none)
    host_load_s_per_token: float = 0.0  # seconds to bring one cached token back from the host tier
    # an overlap (async) scheduler forms step k+1 while step k runs, so a request arriving during
    # step k is first scheduled into step k+2 (engine card overheads.overlap_scheduler): vLLM 0.15
    # v1/engine/core.py step_with_batch_queue (async scheduling, a batch queue of two steps: it
    # schedules and enqueues the next step before it blocks on the running one); SGLang 0.5.5
    # managers/scheduler.py event_loop_overlap (it launches the next batch, then waits on the last)
    intake_one_step_ahead: bool = False
    client_lag_s: float = 0.0  # the API server's time outside the engine core: every token reaches the client later
    # the engine derives max_running from its KV pool by itself (SGLang): a launch need not set it
    cap_derived_by_engine: bool = False

    @property
    def rank_pool_tokens(self) -> int:
        """One attention-DP rank's share of the pool, in the whole pages it is allocated in: what one
        scheduler holds a request to (0: it holds nothing)."""
        return rank_pool(self.kv_capacity_tokens, self.dp_ranks, self.page_size)

    def peak_kv_tokens(self, tokens: int) -> float:
        """KV the scheduler holds for a request of `tokens` (prompt + output) running alone, at its
        largest: reserve-full reserves whole pages for all of them at admission; on-demand holds the
        context before its last decode step (tokens - 1) and the mean slack of a part-filled page,
        as infersim.serve.scheduler charges them."""
        if self.admission == "reserve-full":
            return float(round_up(tokens, self.page_size))
        return tokens - 1 + (self.page_size - 1) / 2

    def fits_alone(self, tokens: int) -> bool:
        """Does a request of `tokens` (prompt + output) fit the KV pool with nothing else running? The
        one rule for rejecting a request on arrival and for refusing one the scheduler cannot run."""
        return self.peak_kv_tokens(tokens) <= self.kv_capacity_tokens

    def refuse_unfit(self, request: int, input_tokens: int, output_tokens: int) -> None:
        """NotPossible for a request that does not fit alone (fits_alone)."""
        tokens = input_tokens + output_tokens
        if not self.fits_alone(tokens):
            peak = self.peak_kv_tokens(tokens)
            # a request holds a prompt token and an output token at least
            longest = self.longest_request_tokens()
            holds = f"the longest request it runs holds {longest:,} tokens" if longest >= 2 else "it holds no request"
            raise NotPossible(f"request {request}: {input_tokens:,} + {output_tokens:,} tokens do not fit in the "
                              f"instance's KV cache of {counted(self.kv_capacity_tokens, 'token')}: alone they need "
                              f"{int(peak):,}{'.5' if peak % 1 else ''} ({self.admission} in pages of {self.page_size}); "
                              + holds)

    def longest_request_tokens(self) -> int:
        """The most tokens (prompt + output) a request that fits alone holds (fits_alone)."""
        if self.admission == "reserve-full":
            return self.kv_capacity_tokens // self.page_size * self.page_size
        return int(math.floor(self.kv_capacity_tokens + 1 - (self.page_size - 1) / 2))

    def describe(self) -> str:
        cap = str(self.max_running) if self.max_running else "KV-bound"
        return (f"token budget {self.token_budget} per step ({'chunked' if self.chunked else 'whole prompts'}), "
                f"running cap {cap}, {'mixed steps' if self.mixed else 'separate prefill and decode passes'}, "
                f"{self.policy}, KV {self.admission} in pages of {self.page_size}, "
                f"prefix cache {'on' if self.prefix_cache else 'off'}, KV pool {self.kv_capacity_tokens:,} tokens"
                + (f", host KV tier {self.host_kv_tokens:,} tokens" if self.host_kv_tokens else "")
                + f" ({self.origin})")


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


@dataclass(frozen=True)
class GivenLimits:
    """What a run gives one instance in place of its engine card's: a running cap, a per-step token
    budget and a KV pool (a measured one), tokens; and the context length the server takes
    (max_model_len; None: the model's max_position_embeddings)."""

    max_running: int | None = None
    token_budget: int | None = None
    pool_tokens: int | None = None
    context_tokens: int | None = None


def settings_from_engine(config: RunConfig, mean_isl: float, mean_osl: float, offline: bool,
                         prefix_cache: bool | None = None, prefill_only: bool = False,
                         given: GivenLimits = GivenLimits()) -> SchedulerSettings:
    """Scheduler settings of one instance of `config`'s deployment under its engine card, with what
    the run `given` in place of the card's."""
    from infersim.cards.deployment import Workload
    from infersim.run.memory import memory_budget
    from infersim.run.speculative import drafter_memory

    engine: EngineCard = config.engine
    dep, hw = config.deployment, config.hardware
    if dep.pp > 1:
        raise InferSimError("serve: pipeline parallelism (deployment.pp > 1) is not modelled by the serving "
                            "simulator; use pp: 1 (replicas model data parallelism)")
    sched = engine.scheduler
    dp = dep.attention.dp
    hbm = hw.peak.hbm_bytes
    per_gpu = engine.chunk_tokens(hbm, dp_attention_ranks(dep))  # per attention-DP rank
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
    memory = memory_budget(config.model, hw, dep, workload, drafter_memory(config), engine, max(1, step_tokens))
    states = memory.state_pool
    if states is not None and (memory.kv_capacity_bytes <= 0 < memory.kv_capacity_bytes + states.held_bytes_per_gpu
                               or states.requests < 1):
        from infersim.run.simulate import state_pool_problem

        raise NotPossible(f"does not fit: {state_pool_problem(config, memory)}")
    if memory.kv_capacity_bytes <= 0:
        raise NotPossible(f"does not fit: {config.model.name}'s weights need {memory.weights_bytes / 1e9:.2f} GB per GPU "
                          f"of {hbm / 1e9:.2f} GB, {memory.reserved_bytes / 1e9:.2f} GB of it reserved by {engine.name}")
    # the pool is counted in tokens of the cache that grows with the context; the bounded cache
    # (sliding-window KV up to the window, recurrent state) of a mean-length request is spread over
    # its tokens, so a request of mean length is charged its whole footprint (Llama-4's chunked
    # layers hold every token of a 2k-token request: 3 of its 4 layers); it is allocated in whole
    # pages (vLLM's blocks: num_gpu_blocks x block_size tokens)
    page = engine.page_size(hw, config.model.is_mla)
    pool = memory.pool_tokens(page)
    if pool == 0:
        raise NotPossible(f"does not fit: the KV cache space {engine.name} leaves per GPU, "
                          f"{memory.kv_capacity_bytes:,.0f} bytes, holds no whole page of {counted(page, 'token')} "
                          f"({memory.pool_token_bytes_per_gpu * page:,.0f} bytes): its KV pool holds no request")
    capacity = pool * dp if pool is not None else 1 << 40
    derived = sched.running_cap_from_pool is not None and not (offline and engine.offline_limits is not None)
    prefix_on, why = prefix_cache_on(prefix_cache, engine, config.model)
    origin += why
    settings = SchedulerSettings(
        token_budget=budget, max_running=cap, mixed=sched.mixed_batches and not prefill_only, policy=sched.policy,
        admission=sched.kv_admission, page_size=page, chunked=chunked,
        prefix_cache=prefix_on, kv_capacity_tokens=capacity,
        reservation=sched.future_reservation if sched.kv_admission == "on-demand" else None, origin=origin,
        max_chunk=per_gpu if chunked and dp > 1 and per_gpu else 0, dp_ranks=dp,
        intake_one_step_ahead=engine.overheads.overlap_scheduler,
        client_lag_s=0.0 if prefill_only else engine.overheads.api_server_latency, cap_derived_by_engine=derived)
    return _state_capped(_with_given(settings, config, given), memory)


def prefix_cache_on(asked: bool | None, engine: EngineCard, model: ModelCard) -> tuple[bool, str]:
    """(whether the prefix cache is on, what is said of it): as the run asks, else as the engine card
    has it; for a model with recurrent layers, as the card's scheduler.recurrent_prefix_cache rule
    has it (an engine that keeps it off for such a model unless asked, or whatever is asked)."""
    rule = engine.scheduler.recurrent_prefix_cache
    if rule == "default" or not model.recurrent_kinds:
        return engine.scheduler.prefix_cache if asked is None else asked, ""
    name = f"{engine.name} {engine.version}"
    if rule == "never":
        said = f"; prefix cache off: {name} turns it off for a model with recurrent layers, whatever asks for it"
        return False, said if asked or (asked is None and engine.scheduler.prefix_cache) else ""
    if asked is None:
        said = f"; prefix cache off: {name} keeps it off for a model with recurrent layers unless turned on"
        return False, said if engine.scheduler.prefix_cache else ""
    return asked, ""


def _state_capped(settings: SchedulerSettings, memory: MemoryResult) -> SchedulerSettings:
    """`settings` with the running cap the engine's pool of recurrent-state slots sets, where it is
    below the cap it has (the engine caps even a given one so, and derives it by itself)."""
    pool = memory.state_pool
    if pool is None:
        return settings
    cap = pool.requests * settings.dp_ranks
    if settings.max_running and settings.max_running <= cap:
        return settings
    return replace(settings, max_running=cap, cap_derived_by_engine=True,
                   origin=settings.origin + f"; running cap {cap:,} from its recurrent-state pool "
                                            f"({counted(pool.requests, 'request')} per scheduler)")


def _with_given(settings: SchedulerSettings, config: RunConfig, given: GivenLimits) -> SchedulerSettings:
    """`settings` with what the run gives, each said in the origin; an engine that derives its running
    cap from its pool (SGLang) derives it here, once, from the final pool and context."""
    if given.max_running:
        settings = replace(settings, max_running=given.max_running, cap_derived_by_engine=False,
                           origin=settings.origin + f"; running cap {given.max_running} given")
    if given.token_budget:
        settings = replace(settings, token_budget=given.token_budget,
                           origin=settings.origin + f"; token budget {given.token_budget} given")
    if given.pool_tokens:
        held = _whole_pages(given.pool_tokens, settings)
        if held == 0:  # as a pool the engine derives: one of no whole page runs nothing
            raise NotPossible(f"does not fit: the KV pool given (kv_capacity_tokens {given.pool_tokens:,}) holds no "
                              f"whole page of {counted(settings.page_size, 'token')}{_on_ranks(settings)}: it holds "
                              "no request")
        settings = replace(settings, kv_capacity_tokens=held,
                           origin=settings.origin + _given_pool_said(given.pool_tokens, held, settings))
    if settings.cap_derived_by_engine:
        settings = replace(settings, max_running=derived_running_cap(config, settings.kv_capacity_tokens,
                                                                     given.context_tokens))
    return settings


def rank_pool(tokens: int, dp_ranks: int, page: int) -> int:
    """One attention-DP rank's share of an instance's pool of `tokens`, in whole pages of `page` (an
    engine allocates its pool in pages: SGLang rounds --max-total-tokens down to its page size, vLLM
    counts num_gpu_blocks), as the pool an engine derives itself (MemoryResult.pool_tokens)."""
    return tokens // dp_ranks // page * page


def _whole_pages(tokens: int, settings: SchedulerSettings) -> int:
    """An instance's pool of `tokens` as its schedulers hold it: each rank's whole pages (rank_pool)."""
    return rank_pool(tokens, settings.dp_ranks, settings.page_size) * settings.dp_ranks


def _given_pool_said(tokens: int, held: int, settings: SchedulerSettings) -> str:
    if held == tokens:
        return f"; KV pool {tokens:,} tokens given"
    return (f"; KV pool {tokens:,} tokens given, held as {counted(held, 'token')} "
            f"(whole pages of {settings.page_size}{_on_ranks(settings)})")


def _on_ranks(settings: SchedulerSettings) -> str:
    return f" on each of {settings.dp_ranks} attention-DP ranks" if settings.dp_ranks > 1 else ""


def derived_running_cap(config: RunConfig, pool_tokens: int, context_tokens: int | None = None) -> int:
    """The running-request cap of an instance whose KV pool holds `pool_tokens` tokens, where the
    engine derives it from its pool (SGLang): per scheduler, i.e. per attention-DP rank, from that
    rank's share of the pool; its context is the model's unless a max_model_len (SGLang's
    --context-length) gives `context_tokens`."""
    dp = config.deployment.attention.dp
    hbm = config.hardware.peak.hbm_bytes
    context = context_tokens or config.model.max_position_embeddings
    return config.engine.running_cap(hbm, pool_tokens // dp, context) * dp


def with_host_tier(settings: SchedulerSettings, config: RunConfig, host_bytes: float = 0.0,
                   host_tokens: int = 0) -> SchedulerSettings:
    """`settings` with a host (CPU) tier of `host_bytes` of host memory per instance, or of
    `host_tokens` tokens (see module docstring)."""
    from infersim.run.memory import cache_view, kv_bytes_per_token

    if host_bytes <= 0 and host_tokens <= 0:
        return settings
    if host_bytes > 0 and host_tokens > 0:
        raise InferSimError("give the host KV tier as host_kv_bytes or as host_kv_tokens, not both")
    engine = config.engine
    tier = engine.scheduler.host_kv_tier
    if not tier:
        raise InferSimError(f"host KV tier: engine {engine.name} {engine.version} has no host (CPU) tier of its "
                            "prefix cache (its card's scheduler.host_kv_tier is not set)")
    if not settings.prefix_cache:
        raise InferSimError("host KV tier: it holds what the prefix cache evicts; the prefix cache is off")
    dep, hw = config.deployment, config.hardware
    per_gpu = kv_bytes_per_token(cache_view(config.model, engine), dep.precision.kv_cache, dep.attention.tp) / dep.pp
    if per_gpu <= 0:
        raise InferSimError(f"host KV tier: {config.model.name} keeps no per-token KV cache to offload")
    tokens = host_tokens or int(host_bytes / (per_gpu * dep.gpus_per_stage * dep.pp))
    size = f"{host_bytes / 1e9:,.3g} GB" if host_bytes else f"{tokens:,} tokens"
    seconds = per_gpu / (hw.peak.pcie_bandwidth * hw.derates.pcie_efficiency)
    return replace(settings, host_kv_tokens=tokens, host_load_s_per_token=seconds,
                   origin=settings.origin + f"; host KV tier {size} ({tier})")
