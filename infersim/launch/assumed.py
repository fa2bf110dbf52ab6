"""What a simulated engine instance assumed, in engine-neutral terms, and the layout it runs.

`Assumed` is read from where the simulation took it: a plain run or a sweep row (the engine card's
budget and memory policy, and the simulated decode batch as the running cap), or a serving pool
(its scheduler settings). Counts are per attention-DP rank, the unit every engine schedules:
SGLang's server-wide flags are that times the DP size. `Layout` names the parallel form of the
deployment; `checkpoint_choice` the weights an engine loads for the run's formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from infersim.cards.deployment import Deployment, dp_attention_ranks, server_tp
from infersim.cards.engine import EngineCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.base.errors import InferSimError
from infersim.serve.settings import prefix_cache_on
from infersim.run.memory import MemoryResult, memory_budget

if TYPE_CHECKING:
    from infersim.serve.scheduler import SchedulerSettings

#: a token budget at least this large stands for "no budget" (serve's whole-prompt scheduling)
UNLIMITED_BUDGET = 1 << 30


@dataclass(frozen=True)
class Assumed:
    role: Literal["server", "prefill", "decode"]
    instances: int  # copies of this server: replicas, or a PD pool's instances
    config: RunConfig
    token_budget: int  # tokens per step per attention-DP rank (0: whole prompts, no budget)
    chunked: bool  # prompts longer than the budget run as chunks
    running_cap: int  # running requests per attention-DP rank (0: bounded by the KV cache)
    prefix_cache: bool
    mixed: bool  # prefill chunks and decode requests share a step
    static_fraction: float  # share of HBM for weights and the KV cache (what is left is the engine's reserve)
    graph_sizes: tuple[int, ...]  # decode batches captured as CUDA graphs, per attention-DP rank
    origin: str  # where the budget and the cap come from
    lookahead: int = 0  # speculative decoding: tokens drafted per step (0: none, or the config's own)
    max_model_len: int = 0  # longest request (prompt + output) the run admitted (0: the engine's default, the model's context)

    @property
    def engine(self) -> EngineCard:
        return self.config.engine


@dataclass(frozen=True)
class Layout:
    """The deployment's parallel form: attention TP x DP per stage, the FFN group over it, PP, nodes."""

    attn_tp: int
    attn_dp: int
    ffn_tp: int
    ffn_ep: int
    pp: int
    num_gpus: int
    num_nodes: int
    is_moe: bool

    @property
    def stage(self) -> int:
        return self.attn_tp * self.attn_dp

    @property
    def ffn_group(self) -> int:
        return self.ffn_tp * self.ffn_ep

    @property
    def gpus_per_node(self) -> int:
        return self.num_gpus // self.num_nodes

    @property
    def form(self) -> Literal["tp", "dp-attention", "replicas", "other"]:
        """tp: one TP group per stage; dp-attention: attention DP ranks sharing one FFN group over the
        whole stage; replicas: attention DP ranks each with its own FFN (data-parallel copies)."""
        if self.attn_dp == 1:
            return "tp" if self.ffn_group == self.attn_tp else "other"
        if self.ffn_group == self.stage:
            return "dp-attention"
        return "replicas" if self.ffn_group == self.attn_tp else "other"

    def describe(self) -> str:
        return (f"attention TP{self.attn_tp} x DP{self.attn_dp}, FFN TP{self.ffn_tp} x EP{self.ffn_ep}, PP{self.pp} "
                f"on {self.num_gpus} GPU(s) in {self.num_nodes} node(s)")


def layout_of(config: RunConfig) -> Layout:
    return layout_from(config.deployment, config.model)


def layout_from(dep: Deployment, model: ModelCard) -> Layout:
    """The layout of a completed deployment (DP sizes derived)."""
    return Layout(dep.attention.tp, dep.attention.dp, dep.ffn.tp, dep.ffn.ep, dep.pp, dep.num_gpus, dep.num_nodes,
                  model.is_moe)


def capture_sizes(engine: EngineCard, hbm_bytes: float, engine_tp: int, running_cap: int) -> tuple[int, ...]:
    """The decode batches the engine card captures as CUDA graphs (up to its graph limit), cut after the
    first size that holds the running cap: a larger batch never runs, so its graph changes nothing."""
    if not engine.overheads.decode_cuda_graph:
        return ()
    limit = engine.graph_max_batch(hbm_bytes, engine_tp)
    sizes = sorted({size for r in engine.overheads.cuda_graph_batch_sizes
                    for size in range(r.start, min(r.stop, limit) + 1, r.step)})
    if not sizes:
        sizes = list(range(1, limit + 1))  # empty ranges: every batch up to the limit is captured
    if running_cap:
        covering = [s for s in sizes if s >= running_cap]
        if covering:
            sizes = [s for s in sizes if s <= covering[0]]
    return tuple(sizes)


def run_memory(config: RunConfig) -> MemoryResult:
    """The memory accounting simulate() does for this config (the engine's reserve, the KV space)."""
    from infersim.run.simulate import prefill_step_tokens
    from infersim.run.speculative import drafter_memory

    model, hw, dep, work = config.model, config.hardware, config.deployment, config.workload
    return memory_budget(model, hw, dep, work, drafter_memory(config), config.engine,
                         prefill_step_tokens(work, config.engine, hw, dep), offload=True)


def static_fraction(memory: MemoryResult) -> float:
    return (memory.hbm_bytes - memory.reserved_bytes) / memory.hbm_bytes


def assumed_for_batch(config: RunConfig, batch_per_gpu: int, memory: MemoryResult | None = None,
                      lookahead: int = 0) -> Assumed:
    """A plain run or a sweep row: the engine card's budget and caches, and the simulated decode batch
    as each scheduler's running cap (batch per GPU x attention TP x PP, as memory accounting counts it)."""
    engine, hw, dep = config.engine, config.hardware, config.deployment
    memory = memory if memory is not None else run_memory(config)
    hbm = hw.peak.hbm_bytes
    if config.workload.prefill_tokens_per_gpu:
        budget = config.workload.prefill_tokens_per_gpu * dep.attention.tp
        origin = f"token budget {budget} from workload.prefill_tokens_per_gpu"
    else:
        budget = engine.chunk_tokens(hbm, dp_attention_ranks(dep))
        origin = f"token budget from engine card {engine.name} {engine.version}"
    cap = batch_per_gpu * dep.attention.tp * dep.pp
    prefix_cache = prefix_cache_on(None, engine, config.model)[0]  # the engine's own, for this model
    return Assumed("server", 1, config, budget, budget > 0, cap, prefix_cache,
                   engine.scheduler.mixed_batches, static_fraction(memory),
                   capture_sizes(engine, hbm, server_tp(dep), cap),
                   origin + f"; running cap {cap}: the simulated decode batch of {batch_per_gpu} per GPU", lookahead)


def assumed_for_pool(config: RunConfig, settings: SchedulerSettings, role: Literal["server", "prefill", "decode"],
                     instances: int, max_model_len: int = 0) -> Assumed:
    """A serving pool: its scheduler settings (per instance), shared over the instance's attention-DP ranks;
    `max_model_len` the serving run's own (0: none given, the engine's default)."""
    dp = config.deployment.attention.dp
    budget = 0 if settings.token_budget >= UNLIMITED_BUDGET else settings.token_budget // dp
    # a cap the engine derives from its pool by itself is left to it
    cap = -(-settings.max_running // dp) if settings.max_running and not settings.cap_derived_by_engine else 0
    engine, hw = config.engine, config.hardware
    return Assumed(role, instances, config, budget, settings.chunked and budget > 0, cap, settings.prefix_cache,
                   settings.mixed, static_fraction(run_memory(config)),
                   capture_sizes(engine, hw.peak.hbm_bytes, server_tp(config.deployment), cap), settings.origin,
                   max_model_len=max_model_len)


@dataclass(frozen=True)
class Checkpoint:
    repository: str
    online_quantization: str  # "" or the format the engine quantises the checkpoint to while loading
    note: str


def checkpoint_choice(config: RunConfig) -> Checkpoint:
    """The checkpoint holding the run's weight formats: the model card's own where the formats are its
    checkpoint's, a quantised one it names by format, or its own quantised to fp8 while loading."""
    model, prec = config.model, config.deployment.precision
    q = model.quantization
    native = (q.weights, q.expert_weights) if q else ("bf16", "bf16")
    wanted = (prec.weight_dtype, prec.expert_weight_dtype if model.is_moe else prec.weight_dtype)
    if not model.is_moe:
        native = (native[0], native[0])
    if wanted == native and model.checkpoint:
        return Checkpoint(model.checkpoint, "", f"checkpoint {model.checkpoint} (model card {model.name})")
    if wanted[0] == wanted[1] and wanted[0] in model.quantized_checkpoints:
        repo = model.quantized_checkpoints[wanted[0]]
        return Checkpoint(repo, "", f"checkpoint {repo}: model card {model.name}'s {wanted[0]} checkpoint")
    unquantised = native[0] in ("bf16", "fp16") and native[1] in ("bf16", "fp16")
    if wanted == ("fp8", "fp8") and unquantised and model.checkpoint:
        return Checkpoint(model.checkpoint, "fp8", f"checkpoint {model.checkpoint} quantised to fp8 while loading "
                                                   f"(model card {model.name} names no fp8 checkpoint)")
    formats = wanted[0] if wanted[0] == wanted[1] else f"{wanted[0]} weights with {wanted[1]} experts"
    what = "names no checkpoint" if not model.checkpoint else f"names no {formats} checkpoint"
    raise InferSimError(f"--emit-launch: model card {model.name} {what} for the run's {formats} weights: give one with "
                        f"--set model.checkpoint=REPO (the card's own formats) or "
                        f"--set model.quantized_checkpoints.{wanted[0]}=REPO")
