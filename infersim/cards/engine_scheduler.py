"""The scheduler and memory sections of an engine card: values an engine picks by GPU memory
(tiers), how it batches and admits work, caps running requests and divides GPU memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infersim.cards.schema import spec
from infersim.base.errors import ConfigError
from infersim.base.units import round_up


@dataclass(frozen=True, kw_only=True)
class MemoryTier:
    """One tier of a value an engine chooses by GPU memory: `value` from `min_gpu_bytes` of HBM up."""

    min_gpu_bytes: float = spec(doc="the value applies to GPUs with at least this much HBM, bytes", ge=0)
    value: float = spec(doc="the value for those GPUs", ge=0)
    min_tp: int = spec(1, doc="... and to engines of at least this TP size (attention TP x attention DP, SGLang's "
                              "tp_size; SGLang picks its CUDA-graph limit by it too)", gt=0)


def tier_value(tiers: tuple[MemoryTier, ...], hbm_bytes: float, tp: int = 1) -> float:
    """The value of the largest tier (by min_gpu_bytes, then min_tp) whose floors the GPU's HBM and
    the engine's TP size `tp` reach."""
    chosen = [t for t in tiers if t.min_gpu_bytes <= hbm_bytes and t.min_tp <= tp]
    return max(chosen, key=lambda t: (t.min_gpu_bytes, t.min_tp)).value if chosen else 0.0


@dataclass(frozen=True, kw_only=True)
class FutureTokenReservation:
    """KV an on-demand scheduler holds back for running requests' future tokens (SGLang's
    new_token_ratio): per request min(remaining output, cap_tokens) x ratio, the ratio decaying
    linearly from initial_ratio to initial_ratio x final_fraction over decay_steps decode steps and
    jumping back after a retraction."""

    initial_ratio: float = spec(doc="ratio at start and after a retraction", gt=0, le=1)
    final_fraction: float = spec(doc="the ratio decays to this fraction of initial_ratio", gt=0, le=1)
    decay_steps: int = spec(doc="decode steps over which the ratio decays", gt=0)
    cap_tokens: int = spec(doc="at most this many future tokens are reserved per running request", gt=0)


@dataclass(frozen=True, kw_only=True)
class RunningCapFromPool:
    """A running-request cap an engine derives from its KV pool and the model's context length
    (SGLang's max_num_reqs), per scheduler (an attention-DP rank's TP group):
    min(clamp(pool / context x requests_per_context, min_requests, max_requests), pool / pool_tokens_per_request)."""

    requests_per_context: int = spec(doc="requests allowed per context length of KV pool, before the clamp", gt=0)
    min_requests: int = spec(doc="the clamp's lower end", gt=0)
    max_requests: int = spec(doc="the clamp's upper end", gt=0)
    pool_tokens_per_request: int = spec(doc="the cap never exceeds the pool's tokens divided by this", gt=0)
    unstated_context_tokens: int = spec(
        doc="context length the engine assumes when the model's config states none, tokens", gt=0)

    def cap(self, pool_tokens: int, context_tokens: int) -> int:
        """Running requests one scheduler admits with a pool of `pool_tokens` for a model whose
        context is `context_tokens` (0: not stated)."""
        context = context_tokens or self.unstated_context_tokens
        clamped = min(max(pool_tokens * self.requests_per_context // context, self.min_requests), self.max_requests)
        return max(1, min(clamped, pool_tokens // self.pool_tokens_per_request))


@dataclass(frozen=True, kw_only=True)
class EmptyPoolFit:
    """An output cut so that the request fits the KV pool with nothing else in it (SGLang 0.5.23's
    max_new_tokens_for_memory): at a pool of P tokens in pages of G tokens, output <= P - the prompt
    rounded up to whole pages - pages_free x G - tokens_free."""

    pages_free: int = spec(doc="whole pages of the pool the request leaves free beside its prompt's pages and output",
                           ge=0, le=1 << 20)
    tokens_free: int = spec(doc="... and tokens it leaves free besides", ge=0, le=1 << 20)


@dataclass(frozen=True, kw_only=True)
class KvPoolLimit:
    """How the engine's scheduler holds one request to its KV pool (P tokens per scheduler: SGLang's
    max_total_num_tokens), whatever the context length: `margins` applies the context rule's
    prompt_margin and output_margin at P too (a prompt of P - prompt_margin tokens or more is
    refused, the output cut to P - output_margin - prompt: SGLang's max_req_len = min(context_len,
    P) - 1); `empty_pool_fit` cuts the output to what an empty pool holds beside the prompt."""

    margins: bool = spec(doc="the context rule's prompt_margin and output_margin hold at the KV pool's size too (the "
                             "scheduler's longest request is the smaller of the context and the pool)")
    empty_pool_fit: EmptyPoolFit | None = spec(
        None, doc="the output is cut so that the request fits the empty KV pool in whole pages (none: no such cut)")


@dataclass(frozen=True, kw_only=True)
class ContextLimit:
    """What the engine's server does with a request (prompt + output tokens) longer than its context
    length: the model's max_position_embeddings unless the server is given another (vLLM
    --max-model-len, SGLang --context-length, TensorRT-LLM --max_seq_len). The rule, at a context of
    C tokens, for a request of P prompt and O output tokens:
      refused  where P >= C - prompt_margin, or O > C (refuses_long_output), or, with beyond
               refuse, P + O > C - reserved_tokens;
      else it runs with min(O, C - output_margin - P) output tokens.
    beyond run: every request runs as asked."""

    beyond: Literal["refuse", "shorten_output", "run"] = spec(
        doc="refuse: a request whose prompt + output is above the context is refused whole; shorten_output: "
            "only a prompt that leaves no room is refused, a longer request runs with its output cut to what fits; "
            "run: the engine runs every request, past the model's context too")
    reserved_tokens: int = spec(
        0, doc="beyond refuse: a request is refused where prompt + output is above the context less this many "
               "tokens (1: refused at prompt + output >= the context)", ge=0, le=1 << 20)
    output_margin: int = spec(
        0, doc="the engine cuts a request's output so that prompt + output stays this many tokens below the context "
               "(0: up to the context)", ge=0, le=1 << 20)
    prompt_margin: int = spec(
        0, doc="a prompt of the context less this many tokens or more is refused (0: a prompt must leave room for "
               "one output token)", ge=0, le=1 << 20)
    refuses_long_output: bool = spec(
        False, doc="a request asking for more output tokens than the context is refused, whatever its prompt")
    override: str | None = spec(
        None, doc="the environment setting (VARIABLE=VALUE) without which the server refuses to start with a "
                  "context length above the model's max_position_embeddings (none: not known to the card)")
    kv_pool: KvPoolLimit | None = spec(
        None, doc="how the engine's scheduler holds a request to its KV pool besides the context (none: it does not; "
                  "a request the pool cannot hold alone is then not served)")

    def output_run(self, context: int, prompt: int, output: int) -> int:
        """Output tokens the engine runs of a request of `prompt` + `output` tokens at a context of
        `context` tokens (0: none stated, the request runs as asked); 0 where it refuses the request."""
        if not context or self.beyond == "run":
            return output
        if self.refusal(context, prompt, output):
            return 0
        return min(output, context - self.output_margin - prompt)

    def refusal(self, context: int, prompt: int, output: int) -> str:
        """What the engine refuses that a request of `prompt` + `output` tokens is, at a context of
        `context` tokens ("" where it takes the request), e.g. "a prompt of 4,090 tokens or more"."""
        if not context or self.beyond == "run":
            return ""
        if prompt >= context - self.prompt_margin:
            return f"a prompt of {context - self.prompt_margin:,} tokens or more"
        if self.refuses_long_output and output > context:
            return f"more than {context:,} output tokens, whatever the prompt"
        if self.beyond == "refuse" and prompt + output > context - self.reserved_tokens:
            return f"prompt + output above {context - self.reserved_tokens:,} tokens"
        return ""

    def pool_output(self, pool: int | None, page: int, prompt: int, output: int) -> int:
        """Output tokens the engine's scheduler runs of a request of `prompt` + `output` tokens (its
        output already cut to the context) with a KV pool of `pool` tokens per scheduler in pages of
        `page` tokens (kv_pool; None: no pool known, the request runs as asked; 0: a pool that holds
        nothing); 0 where it refuses the request (or leaves it no output token)."""
        limit = self.kv_pool
        if limit is None or pool is None:
            return output
        if limit.margins:
            if prompt >= pool - self.prompt_margin:
                return 0
            output = min(output, pool - self.output_margin - prompt)
        fit = limit.empty_pool_fit
        if fit is not None:
            output = min(output, pool - round_up(prompt, page) - fit.pages_free * page - fit.tokens_free)
        return max(0, output)

    def pool_runs_whole(self, pool: int, page: int) -> int:
        """The most tokens (prompt + output, at least one output token) a request may hold for the
        scheduler to run it as asked at a KV pool of `pool` tokens in pages of `page` tokens: below
        the prompt margin, the output margin and, for an empty-pool fit, the pages kept free and a
        prompt's last page rounded up (pool_output leaves such a request whole)."""
        limit = self.kv_pool
        assert limit is not None
        whole = pool
        if limit.margins:
            whole = min(whole, pool - self.prompt_margin, pool - self.output_margin)
        fit = limit.empty_pool_fit
        if fit is not None:
            whole = min(whole, pool - fit.pages_free * page - fit.tokens_free - (page - 1))
        return whole

    def pool_prompt_limit(self, pool: int, page: int) -> int:
        """The shortest prompt the scheduler refuses, or leaves no output token, at a KV pool of
        `pool` tokens in pages of `page` tokens (pool_output)."""
        limit = self.kv_pool
        assert limit is not None
        shortest = [pool - max(self.prompt_margin, self.output_margin)] if limit.margins else []
        fit = limit.empty_pool_fit
        if fit is not None:  # no output where the prompt's whole pages reach the pool less what is kept free
            free = pool - fit.pages_free * page - fit.tokens_free
            shortest.append(round_up(free, page) - page + 1 if free > 0 else 0)
        return max(0, min(shortest))

    def pool_for(self, page: int, prompt: int, output: int) -> int:
        """The smallest KV pool (tokens, whole pages of `page`) at which the scheduler runs a request of
        `prompt` + `output` tokens as asked (pool_output; what a weight offload leaves the pool);
        prompt + output where kv_pool holds none to it."""
        limit = self.kv_pool
        if limit is None:
            return prompt + output
        need = prompt + output
        if limit.margins:
            need = max(need + self.output_margin, prompt + self.prompt_margin + 1)
        fit = limit.empty_pool_fit
        if fit is not None:
            need = max(need, round_up(prompt, page) + fit.pages_free * page + fit.tokens_free + output)
        return round_up(need, page)

    def server_context(self, max_model_len: int) -> int:
        """The context length a server given `max_model_len` runs at so that a request of
        max_model_len tokens runs whole: max_model_len plus what the engine keeps free (the value
        --emit-launch gives the engine's context flag, and serve's admission)."""
        return max_model_len + self.kept_free()

    def kept_free(self) -> int:
        """Tokens of the context that a request run whole leaves unused: the longest request the
        engine runs whole at a context of C tokens holds C - kept_free() (prompts within
        prompt_margin of C aside)."""
        return max(self.reserved_tokens, self.output_margin) if self.beyond != "run" else 0


@dataclass(frozen=True, kw_only=True)
class Scheduler:
    """How the engine batches and admits work: chunk budget, running-request cap, KV admission."""

    chunked_prefill_tokens: tuple[MemoryTier, ...] = spec(
        doc="prompt tokens one step processes per GPU (the chunk budget; longer prompts run as several "
            "chunks), by GPU memory; 0 = no chunking (a whole prompt per step)")
    chunk_divided_by_attention_dp: bool = spec(
        False, doc="the budget is for the whole DP-attention group and divided by its DP size (SGLang)")
    max_running_requests: tuple[MemoryTier, ...] = spec(
        default_factory=tuple, doc="cap on concurrently running requests per engine instance, by GPU memory "
                                   "(0 or absent = bounded by the KV cache only)")
    running_cap_from_pool: RunningCapFromPool | None = spec(
        None, doc="a further cap on running requests that the engine derives from its KV pool and the model's "
                  "context length (SGLang); none: no such cap")
    running_cap_flag: str | None = spec(
        None, doc="the server's command-line flag that sets the running-request cap (what a batch above "
                  "max_running_requests or running_cap_from_pool needs, e.g. --max-num-seqs); none: the engine has no "
                  "such flag, or no server")
    mixed_batches: bool = spec(doc="prefill chunks and decode requests share one forward pass")
    policy: Literal["prefill-first", "decode-first"] = spec(
        doc="which work a step takes first when both wait")
    kv_admission: Literal["reserve-full", "on-demand"] = spec(
        doc="reserve-full: a request is admitted only if its whole ISL + OSL KV fits (never evicted); "
            "on-demand: blocks are taken as tokens arrive and running requests are preempted when they run out")
    page_size: int = spec(doc="KV-cache page (block) size, tokens", gt=0)
    prefix_cache: bool = spec(doc="prefix (radix / block) cache on by default")
    recurrent_prefix_cache: Literal["default", "opt-in", "never"] = spec(
        "default", doc="the prefix cache of a model with recurrent (linear-attention, Mamba) layers: default, as "
                       "prefix_cache; opt-in, off unless a run turns it on; never, off whatever a run asks")
    future_reservation: FutureTokenReservation | None = spec(
        None, doc="on-demand admission: KV held back for running requests' future tokens (none = no reservation)")
    host_kv_tier: str | None = spec(
        None, doc="how a server enables a host-memory (CPU) tier of the prefix cache, which holds what the GPU "
                  "cache evicts (none: the engine has no such tier); off unless a run gives it host memory")


@dataclass(frozen=True, kw_only=True)
class RecurrentStatePool:
    """How the engine holds the recurrent and conv states of a hybrid linear-attention or Mamba model:
    a pool of state slots per scheduler, set aside from the KV space before the KV pool is sized."""

    memory_ratio: float = spec(
        0.0, doc="the slots take ratio / (1 + ratio) of the KV space (SGLang's mamba_full_memory_ratio); 0: a "
                 "fixed number of slots (slots)", ge=0)
    slots: int = spec(0, doc="state slots of a server, split over its attention-DP schedulers and set aside whatever "
                             "the memory (0: by memory_ratio)", ge=0)
    slots_per_request: int = spec(
        1, doc="slots a running request holds (its own, and those the prefix cache keeps tracking it): a scheduler "
               "runs at most slots / slots_per_request requests", gt=0)
    padding_slots: int = spec(0, doc="slots of the pool no request holds (the pool's padding slot)", ge=0)


@dataclass(frozen=True, kw_only=True)
class MemoryPolicy:
    """How the engine divides GPU memory between weights, reserves, activations and the KV cache."""

    gpu_memory_utilization: float = spec(
        doc="share of HBM the engine uses at all (weights, KV, activations, graphs)", gt=0, le=1)
    reserved_bytes: float = spec(doc="fixed memory outside weights and KV: CUDA context, NCCL buffers, graphs, bytes", ge=0)
    reserved_per_chunk_token_bytes: float = spec(
        0.0, doc="activation memory the engine reserves per token of its chunk budget, bytes (0 = use the "
                 "model's own activation estimate)", ge=0)
    reserved_min_bytes: tuple[MemoryTier, ...] = spec(
        default_factory=tuple, doc="the engine never reserves less than this outside weights and KV, by GPU memory, bytes")
    kv_fraction_of_free: float = spec(
        1.0, doc="share of the memory left after weights, activations and reserve that becomes KV cache", gt=0, le=1)
    logged_kv_cache_size: Literal["none", "pool", "max_model_len_requests", "max_total_num_tokens",
                                  "max_tokens_in_paged_kv_cache"] = spec(
        "none", doc="the KV cache size the engine logs as it starts: pool: its blocks over its layer groups, in "
                    "tokens (vLLM 0.11, 0.15 \"GPU KV cache size: N tokens\": run.memory.reported_pool_tokens); "
                    "max_model_len_requests: the tokens of as many max_model_len-token requests as the pool holds "
                    "(vLLM 0.33, the same line: run.memory.capacity_at_max_model_len); max_total_num_tokens: the "
                    "tokens of its KV pool on one GPU in whole pages, a hybrid pool's in tokens of its "
                    "full-attention layers (SGLang's scheduler line \"max_total_num_tokens=N\"); "
                    "max_tokens_in_paged_kv_cache: the blocks of its primary pool in tokens, for models of "
                    "full-attention layers (TensorRT-LLM's \"Allocated X GiB for max tokens in paged KV cache "
                    "(N)\"); none: no such count")
    hybrid_group_of_larger_below: float | None = spec(
        None, doc="a model with layers of two attention kinds (full and sliding-window or chunked): the engine's "
                  "hybrid KV allocator puts each kind's layers in groups of the smaller kind's layer count, or of "
                  "the larger kind's where it is under this many times the smaller, the last group of a kind "
                  "padded with empty layers (vLLM); null: always the smaller kind's count", gt=1)
    activations_of_whole_budget: bool = spec(
        False, doc="the engine sizes its KV space after profiling a step of its whole token budget "
                   "(chunked_prefill_tokens), whatever the workload; false: the activations of the run's own "
                   "prefill step")
    sliding_window_pool_ratio: float = spec(
        0.0, doc="a model with both full-attention and sliding-window layers: the KV pool is sized in tokens of the "
                 "full-attention layers, each allotted this many tokens of the sliding-window layers' KV beside it, "
                 "used or not (SGLang's hybrid SWA pool, swa_full_tokens_ratio); 0: sliding-window layers take the "
                 "KV of the tokens in their window alone (vLLM's hybrid allocator)", ge=0, le=1)
    chunked_layers_keep_context: bool = spec(
        False, doc="a model with chunked-attention layers (Llama-4): the engine keeps every token of the context "
                   "on them, as on full-attention layers (vLLM 0.11 turns its hybrid KV cache manager off for them, "
                   "SGLang 0.5.2 leaves Llama-4 out of its hybrid pool); false: at most one chunk per layer")
    loads_encoder: bool | None = spec(
        None, doc="the engine loads a multimodal checkpoint's encoder (model card encoder_params) into GPU memory "
                  "beside the language model, split over the attention-TP group; false: it serves the language "
                  "model alone; null: not known (the encoder's weights are then not counted, and a run says so)")
    encoder_off_for: tuple[str, ...] = spec(
        default_factory=tuple, doc="checkpoint architectures (model card encoder_architecture) whose encoder the "
                                   "engine leaves unloaded unless asked, though it loads other checkpoints' "
                                   "(SGLang's multimodal-off list)")
    recurrent_state_pool: RecurrentStatePool | None = spec(
        None, doc="a hybrid linear-attention or Mamba model: the pool of state slots the engine sets aside "
                  "(none: each running request's states share the KV space with the KV cache)")


def validate_memory_policy(memory: MemoryPolicy, source: str) -> None:
    """The memory section's values that only make sense together."""
    rule = memory.recurrent_state_pool
    if rule is not None and (rule.memory_ratio > 0) == (rule.slots > 0):
        raise ConfigError(source, "memory.recurrent_state_pool", {"memory_ratio": rule.memory_ratio,
                                                                  "slots": rule.slots},
                          "give the slots either as a share of the memory (memory_ratio) or as a number (slots)")
