"""How a model is placed on the GPUs and what it serves: the deployment and workload sections of a
run config, and the rules that complete a layout.

`complete_layout` fills the derived data-parallel sizes and checks the layout against the model
and the machine (every sharding divides, the links it talks over exist, the formats have a
tensor-core rate); `with_engine_defaults` and `with_checkpoint_precision` fill the fields a run
leaves to its engine card and its checkpoint. These are facts of the run, below everything that
prices it: the modules build their operations from a Deployment, memory accounting splits weights
by it (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any, Literal

from infersim.base.records import evolve
from infersim.cards.engine import EngineCard, ModelCode
from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.cards.schema import hash_kept, spec
from infersim.base.errors import ConfigError, LayoutError
from infersim.base.sharding import heads_per_rank, shard

Dtype = Literal["bf16", "fp16", "fp8", "int8", "fp4"]
WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
KvDtype = Literal["bf16", "fp16", "fp8"]


@dataclass(frozen=True, kw_only=True)
class AttentionLayout:
    """How attention is split over the GPUs of a pipeline stage."""

    tp: int = spec(1, doc="tensor parallelism of attention (heads split over tp GPUs)", gt=0)
    dp: int = spec(0, doc="data-parallel attention replicas per pipeline stage (0 = num_gpus / (pp * tp))", ge=0)


@dataclass(frozen=True, kw_only=True)
class FfnLayout:
    """How the FFN / expert weights are split over the GPUs of a pipeline stage."""

    tp: int = spec(1, doc="tensor parallelism of FFN/expert weights", gt=0)
    ep: int = spec(1, doc="expert parallelism: routed experts spread over ep GPUs (MoE only)", gt=0)
    dp: int = spec(0, doc="FFN replicas per pipeline stage (0 = num_gpus / (pp * tp * ep))", ge=0)


@dataclass(frozen=True, kw_only=True)
class MoeBalanceSpec:
    """How evenly routed tokens spread over the EP ranks (see infersim.modules.load_balance)."""

    load_balance: Literal["statistical", "ideal", "eplb"] = spec(
        "statistical", doc="expert-load balance over EP ranks: statistical (random routing, most loaded rank from "
                           "the batch's statistics), ideal (even load), eplb (DeepSeek EPLB placement over "
                           "experts + redundant_experts slots)")
    redundant_experts: int = spec(
        0, doc="eplb: extra expert slots holding replicas of hot experts; experts + redundant must divide by ffn.ep",
        ge=0)
    routing_skew: float = spec(
        1.01, doc="power-law exponent alpha of one sequence's expert popularity (aiconfigurator: 1.01 DeepSeek/Kimi, "
                  "1.2 other MoE models)", ge=0, le=10)
    dataset_skew: float | None = spec(
        None, doc="power-law exponent of the long-run expert popularity of the served traffic (null = even long-run "
                  "load, what routers are trained for; a narrow dataset is skewed, and EPLB placement removes it)",
        ge=0, le=10)


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Number formats of GEMM inputs, stored weights, the KV cache and attention."""

    gemm: Dtype = spec("bf16", doc="tensor-core input format of GEMMs (sets the FLOP/s peak; default: a quantised "
                                   "checkpoint's activation format where the GPU has it, else bf16)")
    weights: WeightDtype | None = spec(
        None, doc="storage format of linear weights (default: a quantised checkpoint's, model.quantization, else same "
                  "as gemm); narrower than gemm = weight-only quantisation (bytes follow weights, tensor-core rate "
                  "follows gemm)")
    expert_weights: WeightDtype | None = spec(
        None, doc="storage format of routed-expert weights (default: the checkpoint's, else weights), e.g. fp4 for "
                  "GPT-OSS's MXFP4 experts")
    expert_gemm: Dtype | None = spec(
        None, doc="tensor-core input format of routed-expert GEMMs (default: gemm), e.g. bf16 where MXFP4 experts "
                  "run as W4A16 on a GPU without fp4 tensor cores (Hopper)")
    attention_weights: WeightDtype | None = spec(
        None, doc="storage format of every layer's attention (mixer) projections (default: the checkpoint's where it "
                  "leaves them unquantised, model.quantization.attention_weights, else weights); 16-bit ones run "
                  "bf16 GEMMs, as an unquantised linear layer does")
    kv_cache: KvDtype = spec("bf16", doc="KV-cache storage format")
    attention: Dtype = spec("bf16", doc="format attention kernels compute in")

    @property
    def weight_dtype(self) -> str:
        return self.weights or self.gemm

    @property
    def attention_weight_dtype(self) -> str:
        return self.attention_weights or self.weight_dtype

    @property
    def attention_gemm_dtype(self) -> str:
        """The attention projections' GEMM input format: bf16 where their weights are 16-bit apart
        from the rest (an engine runs a layer its checkpoint leaves unquantised in 16 bits), else gemm."""
        return "bf16" if self.attention_weights in ("bf16", "fp16") else self.gemm

    @property
    def expert_weight_dtype(self) -> str:
        return self.expert_weights or self.weight_dtype

    @property
    def expert_gemm_dtype(self) -> str:
        return self.expert_gemm or self.gemm


MoeComm = Literal["all-to-all", "deepep-normal", "deepep-low-latency", "all-gather"]
DEFAULT_MOE_COMM: MoeComm = "all-to-all"  # when neither the run, the layout nor the engine card decides


@hash_kept  # a memo key at every sweep point (see hash_kept)
@dataclass(frozen=True, kw_only=True)
class Deployment:
    """How the model is placed on the GPUs: counts, parallel layout, precision, overlap, MoE path."""

    num_gpus: int = spec(doc="GPUs serving this stage in total", gt=0)
    num_nodes: int = spec(1, doc="nodes the GPUs are spread over", gt=0)
    pp: int = spec(1, doc="pipeline-parallel stages (layers split evenly)", gt=0)
    attention: AttentionLayout = spec(default_factory=AttentionLayout, doc="attention layout")
    ffn: FfnLayout = spec(default_factory=FfnLayout, doc="FFN / MoE layout")
    precision: Precision = spec(default_factory=Precision, doc="numeric formats")
    overlap: Literal["none", "two-batch"] = spec(
        "none", doc="two-batch: two micro-batches, one's compute hides the other's communication")
    moe_comm: MoeComm = spec(
        DEFAULT_MOE_COMM, doc="how tokens reach experts: NCCL all-to-all, DeepEP normal / low-latency, or all-gather + "
                          "reduce-scatter (the default when the experts are TP-sharded, ffn.tp > 1, else the "
                          "engine's default or all-to-all)")
    lm_head: Literal["per-rank", "gathered"] = spec(
        "per-rank", doc="the LM head under attention DP: per-rank: each DP rank computes its own tokens' logits, "
                        "vocab split over its attention-TP group (SGLang --enable-dp-lm-head, TensorRT-LLM, vLLM); "
                        "gathered: every DP rank's tokens are gathered, the vocab is split over all attention TP x DP "
                        "GPUs, and the logits are all-gathered, each rank keeping its rows (SGLang's default); a tied "
                        "LM head (the embedding's weights) is always per-rank. Default: the engine card's "
                        "lm_head_under_attention_dp")
    shared_experts: Literal["sharded", "replicated"] = spec(
        "sharded", doc="shared experts under moe_comm all-gather: sharded: split over the whole FFN group and run on "
                       "every gathered token (SGLang); replicated: split over the attention-TP group only and run on "
                       "the group's own tokens (TensorRT-LLM: shared_tp_size 1 under attention DP). All-to-all paths "
                       "always run them on each rank's own tokens. Default: the engine card's shared_experts_under_gather")
    moe: MoeBalanceSpec = spec(default_factory=MoeBalanceSpec, doc="expert-load balance and redundant experts")
    model_code: ModelCode = spec(
        default_factory=ModelCode, doc="which kernels the model code launches (elementwise decomposition, separate "
                                       "projections, KV-cache growth, MLA decode). Default: the engine card's model_code")
    weight_offload: Literal["none", "auto"] = spec(
        "none", doc="none: every weight in HBM; auto: the weights that do not fit in HBM beside the engine's reserve "
                    "and the KV cache the workload needs stay in host memory (hardware card host_memory_bytes) and "
                    "are streamed over the host link every forward pass, one layer ahead of compute - an equal share "
                    "of every MoE layer's routed experts (dense models: of every layer's weights)")

    @property
    def gpus_per_stage(self) -> int:
        return self.num_gpus // self.pp

    @property
    def gpus_per_node(self) -> int:
        return self.num_gpus // self.num_nodes


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What is served: prompt and output lengths, step sizes and decode batch."""

    isl: int = spec(doc="input (prompt) length, tokens", gt=0)
    osl: int = spec(doc="output length, tokens", gt=0)
    prefill_tokens_per_gpu: int = spec(0, doc="prompt tokens one prefill step processes per GPU (0 = isl)", ge=0)
    decode_batch_per_gpu: int | Literal["max"] = spec(
        "max", doc="concurrent requests per GPU in decode; 'max' = the largest that fits in memory", gt=0)

    @property
    def prefill_tokens(self) -> int:
        return self.prefill_tokens_per_gpu or self.isl

    @property
    def decode_context(self) -> float:
        """Average KV length over a request's decode: ISL + OSL/2."""
        return self.isl + self.osl / 2


def draft_deployment(dep: Deployment) -> Deployment:
    """How a draft model runs: on each attention-TP group of the model, tensor-parallel over the
    group (attention and FFN), no expert parallelism or overlap, in the model's formats."""
    tp = dep.attention.tp
    nodes = max(1, -(-tp // dep.gpus_per_node))
    return Deployment(num_gpus=tp, num_nodes=nodes, attention=AttentionLayout(tp=tp, dp=1),
                      ffn=FfnLayout(tp=tp, ep=1, dp=1), precision=dep.precision, overlap="none", moe_comm="all-gather")


ENGINE_DERIVED_DEPLOYMENT_FIELDS = ("moe_comm", "lm_head", "shared_experts", "model_code")


@dataclass(frozen=True)
class AttentionSplit:
    """The split of attention a layer's operations are built from: its TP degree (the number of
    attention-DP replicas shapes no kernel of a GPU)."""

    tp: int


@dataclass(frozen=True)
class FfnSplit:
    """The split of the FFN / experts a layer's operations are built from: TP and EP degrees (the
    number of FFN replicas shapes no kernel of a GPU)."""

    tp: int
    ep: int


@hash_kept  # a key of several pieces of every plan (see hash_kept)
@dataclass(frozen=True)
class MixerDeployment:
    """The part of a deployment a layer's mixer (attention, linear attention) is built from: what
    its builders (infersim.modules.attention, .linear_attention) may read. They are given this
    record, not the deployment, so that a plan piece kept on its builder's inputs
    (infersim.costing.memo) covers every field the builder reads: reading another one fails."""

    attention: AttentionSplit
    precision: Precision
    model_code: ModelCode

    @classmethod
    def of(cls, dep: Deployment) -> MixerDeployment:
        return cls(AttentionSplit(dep.attention.tp), dep.precision, dep.model_code)


@hash_kept
@dataclass(frozen=True)
class FfnDeployment:
    """The part of a deployment a layer's FFN (dense or MoE, with the collective after attention)
    is built from: what infersim.modules.ffn's builders may read (see MixerDeployment)."""

    attention: AttentionSplit
    ffn: FfnSplit
    precision: Precision
    model_code: ModelCode
    moe_comm: str
    moe: MoeBalanceSpec
    shared_experts: str

    @classmethod
    def of(cls, dep: Deployment) -> FfnDeployment:
        return cls(AttentionSplit(dep.attention.tp), FfnSplit(dep.ffn.tp, dep.ffn.ep), dep.precision, dep.model_code,
                   dep.moe_comm, dep.moe, dep.shared_experts)


def dense_ffn_tp(dep: Deployment | FfnDeployment) -> int:
    """The TP degree of dense FFN layers (a dense model's FFN, an MoE model's dense layers): ffn.tp,
    or the attention TP group where the FFN layout is narrower than it. Engines that run attention
    TP with the routed experts on EP inside the same GPUs (SGLang --tp 8 --ep 8, vLLM
    --tensor-parallel-size 8 --enable-expert-parallel, TensorRT-LLM tp 8 moe_ep 8 without attention
    DP) keep the dense layers and shared experts TP-sharded over that group."""
    return max(dep.ffn.tp, dep.attention.tp)


def attention_dp(dep: Deployment) -> int:
    """The attention-DP size a deployment names or implies: its stage's GPUs over attention TP
    (complete_layout checks that they divide)."""
    return dep.attention.dp or dep.gpus_per_stage // dep.attention.tp


def dp_replicas(dep: Deployment) -> bool:
    """Attention-DP ranks that each own an FFN group (FFN TP x EP = attention TP): independent copies of
    the model, no token crossing between them (vLLM --data-parallel-size on a dense model, SGLang --dp
    without --enable-dp-attention), unlike DP attention, where the ranks share the FFN group."""
    return attention_dp(dep) > 1 and dep.ffn.tp * dep.ffn.ep == dep.attention.tp


def dp_attention_ranks(dep: Deployment) -> int:
    """The attention-DP ranks that run DP attention, sharing an FFN group: 1 for DP replicas (or no DP).
    Engines divide a server-wide token budget by it (SGLang under --enable-dp-attention), and a
    server's TP size (SGLang's tp_size, which its CUDA-graph limits go by) is attention TP times it."""
    return 1 if dp_replicas(dep) else attention_dp(dep)


def server_tp(dep: Deployment) -> int:
    """One engine server's TP size per pipeline stage (SGLang's tp_size): attention TP x the DP-attention
    ranks; a DP replica's own attention TP group."""
    return dep.attention.tp * dp_attention_ranks(dep)


def named_deployment_fields(raw: Any) -> frozenset[str]:
    """The engine-derived deployment fields a run's deployment section names itself, and its
    precision fields as precision.<field> (the rest follow the checkpoint: with_checkpoint_precision)."""
    if not isinstance(raw, dict):
        return frozenset()
    precision = raw.get("precision")
    named = {f"precision.{k}" for k in precision} if isinstance(precision, dict) else set()
    return frozenset({k for k in raw if k in ENGINE_DERIVED_DEPLOYMENT_FIELDS} | named)


def _narrower(a: str, b: str) -> str:
    """The format of fewer bytes per element (a on a tie: the one stored)."""
    from infersim.base.units import dtype_bytes

    return b if dtype_bytes(b) < dtype_bytes(a) else a


def with_checkpoint_precision(dep: Deployment, named: Collection[str], model: ModelCard, hw: HardwareCard) -> Deployment:
    """The deployment with the precision fields the run does not name taken from the model's
    checkpoint (model.quantization): GEMM inputs in the format its kernels quantise activations to
    where the GPU has that rate (else bf16, weight-only), weights and routed-expert weights as the
    checkpoint stores them, or narrower where the GEMM format is (an engine quantises online to it).
    An unquantised checkpoint changes nothing."""
    q = model.quantization
    if q is None or "precision.weights" in named:
        return dep  # a run naming the weights' format says what is loaded (expert weights follow it)
    prec = dep.precision
    changes: dict[str, Any] = {}
    gemm = prec.gemm
    if "precision.gemm" not in named and q.activations and q.activations in hw.peak.flops:
        gemm = changes["gemm"] = q.activations
    weights = changes["weights"] = _narrower(q.weights, gemm)
    if "precision.expert_weights" not in named and model.is_moe:
        expert = _narrower(q.expert_weights, prec.expert_gemm or gemm)
        if expert != weights:
            changes["expert_weights"] = expert
    if "precision.attention_weights" not in named and q.attention_weights:
        changes["attention_weights"] = q.attention_weights  # run as stored: the engine leaves them unquantised
    return evolve(dep, precision=evolve(prec, **changes))


CHECKPOINT_PRECISION_FIELDS = ("gemm", "weights", "expert_weights", "attention_weights")


def without_checkpoint_precision(dep: Deployment, named: Collection[str]) -> Deployment:
    """The deployment with the precision fields with_checkpoint_precision may have set, and the run
    did not name, back at their defaults (a sweep derives them again for each variant's model and GPU)."""
    defaults: dict[str, Any] = {f.name: f.default for f in fields(Precision)}
    reset = {name: defaults[name] for name in CHECKPOINT_PRECISION_FIELDS if f"precision.{name}" not in named}
    return evolve(dep, precision=evolve(dep.precision, **reset)) if reset else dep



def with_engine_defaults(dep: Deployment, named: Collection[str], model: ModelCard, engine: EngineCard) -> Deployment:
    """The deployment with the fields not in `named` that follow the layout or the engine set
    afresh (a sweep derives them again for every variant): moe_comm (all-gather when the experts
    are TP-sharded, the only path such experts can take, or when the engine runs all-to-all only
    past top-k EP ranks, or only under attention DP, and the layout has neither; else the engine's
    default MoE path, else all-to-all), lm_head (the engine's LM head under attention DP; per-rank
    for DP replicas, which run none) and
    shared_experts (where the engine puts shared experts on the gathered MoE path)."""
    if "moe_comm" not in named:
        comm: MoeComm
        if model.is_moe and dep.ffn.tp > 1:
            comm = "all-gather"
        elif model.is_moe and engine.all_to_all_needs_ep_above_topk and dep.ffn.ep <= model.num_experts_per_tok:
            comm = "all-gather"
        elif model.is_moe and engine.all_to_all_needs_attention_dp and attention_dp(dep) <= 1:
            comm = "all-gather"
        else:
            comm = engine.moe_comm or DEFAULT_MOE_COMM
        if comm != dep.moe_comm:
            dep = evolve(dep, moe_comm=comm)
    if "lm_head" not in named:
        # replicas run no DP attention: each computes its own logits, whatever the engine does under DP attention
        lm_head = "per-rank" if dp_replicas(dep) else engine.lm_head_under_attention_dp
        if dep.lm_head != lm_head:
            dep = evolve(dep, lm_head=lm_head)
    if "shared_experts" not in named and dep.shared_experts != engine.shared_experts_under_gather:
        dep = evolve(dep, shared_experts=engine.shared_experts_under_gather)
    if "model_code" not in named and dep.model_code != engine.model_code:
        dep = evolve(dep, model_code=engine.model_code)
    return dep


def _fits_text(group: int, gpus: int) -> str:
    return "is more than" if group > gpus else "does not divide"


def _check_experts(dep: Deployment, model: ModelCard, fail: Any) -> None:
    """Expert parallelism, redundant experts and the MoE path against the model (checked before the LM
    head, whose divisibility an impossible EP would otherwise be blamed on)."""
    balance, ffn = dep.moe, dep.ffn
    if model.is_moe:
        redundant = balance.redundant_experts
        slots = model.num_experts + redundant
        if redundant and balance.load_balance == "statistical":
            raise fail("deployment.moe.redundant_experts", redundant,
                       "redundant experts are placed by EPLB: set deployment.moe.load_balance: eplb")
        if ffn.ep > slots:
            raise fail("deployment.ffn.ep", ffn.ep, f"larger than the model's {model.num_experts} experts"
                       + (f" + {redundant} redundant" if redundant else "")
                       + " (deployment.moe.redundant_experts adds expert slots)")
        try:
            shard(slots, ffn.ep, "expert slots", "deployment.ffn.ep")
        except LayoutError:
            what = (f"expert slots = {model.num_experts} experts + {redundant} redundant = {slots}" if redundant
                    else f"{model.name}'s {model.num_experts} experts")
            raise fail("deployment.moe.redundant_experts" if redundant else "deployment.ffn.ep",
                       redundant if redundant else ffn.ep,
                       f"{what} do not divide by deployment.ffn.ep ({ffn.ep}): every EP rank holds the same "
                       "number of expert slots (redundant experts, with load_balance: eplb, add slots)") from None
        try:
            shard(model.moe_intermediate_size, ffn.tp, "moe_intermediate_size", "ffn.tp")
        except LayoutError as exc:
            raise fail("deployment.ffn", {"tp": ffn.tp, "ep": ffn.ep}, str(exc)) from None
        if redundant > model.num_experts * (ffn.ep - 1):
            # past a copy of every expert on every EP rank a replica has nowhere to go; EPLB would still
            # walk every slot before the memory check
            raise fail("deployment.moe.redundant_experts", redundant,
                       f"more than {model.num_experts * (ffn.ep - 1):,} = {model.num_experts} experts x (EP {ffn.ep} - 1): "
                       "past a copy of every expert on every EP rank a replica has nowhere to go")
        if ffn.tp > 1 and dep.moe_comm != "all-gather":
            # a TP-sharded expert needs every token of its TP group; exchanges only move routed copies
            raise fail("deployment.moe_comm", dep.moe_comm,
                       f"expert TP (ffn.tp = {ffn.tp}) needs moe_comm: all-gather, which brings every token "
                       "of the FFN group to each shard")
    elif ffn.ep > 1:
        raise fail("deployment.ffn.ep", ffn.ep, f"expert parallelism needs an MoE model ({model.name} is dense)")
    elif balance.redundant_experts:
        raise fail("deployment.moe.redundant_experts", balance.redundant_experts,
                   f"redundant experts need an MoE model ({model.name} is dense)")


def _check_machine(dep: Deployment, model: ModelCard, hw: HardwareCard, fail: Any) -> int:
    """Nodes and pipeline stages against the GPUs, the layers and the machine; the GPUs of a stage."""
    try:
        per_node = shard(dep.num_gpus, dep.num_nodes, "deployment.num_gpus", "deployment.num_nodes")
    except LayoutError as exc:
        raise fail("deployment.num_nodes", dep.num_nodes, str(exc)) from None
    try:
        per_stage = shard(dep.num_gpus, dep.pp, "deployment.num_gpus", "deployment.pp")
        shard(model.num_hidden_layers, dep.pp, f"{model.name}'s num_hidden_layers", "deployment.pp")
    except LayoutError as exc:
        raise fail("deployment.pp", dep.pp, str(exc)) from None
    if per_node > hw.peak.gpus_per_node:
        raise fail("deployment.num_nodes", dep.num_nodes,
                   f"{per_node} GPUs per node, but a {hw.name} node holds {hw.peak.gpus_per_node}")
    # the links a layout talks over must exist (a zero bandwidth would divide by zero); inside a node,
    # GPUs without NVLink talk over PCIe, whose card facts are asked for where a collective is priced
    # (infersim.modules.comm.intra_node_link): a layout of data-parallel ranks alone needs none
    if dep.num_nodes > 1 and not hw.peak.network_bandwidth > 0:
        raise fail("deployment.num_nodes", dep.num_nodes, f"{dep.num_nodes} nodes talk over the network, but hardware "
                   f"card {hw.name} has no NIC (peak.network_bandwidth is 0)")
    return per_stage


def _check_groups(dep: Deployment, per_stage: int, fail: Any) -> tuple[int, int]:
    """Attention TP x DP and FFN TP x EP x DP against the GPUs of a stage; the (derived) DP sizes."""
    attn, ffn = dep.attention, dep.ffn
    attn_dp = attention_dp(dep)
    stage_text = f"the {per_stage} GPUs of a pipeline stage (num_gpus {dep.num_gpus} / pp {dep.pp})"
    if attn.tp * attn_dp != per_stage:
        if not attn.dp:  # dp follows from tp: say what tp cannot do, not 'dp 0'
            raise fail("deployment.attention.tp", attn.tp, f"{_fits_text(attn.tp, per_stage)} {stage_text}")
        raise fail("deployment.attention", {"tp": attn.tp, "dp": attn.dp}, f"tp x dp must equal {stage_text}")
    ffn_dp = ffn.dp or per_stage // (ffn.tp * ffn.ep)
    if ffn.tp * ffn.ep * ffn_dp != per_stage:
        if not ffn.dp:
            raise fail("deployment.ffn", {"tp": ffn.tp, "ep": ffn.ep},
                       f"tp x ep = {ffn.tp * ffn.ep} {_fits_text(ffn.tp * ffn.ep, per_stage)} {stage_text}")
        raise fail("deployment.ffn", {"tp": ffn.tp, "ep": ffn.ep, "dp": ffn.dp}, f"tp x ep x dp must equal {stage_text}")
    return attn_dp, ffn_dp


def _check_heads(model: ModelCard, tp: int, fail: Any) -> None:
    try:
        shard(model.num_attention_heads, tp, "num_attention_heads", "attention.tp")
        if not model.is_mla:  # MLA's one latent KV head is replicated, GQA's KV heads are split
            heads_per_rank(model.num_key_value_heads, tp)
        kinds = set(model.layer_kinds)
        if "linear_attention" in kinds:
            shard(model.linear_num_value_heads, tp, "linear_num_value_heads", "attention.tp")
            heads_per_rank(model.linear_num_key_heads, tp, "linear_num_key_heads")
        if "mamba" in kinds:
            shard(model.mamba_heads, tp, "Mamba-2 heads", "attention.tp")
            heads_per_rank(model.mamba_n_groups, tp, "mamba_n_groups")
    except LayoutError as exc:
        raise fail("deployment.attention.tp", tp, str(exc)) from None


def _check_ffn_groups(dep: Deployment, model: ModelCard, fail: Any) -> None:
    """The dense FFN's TP and the expert group against the attention TP group."""
    attn, ffn = dep.attention, dep.ffn
    if model.num_dense_layers:
        dense_tp = dense_ffn_tp(dep)
        try:
            shard(model.intermediate_size, dense_tp, "intermediate_size",
                  "ffn.tp" if dense_tp == ffn.tp else "attention.tp (the dense FFN layers' TP)")
        except LayoutError as exc:
            raise fail("deployment.ffn.tp", ffn.tp, str(exc)) from None
    if ffn.tp < attn.tp and model.num_dense_layers and not model.is_moe:
        raise fail("deployment.ffn.tp", ffn.tp,
                   f"smaller than attention.tp ({attn.tp}); a TP FFN must span at least the attention TP group")
    if ffn.tp < attn.tp and model.is_moe and ffn.tp * ffn.ep < attn.tp:
        raise fail("deployment.ffn", {"tp": ffn.tp, "ep": ffn.ep},
                   f"tp x ep smaller than attention.tp ({attn.tp}): the experts of an attention-TP group must be "
                   "spread over at least its GPUs (e.g. ffn.ep = attention.tp with ffn.tp 1: experts over EP inside "
                   "the attention TP group, dense layers TP-sharded over it)")
    if model.is_moe and dep.moe_comm == "all-gather" and ffn.tp * ffn.ep < attn.tp:
        raise fail("deployment.ffn", {"tp": ffn.tp, "ep": ffn.ep},
                   f"tp x ep smaller than attention.tp ({attn.tp}): gathered tokens (moe_comm all-gather) need an "
                   "expert group spanning at least the attention TP group")


def _check_formats(dep: Deployment, model: ModelCard, hw: HardwareCard, fail: Any) -> None:
    if dep.precision.gemm not in hw.peak.flops:
        raise fail("deployment.precision.gemm", dep.precision.gemm,
                   f"{hw.name} has no {dep.precision.gemm} tensor-core rate (it has: {', '.join(sorted(hw.peak.flops))})")
    expert_gemm = dep.precision.expert_gemm
    if expert_gemm is not None and expert_gemm not in hw.peak.flops:
        raise fail("deployment.precision.expert_gemm", expert_gemm,
                   f"{hw.name} has no {expert_gemm} tensor-core rate (it has: {', '.join(sorted(hw.peak.flops))})")
    if model.is_sparse_attention and "fp8" not in hw.peak.flops:
        raise fail("model.index_topk", model.index_topk,
                   f"DSA's indexer runs in fp8, but {hw.name} has no fp8 tensor-core rate")


def complete_layout(dep: Deployment, model: ModelCard, hw: HardwareCard, source: str) -> Deployment:
    """Fill derived DP sizes and check that the layout fits the model and the machine."""
    def fail(field: str, value: Any, problem: str) -> ConfigError:
        return ConfigError(source, field, value, problem)

    per_stage = _check_machine(dep, model, hw, fail)
    attn_dp, ffn_dp = _check_groups(dep, per_stage, fail)
    attn, ffn = dep.attention, dep.ffn
    _check_heads(model, attn.tp, fail)
    _check_experts(dep, model, fail)
    if dep.lm_head == "gathered" and attn_dp > 1 and not model.tie_word_embeddings:
        if dp_replicas(evolve(dep, attention=evolve(attn, dp=attn_dp))):
            raise fail("deployment.lm_head", dep.lm_head,
                       f"a gathered LM head gathers the tokens of attention-DP ranks that share an FFN group; "
                       f"attention DP{attn_dp} with FFN TP x EP = attention TP ({attn.tp}) is {attn_dp} independent "
                       "replicas, each computing its own logits (lm_head: per-rank)")
        try:
            shard(model.vocab_size, attn.tp * attn_dp, "vocab_size", "attention.tp x attention.dp")
        except LayoutError as exc:
            raise fail("deployment.lm_head", dep.lm_head,
                       f"a gathered LM head splits the vocab over every attention-DP rank: {exc} (lm_head: per-rank "
                       "computes each rank's own logits)") from None
    _check_ffn_groups(dep, model, fail)
    _check_formats(dep, model, hw, fail)
    if attn.dp == attn_dp and ffn.dp == ffn_dp:  # a layout that names its DP sizes (a searched one)
        return dep
    return evolve(dep, attention=evolve(attn, dp=attn_dp), ffn=evolve(ffn, dp=ffn_dp))
