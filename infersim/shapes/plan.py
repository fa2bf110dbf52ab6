"""A model step as a declarative list of operations, built once per stage; the engine walks it.

Each layer kind (dense-FFN layers, MoE layers, ...) is a LayerGroup: the operations of one layer,
in the parts its builders return them (a mixer's operations before its core, the core, those after
it, the FFN), and how many layers share them. Per-step operations (embedding, LM head, pipeline sends) run once.
New architectures add operation builders in `infersim.modules`, not branches in the engine.
The records are slotted dataclasses (slots=True): a sweep builds a plan, its context and its new
operations for every configuration, and slotted ones are cheaper to build and to free.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Literal

from infersim.base.records import cheap_init
from infersim.shapes.kernels import AnyShape

Stage = Literal["prefill", "decode"]


@cheap_init
@dataclass(frozen=True, slots=True)
class Operation:
    """One kernel of a layer or step: its name, module category and shape."""

    name: str
    module: str  # a category from infersim.cards.categories
    shape: AnyShape
    count: int = 1  # identical kernels of this shape per layer


@cheap_init
@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Identical layers (`layers` of them) and the operations each runs, in parts: the tuples the
    module builders return, in order. The stage engine adds a layer's time part by part (each
    part's operations, then the parts), so a part shared by many plans is summed once."""

    name: str
    layers: int
    parts: tuple[tuple[Operation, ...], ...]

    @property
    def operations(self) -> tuple[Operation, ...]:
        """The layer's operations in order (its parts joined)."""
        return tuple(chain.from_iterable(self.parts))


@cheap_init
@dataclass(frozen=True, slots=True)
class SequenceBatch:
    """`count` sequences of q_len new tokens attending to kv_len positions.

    Per GPU by default: under attention TP t the group of t GPUs holds t x count such sequences
    (each GPU's share, with its heads / t). across_tp: the count sequences are the whole group's,
    each one's q_len tokens spread over its t GPUs (one prompt prefilled by a TP group); a GPU's
    token share is then count x q_len / t."""

    count: int
    q_len: int
    kv_len: int
    across_tp: bool = False
    # a static KV cache (ModelCode.kv_cache static) allocated for this many positions per sequence: decode
    # attention runs over all of them under a mask. 0: the cache holds kv_len (paged, concatenated)
    kv_capacity: int = 0

    def group_count(self, tp: int) -> int:
        """Sequences the attention-TP group of `tp` GPUs runs (each GPU computes its heads of all)."""
        return self.count if self.across_tp else self.count * tp

    def gpu_tokens(self, tp: int) -> int:
        """New tokens one GPU of the group carries through the GEMMs (rounded up)."""
        return -(-self.count * self.q_len // tp) if self.across_tp else self.count * self.q_len

    def kernel_stage(self, step_stage: Stage) -> Stage:
        """The attention kernel family these sequences run in a step labelled `step_stage`: one new
        token on top of a cached context is a decode request, and engines run the decode requests
        of a mixed step with their decode kernels (TensorRT-LLM's generation-phase attention and
        absorbed MLA, vLLM's and SGLang's decode paths), not with the prefill kernel; a one-token
        prompt (nothing cached) stays prefill."""
        return "decode" if step_stage == "decode" or (self.q_len == 1 and self.kv_len > 1) else "prefill"


@cheap_init
@dataclass(frozen=True, slots=True)
class StageContext:
    """The per-GPU workload of one (micro-)batch of a stage, as the module builders see it."""

    stage: Stage
    tokens_per_gpu: int  # distinct tokens per GPU in this micro-batch
    sequences_per_gpu: tuple[SequenceBatch, ...]  # the sequences behind those tokens
    gpus_per_node: int  # GPUs per node in this deployment (for placing collective ranks)
    # mean tokens per GPU that reach the routed experts over the EP group, when attention-DP ranks
    # hold unequal work (one rank prefills while the others decode); 0: every rank holds tokens_per_gpu
    expert_tokens_per_gpu: float = 0.0

    @property
    def expert_tokens(self) -> float:
        """Tokens per GPU whose expert work the EP group shares (see expert_tokens_per_gpu)."""
        return self.expert_tokens_per_gpu or float(self.tokens_per_gpu)

    @property
    def sequence_length(self) -> float:
        """Token-weighted mean new tokens per sequence of the batch (tokens of one sequence route alike)."""
        tokens = weighted = 0
        for s in self.sequences_per_gpu:
            new = s.count * s.q_len
            tokens += new
            weighted += new * s.q_len
        return weighted / tokens if tokens else 1.0


@cheap_init
@dataclass(frozen=True, slots=True)
class FfnContext:
    """The part of a StageContext a layer's FFN is built from (infersim.modules.ffn's builders read
    this record, so that a plan piece kept on their inputs covers all they read; see
    infersim.cards.deployment.FfnDeployment): the sequences only as their mean length, so one
    FFN piece serves every batch of the same tokens (a decode step's real requests behind one
    CUDA-graph batch)."""

    stage: Stage
    tokens_per_gpu: int
    gpus_per_node: int
    expert_tokens_per_gpu: float
    sequence_length: float

    @classmethod
    def of(cls, ctx: StageContext) -> FfnContext:
        return cls(*cls.values_of(ctx))

    @staticmethod
    def values_of(ctx: StageContext) -> tuple[Stage, int, int, float, float]:
        """The fields of `ctx`'s FfnContext, in order, without the record (a key that compares as a tuple)."""
        return ctx.stage, ctx.tokens_per_gpu, ctx.gpus_per_node, ctx.expert_tokens_per_gpu, ctx.sequence_length

    @property
    def expert_tokens(self) -> float:
        """Tokens per GPU whose expert work the EP group shares (see StageContext.expert_tokens_per_gpu)."""
        return self.expert_tokens_per_gpu or float(self.tokens_per_gpu)


@cheap_init
@dataclass(frozen=True, slots=True)
class StagePlan:
    """Everything one prefill or decode step runs: its layer groups and once-per-step operations."""

    stage: Stage
    groups: tuple[LayerGroup, ...]
    per_step: tuple[Operation, ...]
    micro_batches: int  # 2 under two-batch overlap: group operations are sized per micro-batch
    comm_sms: int  # SMs overlapped communication takes from compute
    tokens_per_gpu: int  # tokens per GPU the whole step produces (prefill) or batch (decode)
    requests_per_gpu: int = 0  # requests the step serves per GPU (sequences of a prefill, the decode batch)
    attention_tp: int = 1  # GPUs of one scheduler's group: it batches attention_tp x requests_per_gpu requests
    engine_tp: int = 1  # the engine's TP size (a stage's GPUs = attention TP x DP), by which some engines pick limits
    # deployment.weight_offload: weight bytes of one layer each group streams from host memory
    # every pass, aligned with `groups` (empty: every weight resident; see infersim.costing.weight_offload)
    offload_bytes_per_layer: tuple[float, ...] = ()

    @property
    def num_layers(self) -> int:
        return sum(g.layers for g in self.groups)
