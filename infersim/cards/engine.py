"""Engine cards: what the serving software does, apart from the chip it runs on.

A hardware card holds facts about the GPU and its links; an engine card holds the scheduler facts
of a serving engine (SGLang, vLLM, TensorRT-LLM) at a version: how its per-step overhead arises,
its chunked-prefill token budget, its running-request cap, how much GPU memory it gives the KV
cache, its KV page size and its default MoE communication. Values that the engines pick by GPU
memory are tiers (`min_gpu_bytes` -> value; the largest tier not above the GPU's HBM applies; the
CUDA-graph limit may also depend on the TP size, `min_tp`).

Batch limits are the engine's own: a scheduler batches the requests of one attention-TP group
(all its GPUs step together on the same requests), so the CUDA-graph limit and padding and the
per-request CPU work count that group's requests, not a GPU's share of them.

How overhead arises (see `step_overhead`):
  cpu  = step_cpu + request_cpu x requests in the step + launch_cpu x kernels launched eagerly
  exposed = step_fixed + (max(0, cpu - gpu time) with an overlap scheduler, else cpu)
Kernels are launched eagerly unless the step is CUDA-graph captured (decode up to the graph batch
limit when decode graphs are on; prefill when prefill graphs are on). Launches are asynchronous,
so without an overlap scheduler the launch part still overlaps the GPU; it is charged only past
the GPU time. Where the step's kernels are known in launch order (`launch_queue_seconds`) that
overlap is the launch queue's: one host thread launches the kernels launch_cpu apart and the GPU
runs them in launch order, each once it is launched and its predecessor has finished, so a step
whose small kernels are host-bound and whose large ones GPU-bound (an eager MoE layer: dozens of
routing kernels, then the experts' grouped GEMMs) takes longer than max(GPU time, launches).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from infersim.base.records import cheap_init
from infersim.cards.engine_platform import AttentionBackendChoice, FusionPass, GraphCaptureRule, Vendor
from infersim.cards.engine_scheduler import (ContextLimit, MemoryPolicy, MemoryTier, Scheduler, tier_value,
                                              validate_memory_policy)
from infersim.cards.hardware import HardwareCard
from infersim.cards.schema import spec
from infersim.base.errors import MISSING, ConfigError


@dataclass(frozen=True, kw_only=True)
class CaptureRange:
    """Decode batch sizes an engine captures as CUDA graphs: start..stop (inclusive) every `step`."""

    start: int = spec(doc="first captured decode batch of the range", gt=0)
    stop: int = spec(doc="last captured decode batch of the range (inclusive)", gt=0)
    step: int = spec(1, doc="spacing of captured batches in the range", gt=0)


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Host-side time per step, request and kernel launch, and what the engine's scheduler hides of it."""

    step_fixed: float = spec(
        doc="per-step time on the critical path that no overlap hides (graph replay launch, sampling, "
            "host-device sync), seconds", ge=0)
    step_cpu: float = spec(doc="scheduler CPU time per step (batch building, metadata), seconds", ge=0)
    request_cpu: float = spec(doc="CPU time per request in a step (bookkeeping, stop checks, detokenise), seconds", ge=0)
    launch_cpu: float = spec(doc="CPU time per kernel launched eagerly (not in a CUDA graph), seconds", ge=0)
    api_server_latency: float = spec(
        0.0, doc="time a request spends in the engine's API server outside the engine core (HTTP, tokenisation on "
                 "the way in; detokenisation, streaming on the way out): every token reaches the client this much "
                 "later, seconds (0: not modelled; a calibration profile sets it from measured runs)", ge=0, le=10)
    overlap_scheduler: bool = spec(doc="the CPU prepares step N+1 while the GPU runs step N (CPU work hides "
                                       "behind GPU time)")
    overlap_with_speculative: bool = spec(
        True, doc="the overlap scheduler stays on under speculative decoding (false: a speculative step exposes "
                  "its CPU work, as SGLang turns overlap off for EAGLE/MTP)")
    decode_cuda_graph: bool = spec(doc="decode steps are replayed as CUDA graphs (no per-kernel launch cost)")
    prefill_cuda_graph: bool = spec(False, doc="prefill steps are replayed as CUDA graphs")
    prefill_graph_pieces: bool = spec(
        False, doc="prefill and mixed steps of up to prefill_graph_max_tokens tokens replay captured graph pieces "
                   "between eager graph_break_operations (vLLM's piecewise graphs, SGLang's breakable graphs); "
                   "larger steps launch every kernel")
    prefill_graph_vendors: tuple[Vendor, ...] = spec(
        ("nvidia", "amd"), doc="GPU vendors on which prefill_graph_pieces holds (SGLang captures them on CUDA only)")
    prefill_graph_max_tokens: Literal["decode-graph-limit", "token-budget"] = spec(
        "token-budget", doc="the largest step replayed in pieces: the largest decode graph (vLLM captures one size "
                            "list for both) or the per-step token budget (SGLang)")
    graph_break_operations: tuple[str, ...] = spec(
        ("attn_core",), doc="plan operations that run eagerly between graph pieces (their kernels are launched one by "
                            "one)")
    step_kernels_outside_graph: int = spec(
        0, doc="GPU kernels and copies every step runs outside the captured forward (input copies, metadata kernels, "
               "sampling), each taking the hardware card's kernel_launch_overhead on the critical path", ge=0)
    cuda_graph_capture: GraphCaptureRule | None = spec(
        None, doc="capture sizes that follow the running-request cap (replaces cuda_graph_max_batch; vLLM)")
    cuda_graph_max_batch: tuple[MemoryTier, ...] = spec(
        default_factory=tuple, doc="largest decode batch one scheduler (an attention-TP group) captures as a "
                                   "graph, by GPU memory and TP size (larger batches run eagerly)")
    cuda_graph_batch_sizes: tuple[CaptureRange, ...] = spec(
        default_factory=tuple, doc="decode batches captured as graphs (ranges start..stop by step); a batch "
                                   "runs padded up to the next captured size (empty = every batch captured)")
    host_costs_from_tables: Literal["none", "eager", "compiled"] = spec(
        "none", doc="which host costs measured with the kernel tables (their provenance: `mfu bench`'s host probes "
                    "on the GPU's machine) replace launch_cpu and step_cpu while those tables are in force: none; "
                    "eager (launch_cpu per kernel of HF eager model code, step_cpu = generate()'s loop plus the "
                    "forward's work outside the layers); compiled (launch_cpu for the eager prefill, step_cpu = "
                    "generate()'s loop only: the compiled decode forward is one CUDA-graph replay)")


@dataclass(frozen=True)
class RoundingTier:
    """Values below `below` (None: any value) are rounded up to a multiple of `multiple`, at least `minimum`."""

    multiple: int = spec(doc="round up to a multiple of this", gt=0)
    below: float | None = spec(None, doc="the tier holds values below this (None: the last tier, every value)", gt=0)
    minimum: int = spec(0, doc="never less than this", ge=0)


@dataclass(frozen=True)
class OfflineLimits:
    """How the engine's offline benchmark tool picks its own running-request cap and per-step token
    budget from memory when the run does not set them (trtllm-bench: see `offline_limits`)."""

    tool: str = spec(doc="the benchmark tool, as reports name it")
    kv_memory_fraction: float = spec(doc="share of (GPU memory x GPUs - weight bytes) counted as KV memory", gt=0, le=1)
    bytes_per_weight: dict[str, float] = spec(
        doc="bytes per parameter the tool charges the whole model, by checkpoint format (fp8, fp4 = NVFP4)", gt=0)
    other_bytes_per_weight: float = spec(
        doc="bytes per parameter for any other checkpoint (unquantised, or quantised in a format the tool does not "
            "list, e.g. MXFP4 weight-only experts)", gt=0)
    max_batch: int = spec(doc="requests that fit are capped at this before rounding", gt=0)
    max_tokens: int = spec(doc="the token budget batch x (1 + ISL / OSL) is capped at this before rounding", gt=0)
    batch_rounding: tuple[RoundingTier, ...] = spec(doc="rounding tiers of the request cap, ascending")
    token_rounding: tuple[RoundingTier, ...] = spec(doc="rounding tiers of the token budget, ascending")
    chunked: bool = spec(False, doc="prompts longer than the budget run in chunks (else whole prompts)")

    @staticmethod
    def rounded(value: float, tiers: tuple[RoundingTier, ...]) -> int:
        for tier in tiers:
            if tier.below is None or value < tier.below:
                return max(tier.minimum, int(-(-value // tier.multiple) * tier.multiple))
        return int(value)


@dataclass(frozen=True, kw_only=True)
class ModelCode:
    """How the engine's model code turns a layer into kernels, beside its GEMMs and attention
    (infersim.modules.eager builds each variant's operations)."""

    elementwise: Literal["fused", "pytorch-eager", "inductor"] = spec(
        "fused", doc="fused: the serving engines' fused kernels (add + RMSNorm, RoPE + KV write, SwiGLU, MoE "
                     "permute); pytorch-eager: HF transformers' modeling code as written, one ATen kernel per tensor op "
                     "(RMSNorm 8 kernels with fp32 intermediates, rotary 5 per q or k, SiLU and mul, residual adds, "
                     "the MoE block's routing bookkeeping around torch's grouped GEMM); inductor: torch.compile's "
                     "Triton fusions of the same code (one kernel per fused group)")
    prefill_elementwise: Literal["fused", "pytorch-eager", "inductor"] | None = spec(
        None, doc="the elementwise decomposition of prefill steps where it differs from `elementwise` (HF generate() "
                  "compiles the decode forward only: its prefill runs eagerly); null: the same")
    projections: Literal["fused", "separate"] = spec(
        "fused", doc="fused: one QKV GEMM and one gate+up GEMM; separate: q, k, v, gate and up as their own nn.Linear "
                     "GEMMs (HF transformers)")
    kv_cache: Literal["paged", "concat", "static"] = spec(
        "paged", doc="paged: new K/V written into a block cache (serving engines); concat: DynamicCache, every step "
                     "torch.cat copies the whole cache with the new token (HF eager); static: StaticCache, new K/V "
                     "index-copied into a cache allocated for prompt + output, attention runs over all of it with a "
                     "mask, and GQA keys/values are materialised per query head first (HF's SDPA path takes "
                     "enable_gqa only without a mask)")
    mla: Literal["absorbed", "decompressed"] = spec(
        "absorbed", doc="MLA decode: absorbed (attention in the latent space, serving engines) or decompressed "
                        "(HF transformers: kv_b_proj expands the whole cached latent every step, then MHA)")


def elementwise_code(code: ModelCode, stage: str) -> str:
    """The elementwise decomposition a stage's steps run (ModelCode.prefill_elementwise for prefill)."""
    if stage == "prefill" and code.prefill_elementwise is not None:
        return code.prefill_elementwise
    return code.elementwise


@dataclass(frozen=True, kw_only=True)
class EngineCard:
    """A serving engine's facts that change predicted times and memory (engines/*.yaml)."""

    name: str = spec(doc="short name, as used in run configs (engine: NAME)")
    aliases: tuple[str, ...] = spec(
        default_factory=tuple, doc="other names the card answers to (e.g. TensorRT-LLM, a benchmark file's backend), "
                                   "matched ignoring case and punctuation")
    framework: Literal["sglang", "vllm", "trtllm", "huggingface"] = spec(doc="the serving software")
    version: str = spec(doc="the version these facts belong to")
    description: str = spec("", doc="what this card describes")
    overheads: Overheads = spec(doc="how per-step software overhead arises")
    scheduler: Scheduler = spec(doc="continuous-batching scheduler facts")
    memory: MemoryPolicy = spec(doc="how the engine sizes its KV cache")
    context_limit: ContextLimit = spec(
        doc="what the server does with a request longer than its context length (refuse it, cut its output, or run "
            "it), with the tokens it keeps free and the setting that lets it start above the model's context")
    model_code: ModelCode = spec(default_factory=ModelCode, doc="which kernels the engine's model code launches")
    fused_operations: tuple[str, ...] = spec(
        default_factory=tuple, doc="plan operations (by name, e.g. rope_kv_store) this engine runs inside a "
                                   "neighbouring kernel: they cost no separate kernel time")
    fusion_passes: tuple[FusionPass, ...] = spec(
        default_factory=tuple, doc="compiler passes that fold plan operations into a neighbouring kernel on some GPUs "
                                   "only (e.g. all-reduce + RMSNorm on Hopper and Blackwell)")
    vendors: tuple[Vendor, ...] = spec(
        ("nvidia",), doc="GPU vendors the engine runs on (and these facts describe); a run on another vendor's GPU "
                         "is refused")
    attention_backends: tuple[AttentionBackendChoice, ...] = spec(
        default_factory=tuple, doc="the attention backend the engine picks, in its priority order: the first entry "
                                   "that matches the GPU (and the model's attention: MLA or not) applies")
    moe_comm: Literal["all-to-all", "deepep-normal", "deepep-low-latency", "all-gather"] | None = spec(
        None, doc="default MoE communication when the run config does not name one")
    all_to_all_needs_ep_above_topk: bool = spec(
        False, doc="the engine's all-to-all MoE path runs only with more EP ranks than experts per token; at "
                   "EP <= top-k a run that names no moe_comm gathers tokens and reduce-scatters outputs (all-gather)")
    all_to_all_needs_attention_dp: bool = spec(
        False, doc="the engine's all-to-all MoE path runs only under attention DP; with attention TP alone every "
                   "rank holds the group's tokens, and a run that names no moe_comm takes the all-gather path")
    lm_head_under_attention_dp: Literal["per-rank", "gathered"] = spec(
        "per-rank", doc="how the LM head runs under attention DP when the run config does not say "
                        "(deployment.lm_head): per-rank logits, or every rank's tokens gathered over a vocab split "
                        "across the whole TP group")
    shared_experts_under_gather: Literal["sharded", "replicated"] = spec(
        "sharded", doc="shared experts under the gathered MoE path when the run config does not say "
                       "(deployment.shared_experts): split over the FFN group on every gathered token, or split over "
                       "the attention-TP group on its own tokens")
    offline_limits: OfflineLimits | None = spec(
        None, doc="offline (all requests at once) runs: the benchmark tool's own request cap and token budget")

    def chunk_tokens(self, hbm_bytes: float, attention_dp: int = 1) -> int:
        """Prompt tokens one prefill step processes per GPU (0 = no chunking)."""
        budget = _tier_int(self.scheduler.chunked_prefill_tokens, hbm_bytes, 1)
        if budget and self.scheduler.chunk_divided_by_attention_dp and attention_dp > 1:
            budget = max(1, budget // attention_dp)
        return budget

    def graph_max_batch(self, hbm_bytes: float, engine_tp: int = 1, hw: HardwareCard | None = None) -> int:
        """Largest decode batch one scheduler replays as a graph, on a GPU of `hbm_bytes` in an
        engine whose TP size (attention TP x attention DP, SGLang's tp_size) is `engine_tp`; with a
        capture rule (vLLM) it follows the running-request cap and token budget, and the GPU `hw`."""
        rule = self.overheads.cuda_graph_capture
        if rule is not None:
            return rule.largest(self.max_running_requests(hbm_bytes), self.chunk_tokens(hbm_bytes), hw)
        return _tier_int(self.overheads.cuda_graph_max_batch, hbm_bytes, engine_tp)

    def graph_padded_batch(self, batch: int, hbm_bytes: float, group: int = 1, engine_tp: int = 1,
                           hw: HardwareCard | None = None) -> int:
        """The per-GPU batch a captured decode step really computes. Engines capture and pad the
        batch of one scheduler, i.e. of an attention-TP group of `group` GPUs, which serves group x
        `batch` requests: that batch is padded up to the next captured size, then shared over the
        group's GPUs (rounded up). `batch` itself when the step runs eagerly or every size is
        captured."""
        o = self.overheads
        requests = batch * group
        if (not o.decode_cuda_graph or requests > self.graph_max_batch(hbm_bytes, engine_tp, hw)
                or not o.cuda_graph_batch_sizes):
            return batch
        size = _next_captured(o.cuda_graph_batch_sizes, requests)
        rule = o.cuda_graph_capture
        if rule is not None and rule.captures_max_requests:
            cap = self.max_running_requests(hbm_bytes)
            if 0 < cap and requests <= cap and (not size or cap < size):
                size = cap
        return -(-size // group) if size else batch

    def attention_backend(self, hw: HardwareCard, mla: bool) -> AttentionBackendChoice | None:
        """The attention backend the engine picks on this GPU for this kind of attention (None: the
        card lists none that matches)."""
        return next((choice for choice in self.attention_backends if choice.applies(hw, mla)), None)

    def page_size(self, hw: HardwareCard | None = None, mla: bool = False) -> int:
        """KV block size: the one the GPU's attention backend forces, else the scheduler's."""
        choice = self.attention_backend(hw, mla) if hw is not None else None
        if choice is not None and choice.page_size:
            return choice.page_size
        return self.scheduler.page_size

    def max_running_requests(self, hbm_bytes: float) -> int:
        """Cap on running requests per engine instance (0 = none but the KV cache)."""
        return _tier_int(self.scheduler.max_running_requests, hbm_bytes, 1)

    def longest_request(self, context_tokens: int) -> int:
        """The most tokens (prompt + output) one request the server runs whole may hold at a context
        of `context_tokens` (0: not stated, no limit): the context less what the server keeps free."""
        return max(0, context_tokens - self.context_limit.kept_free()) if context_tokens else 0

    def running_cap(self, hbm_bytes: float, pool_tokens: int, context_tokens: int) -> int:
        """Cap on running requests of one scheduler whose KV pool holds `pool_tokens` tokens, for a
        model of context `context_tokens` (0: not stated): the card's cap by GPU memory and the one
        the engine derives from its pool, whichever is smaller (0 = none but the KV cache)."""
        cap = self.max_running_requests(hbm_bytes)
        rule = self.scheduler.running_cap_from_pool
        if rule is None or pool_tokens <= 0:
            return cap
        derived = rule.cap(pool_tokens, context_tokens)
        return min(cap, derived) if cap else derived


def _kept_per_tuple(compute: Callable[..., int]) -> Callable[..., int]:
    """`compute(items, *args)` kept per (the tuple's identity, args). Sweeps ask for these once per
    configuration; the tiers and ranges are part of a frozen card, so the values derived from them
    are kept, keyed by the tuple's identity: hashing its tiers afresh each time cost more than the
    answer. Each entry holds its tuple, so that id cannot be reused while the entry exists."""
    kept: dict[tuple[Any, ...], tuple[tuple[Any, ...], int]] = {}

    def cached(items: tuple[Any, ...], *args: Any) -> int:
        key = (id(items), *args)
        hit = kept.get(key)
        if hit is None:
            if len(kept) >= 4096:
                kept.clear()
            hit = kept[key] = (items, compute(items, *args))
        return hit[1]

    return cached


@_kept_per_tuple
def _tier_int(tiers: tuple[MemoryTier, ...], hbm_bytes: float, tp: int) -> int:
    """tier_value as a whole number, kept per (tiers, GPU memory, TP size)."""
    return int(tier_value(tiers, hbm_bytes, tp))


@_kept_per_tuple
def _next_captured(ranges: tuple[CaptureRange, ...], batch: int) -> int:
    """The smallest captured decode batch >= `batch` (0: none), from each range's arithmetic
    progression: a range may span 1e12 sizes, which are never listed."""
    best = 0
    for r in ranges:
        if batch > r.stop:
            continue
        size = r.start if batch <= r.start else r.start + -(-(batch - r.start) // r.step) * r.step
        if size <= r.stop and (not best or size < best):
            best = size
    return best


def with_measured_host(card: EngineCard, launch_cpu: float | None, step_cpu: float | None,
                       probes: dict[str, float]) -> tuple[EngineCard, str]:
    """The card with the host costs a kernel-table directory measured (see Overheads.host_costs_from_tables),
    and one line saying what replaced what ("" when nothing did)."""
    mode = card.overheads.host_costs_from_tables
    if mode == "none":
        return card, ""
    if mode == "compiled":
        step_cpu = probes.get("hf_generate_step", step_cpu)
    changes: dict[str, Any] = {}
    if launch_cpu is not None:
        changes["launch_cpu"] = launch_cpu
    if step_cpu is not None:
        changes["step_cpu"] = step_cpu
    if not changes:
        return card, ""
    old = card.overheads
    said = ", ".join(f"{name} {value * 1e6:.1f} us (card: {getattr(old, name) * 1e6:.1f} us)"
                     for name, value in changes.items())
    return replace(card, overheads=replace(old, **changes)), f"host costs measured with the kernel tables: {said}"


@dataclass(frozen=True)
class LaunchRun:
    """Kernels launched one after another, `repeat` times over (a layer group's layers): per operation
    in launch order, (kernels it launches, its GPU seconds)."""

    operations: tuple[tuple[int, float], ...]
    repeat: int = 1


def launch_queue_seconds(runs: Iterable[LaunchRun], launch_cpu: float) -> float:
    """Seconds from the host's first launch to the end of the last kernel, when one host thread
    launches every kernel in order `launch_cpu` apart and the GPU runs them in launch order: a kernel
    starts once it is launched and the kernel before it has finished (an operation's kernels share its
    time evenly). At least max(launches, GPU time); more where host-bound and GPU-bound stretches
    alternate, since the GPU cannot run ahead of the launches.

    Per repetition of a run (host time H, GPU time G, lead d = GPU finish - host time), the lead after
    it is max(d + G - H, C), C = max over its kernels of (launch time + GPU time from that kernel on) - H;
    over L repetitions that is max(d + L (G - H), C + (L - 1) max(G - H, 0)): closed form, so a model's
    layers cost one pass over one layer's operations."""
    host = 0.0
    lead = 0.0  # the GPU is free when the first launch happens
    for run in runs:
        ops = run.operations
        if not ops or run.repeat <= 0:
            continue
        total_host = launch_cpu * sum(k for k, _ in ops)
        total_gpu = sum(g for _, g in ops)
        reach = float("-inf")
        before, after = 0.0, total_gpu
        for kernels, gpu in ops:
            after -= gpu
            if kernels > 0:
                # its first and last kernel bound the op's kernels (launch time + remaining GPU work is linear in them)
                reach = max(reach, before + after + max(launch_cpu + gpu, kernels * launch_cpu + gpu / kernels))
            before += launch_cpu * kernels
        delta = total_gpu - total_host
        if reach == float("-inf"):  # launches nothing: the GPU work queues behind what is there
            lead += run.repeat * total_gpu
            continue
        reach -= total_host
        lead = max(lead + run.repeat * delta, reach + (run.repeat - 1) * max(delta, 0.0))
        host += run.repeat * total_host
    return host + max(lead, 0.0)


@dataclass(frozen=True)
class StepOverhead:
    """Exposed software time of one step and how it arose."""

    seconds: float
    cpu_seconds: float  # CPU work of the step (scheduler, requests, eager launches)
    eager_kernels: int  # kernels launched one by one (0 when the step is a CUDA graph)
    graph: bool
    detail: str


@cheap_init
@dataclass(frozen=True, slots=True)
class StepPieces:
    """What a step's graph coverage depends on beyond its requests: the GPU (`hw`: its kernel time
    for the work outside the graph, its capture ceiling), the scheduler's tokens in the step, and
    the kernels of the operations that break a piecewise graph (Overheads.graph_break_operations)."""

    hw: HardwareCard | None = None
    tokens: int = 0
    break_kernels: int = 0


NO_PIECES = StepPieces()


def step_overhead(engine: EngineCard, stage: str, gpu_seconds: float, requests: int, kernels: int,
                  hbm_bytes: float, engine_tp: int = 1, launches: Sequence[LaunchRun] = (),
                  pieces: StepPieces = NO_PIECES) -> StepOverhead:
    """Exposed overhead of one step of `gpu_seconds` GPU time in which one scheduler runs
    `requests` requests and each GPU launches `kernels` kernels, in an engine of TP size
    `engine_tp` (see graph_max_batch; the module docstring gives the composition). `launches`: the
    step's kernels in launch order (LaunchRun), where known: without an overlap scheduler the
    launches then overlap the GPU as the launch queue allows (launch_queue_seconds)."""
    o = engine.overheads
    seconds, cpu, exposed_cpu, eager, graph = _overhead(engine, stage, gpu_seconds, requests, kernels, hbm_bytes,
                                                        engine_tp, launches, pieces)
    hidden_by = "overlap scheduler" if o.overlap_scheduler else (
        "asynchronous launches, in launch order" if launches and eager else "asynchronous launches")
    fixed = _fixed_seconds(engine, pieces.hw)
    outside = (f" ({o.step_kernels_outside_graph} kernels outside the graph)"
               if o.step_kernels_outside_graph and pieces.hw is not None else "")
    coverage = "; CUDA graph" if graph else ("; CUDA graph pieces" if eager and eager < kernels else "")
    detail = (f"{engine.name} {engine.version}: fixed {fixed * 1e3:.2f} ms{outside} + CPU {cpu * 1e3:.2f} ms "
              f"({requests} requests, {eager} eager launches{coverage}), "
              f"{(cpu - exposed_cpu) * 1e3:.2f} ms of it hidden by {hidden_by}")
    return StepOverhead(seconds, cpu, eager, graph, detail)


def step_overhead_seconds(engine: EngineCard, stage: str, gpu_seconds: float, requests: int, kernels: int,
                          hbm_bytes: float, engine_tp: int = 1, launches: Sequence[LaunchRun] = (),
                          pieces: StepPieces = NO_PIECES) -> float:
    """step_overhead(...).seconds without formatting its detail (sweeps need the time only)."""
    return _overhead(engine, stage, gpu_seconds, requests, kernels, hbm_bytes, engine_tp, launches, pieces)[0]


def _fixed_seconds(engine: EngineCard, hw: HardwareCard | None) -> float:
    """Per-step time no overlap hides: step_fixed, plus the kernels outside the graph at the GPU's
    per-kernel time."""
    o = engine.overheads
    if hw is None or not o.step_kernels_outside_graph:
        return o.step_fixed
    return o.step_fixed + o.step_kernels_outside_graph * hw.derates.kernel_launch_overhead


def _eager_kernels(engine: EngineCard, stage: str, requests: int, kernels: int, hbm_bytes: float,
                   engine_tp: int, pieces: StepPieces) -> tuple[int, bool]:
    """(kernels launched one by one, whole step a CUDA graph?) of one step."""
    o = engine.overheads
    if stage == "decode":
        graph = o.decode_cuda_graph and requests <= engine.graph_max_batch(hbm_bytes, engine_tp, pieces.hw)
    else:
        graph = o.prefill_cuda_graph
    if graph:
        return 0, True
    if stage != "decode" and o.prefill_graph_pieces and (pieces.hw is None or pieces.hw.vendor in o.prefill_graph_vendors):
        limit = (engine.graph_max_batch(hbm_bytes, engine_tp, pieces.hw)
                 if o.prefill_graph_max_tokens == "decode-graph-limit" else engine.chunk_tokens(hbm_bytes))
        if 0 < pieces.tokens <= limit:
            return min(kernels, pieces.break_kernels), False
    return kernels, False


def _overhead(engine: EngineCard, stage: str, gpu_seconds: float, requests: int, kernels: int,
              hbm_bytes: float, engine_tp: int, launches: Sequence[LaunchRun] = (), pieces: StepPieces = NO_PIECES
              ) -> tuple[float, float, float, int, bool]:
    """(exposed seconds, CPU seconds, exposed CPU seconds, eager kernels, CUDA graph?) of one step."""
    o = engine.overheads
    eager, graph = _eager_kernels(engine, stage, requests, kernels, hbm_bytes, engine_tp, pieces)
    cpu = o.step_cpu + o.request_cpu * requests + o.launch_cpu * eager
    if o.overlap_scheduler:
        exposed_cpu = max(0.0, cpu - gpu_seconds)
    else:
        # the scheduler and per-request work run between steps; launches overlap the GPU, as far as the
        # launch queue lets them where the step's launch order is known
        launch = o.launch_cpu * eager
        if launches and eager:
            launch = launch_queue_seconds(launches, o.launch_cpu)
        exposed_cpu = o.step_cpu + o.request_cpu * requests + max(0.0, launch - gpu_seconds)
    return _fixed_seconds(engine, pieces.hw) + exposed_cpu, cpu, exposed_cpu, eager, graph


def validate_engine(card: EngineCard, source: str) -> EngineCard:
    if not card.scheduler.chunked_prefill_tokens:
        raise ConfigError(source, "scheduler.chunked_prefill_tokens", MISSING,
                          "needs at least one tier (min_gpu_bytes: 0, value: tokens; value 0 = no chunking)")
    for field, tiers in (("scheduler.chunked_prefill_tokens", card.scheduler.chunked_prefill_tokens),
                         ("scheduler.max_running_requests", card.scheduler.max_running_requests),
                         ("overheads.cuda_graph_max_batch", card.overheads.cuda_graph_max_batch)):
        floors = [(t.min_gpu_bytes, t.min_tp) for t in tiers]
        if len(set(floors)) != len(floors):
            raise ConfigError(source, field, floors, "two tiers with the same min_gpu_bytes and min_tp")
        for i, t in enumerate(tiers):
            if t.min_tp != 1 and field != "overheads.cuda_graph_max_batch":
                raise ConfigError(source, f"{field}[{i}].min_tp", t.min_tp,
                                  "only overheads.cuda_graph_max_batch varies by TP size; use 1 or leave it out")
            if not float(t.value).is_integer():
                raise ConfigError(source, f"{field}[{i}].value", t.value, "expected a whole number")
    for i, r in enumerate(card.overheads.cuda_graph_batch_sizes):
        if r.start > r.stop:
            raise ConfigError(source, f"overheads.cuda_graph_batch_sizes[{i}]", {"start": r.start, "stop": r.stop},
                              "start is above stop: a capture range runs upwards (start <= stop)")
    rule = card.scheduler.running_cap_from_pool
    if rule is not None and rule.min_requests > rule.max_requests:
        raise ConfigError(source, "scheduler.running_cap_from_pool.min_requests", rule.min_requests,
                          f"above max_requests ({rule.max_requests}): the clamp's lower end must not pass its upper end")
    chunk_floor = min(t.min_gpu_bytes for t in card.scheduler.chunked_prefill_tokens)
    if chunk_floor > 0:
        # engines pick the chunk by GPU memory: a GPU below every tier would silently get no chunking
        raise ConfigError(source, "scheduler.chunked_prefill_tokens", [t.min_gpu_bytes for t in
                                                                       card.scheduler.chunked_prefill_tokens],
                          f"no tier covers GPUs below {chunk_floor:g} bytes of HBM: give a tier with min_gpu_bytes: 0 "
                          "(value 0 = no chunking)")
    _validate_context_limit(card.context_limit, source)
    _validate_running_cap_flag(card, source)
    validate_memory_policy(card.memory, source)
    from infersim.cards.engine_platform import check_operation_names, validate_platform_fields

    check_operation_names(card.fused_operations, "fused_operations", source)
    if card.overheads.decode_cuda_graph and not card.overheads.cuda_graph_max_batch \
            and card.overheads.cuda_graph_capture is None:
        raise ConfigError(source, "overheads.cuda_graph_max_batch", MISSING,
                          "decode_cuda_graph is on: say up to which batch decode is captured (cuda_graph_max_batch, "
                          "or cuda_graph_capture)")
    validate_platform_fields(card, source)
    return card


def _validate_running_cap_flag(card: EngineCard, source: str) -> None:
    """scheduler.running_cap_flag: a server's flag, spelled as its parser spells it (the run's warning
    and a sweep's note name it, --emit-launch sets it)."""
    flag = card.scheduler.running_cap_flag
    if flag is None:
        return
    if card.framework == "huggingface":
        raise ConfigError(source, "scheduler.running_cap_flag", flag,
                          "framework huggingface runs no server, so no flag sets its running cap (leave it out)")
    if not re.fullmatch(r"--[a-z0-9][a-z0-9_-]*", flag):
        raise ConfigError(source, "scheduler.running_cap_flag", flag,
                          "expected the server's command-line flag as its parser spells it, e.g. --max-num-seqs")


def _validate_context_limit(rule: ContextLimit, source: str) -> None:
    """The context section's values that only make sense together."""
    if rule.beyond == "run":
        given = [(name, getattr(rule, name)) for name in ("reserved_tokens", "output_margin", "prompt_margin",
                                                          "refuses_long_output") if getattr(rule, name)]
        if given:
            name, value = given[0]
            raise ConfigError(source, f"context_limit.{name}", value,
                              "beyond run: the engine runs every request as asked, so nothing is refused, kept free "
                              "or cut (leave it out, or say what the engine does with beyond refuse / shorten_output)")
    if rule.kv_pool is not None:
        _validate_kv_pool(rule, source)
    if rule.beyond == "shorten_output" and rule.reserved_tokens:
        raise ConfigError(source, "context_limit.reserved_tokens", rule.reserved_tokens,
                          "applies to beyond refuse only (a shortening engine keeps tokens free with output_margin)")
    if rule.output_margin > rule.prompt_margin:
        raise ConfigError(source, "context_limit.output_margin", rule.output_margin,
                          f"above prompt_margin ({rule.prompt_margin}): a prompt the engine takes would leave no "
                          "output token; a prompt of the context less output_margin tokens or more must be refused")
    override = rule.override
    if override is not None:
        variable, _, setting = override.partition("=")
        if not (variable.strip() and setting.strip()) or variable != variable.strip() or " " in variable:
            raise ConfigError(source, "context_limit.override", override, "expected VARIABLE=VALUE (an environment "
                              "setting, e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")


def _validate_kv_pool(rule: ContextLimit, source: str) -> None:
    """context_limit.kv_pool says something the engine does, and not of an engine that runs every request."""
    pool = rule.kv_pool
    assert pool is not None
    if rule.beyond == "run":
        given = {key: value for key, value in asdict(pool).items() if value is not None}
        raise ConfigError(source, "context_limit.kv_pool", given, "beyond run: the engine runs "
                          "every request as asked, so its pool refuses or cuts none (leave kv_pool out)")
    if not pool.margins and pool.empty_pool_fit is None:
        raise ConfigError(source, "context_limit.kv_pool.margins", pool.margins, "with no empty_pool_fit the section "
                          "says nothing the engine does: say margins: true, give empty_pool_fit, or leave kv_pool out")
