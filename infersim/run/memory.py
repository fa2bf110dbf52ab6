"""Memory accounting per GPU: weights, KV cache per token, KV capacity and the largest decode batch.

What one request keeps, per layer kind: full attention (and DSA) layers one KV entry per token of
context (DSA adds its fp8 index key); sliding-window and chunked layers at most `sliding_window` or
`attention_chunk_size` entries (a chunked layer's whole chunk, the most a request holds there);
linear-attention / Mamba-2 layers a constant recurrent state plus conv state. The first grows
with the context (`kv_bytes_per_token`), the rest is bounded (`bounded_bytes_per_request`).
A speculative drafter (draft model or MTP layers) adds its weights and its own cache.
With deployment.weight_offload auto, the weights that do not fit beside the reserve and the KV cache
the workload needs are kept in host memory (see infersim.costing.weight_offload); the KV space is what the
resident weights leave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infersim.cards.engine import EngineCard
from infersim.cards.engine_scheduler import tier_value
from infersim.cards.hardware import HardwareCard
from infersim.cards.model import (ATTENTION_KINDS, CHUNKED_ATTENTION, FULL_ATTENTION, LOCAL_KINDS, SLIDING_ATTENTION,
                                  ModelCard)
from infersim.cards.deployment import Deployment, Workload, dense_ffn_tp, dp_attention_ranks
from infersim.modules.attention import attention_weight_params, kv_bytes_per_token_per_layer
from infersim.modules.ffn import ffn_weight_params, routed_expert_params
from infersim.modules.linear_attention import linear_mixer_weight_params, state_bytes_per_request_per_layer
from infersim.modules.step import layer_composition, lm_head_gathered_dp
from infersim.base.records import evolve
from infersim.base.units import ACT_BYTES, dtype_bytes

if TYPE_CHECKING:  # weight offload's and speculative decoding's modules are imported by the runs that use them
    from infersim.costing.weight_offload import WeightOffload
    from infersim.run.draft_memory import DraftMemory
    from infersim.run.memory_pools import StatePool, WindowPool

EMBEDDING_BYTES = 2.0  # embeddings, LM head and norms stay in bf16 in every serving engine we model


def pool_token_bytes(kv_gpu: float, pool: WindowPool | None) -> float:
    """Bytes one token of the engine's KV pool takes on one GPU: the full-attention layers' KV, and
    under a hybrid sliding-window pool the ratio's share of the sliding-window layers' KV."""
    return kv_gpu if pool is None else kv_gpu + pool.ratio * pool.bytes_per_token_per_gpu


def _unpooled_bytes(bounded_gpu: float, pool: WindowPool | None) -> float:
    """The bounded cache of a request outside a hybrid sliding-window pool (recurrent and conv
    states; all of it where there is no such pool)."""
    return bounded_gpu if pool is None else bounded_gpu - pool.request_tokens * pool.bytes_per_token_per_gpu


def request_bytes(context: int, kv_gpu: float, bounded_gpu: float, pool: WindowPool | None) -> float:
    """KV space a request of `context` tokens takes on one GPU at its end: its context's KV and its
    bounded cache; under a hybrid sliding-window pool, the pool tokens of its context or of its window
    (which is the ratio's share of the pool), whichever fills the pool first, and the rest."""
    if pool is None:
        return context * kv_gpu + bounded_gpu
    tokens = max(context, pool.request_tokens / pool.ratio)
    return tokens * pool_token_bytes(kv_gpu, pool) + _unpooled_bytes(bounded_gpu, pool)


def window_pool(model: ModelCard, engine: EngineCard | None, dep: Deployment, context: int) -> WindowPool | None:
    """The engine's hybrid sliding-window pool for this model (None: the engine has none, or the
    model has not both full-attention and sliding-window or chunked layers: SGLang 0.5.23 pools
    Llama-4's chunked layers as windows of the chunk, configs/model_config.py:2651-2708
    is_hybrid_swa_model, get_hybrid_layer_ids)."""
    ratio = engine.memory.sliding_window_pool_ratio if engine is not None else 0.0
    if not ratio:
        return None
    local = sum(model.layer_count(kind) for kind in LOCAL_KINDS)
    if not local or FULL_ATTENTION not in model.layer_kinds:
        return None
    from infersim.run.memory_pools import WindowPool  # only a model and engine that pool so pay for the record

    per_token = local * kv_bytes_per_token_per_layer(model, dep.precision.kv_cache, dep.attention.tp) / dep.pp
    return WindowPool(ratio, per_token, min(context, model.local_window))


def state_pool(model: ModelCard, engine: EngineCard | None, dep: Deployment, capacity: float) -> StatePool | None:
    """The engine's state pool for this model out of `capacity` bytes of KV space per GPU (None: the
    engine keeps no such pool, or the model has no recurrent layers). Sized by a share of the memory,
    the pool holds as many whole slots as fit, the card's padding slots among them."""
    rule = engine.memory.recurrent_state_pool if engine is not None else None
    if rule is None or not model.recurrent_kinds or capacity <= 0:
        return None
    from infersim.run.memory_pools import StatePool  # only a model and engine that pool so pay for the record

    slot = sum(model.layer_count(kind) * state_bytes_per_request_per_layer(model, kind, dep.attention.tp)
               for kind in model.recurrent_kinds) / dep.pp
    if rule.slots:  # a server's slots, split over its attention-DP schedulers
        slots = rule.slots // max(1, dep.attention.dp)
        return StatePool(slots, slot, rule.slots_per_request, (slots + rule.padding_slots) * slot)
    whole = int(capacity * rule.memory_ratio / (1 + rule.memory_ratio) // slot)
    return StatePool(max(0, whole - rule.padding_slots), slot, rule.slots_per_request, whole * slot)


@dataclass(frozen=True)
class MemoryResult:
    """Per-GPU memory of a run: weights, KV per token, KV capacity and the decode batch it holds."""

    weights_bytes: float  # per GPU, resident and offloaded (see weight_offload)
    kv_bytes_per_token: float  # one token's KV over all full-attention layers, whole model (unsharded), drafter included
    kv_bytes_per_token_per_gpu: float  # what one request's token occupies on one GPU (drafter included)
    hbm_bytes: float
    reserved_bytes: float
    kv_capacity_bytes: float  # HBM left for KV per GPU (negative: weights do not fit)
    request_context: int  # tokens one request holds at its end (ISL + OSL)
    max_batch_per_gpu: int  # requests per GPU whose full context fits, within the engine's running-request cap
    # cache that stops growing (sliding-window KV up to the window, recurrent and conv states) of
    # one request at its end: whole model, and on one GPU
    bounded_bytes_per_request: float = 0.0
    bounded_bytes_per_request_per_gpu: float = 0.0
    # the speculative drafter's share of weights_bytes and kv_bytes_per_token_per_gpu (included there;
    # its unsharded KV is included in kv_bytes_per_token too)
    draft_weights_bytes: float = 0.0
    draft_kv_bytes_per_token_per_gpu: float = 0.0
    activation_bytes: float = 0.0  # activations of one prefill step of `prefill_step_tokens` (part of reserved_bytes)
    prefill_step_tokens: int = 0  # the chunk the activations are sized for
    kv_fit_batch_per_gpu: int = 0  # requests per GPU whose full context fits in the KV cache
    running_cap_per_gpu: int = 0  # the engine's running-request cap per GPU (0 = none)
    binding_limit: str = ""  # what sets max_batch_per_gpu: "kv cache", "running-request cap", "weights"
    # deployment.weight_offload auto: the weights kept in host memory (None: every weight in HBM)
    weight_offload: WeightOffload | None = None
    # the engine's hybrid sliding-window pool (None: it keeps the window's KV alone)
    window_pool: WindowPool | None = None
    # the engine's pool of recurrent-state slots, set aside before kv_capacity_bytes (None: none)
    state_pool: StatePool | None = None
    encoder_weights_bytes: float = 0.0  # the multimodal encoder's share of weights_bytes (included there)

    @property
    def offloaded_weights_bytes(self) -> float:
        return self.weight_offload.bytes_per_gpu if self.weight_offload is not None else 0.0

    @property
    def resident_weights_bytes(self) -> float:
        """Weights in HBM: what the KV capacity is left from."""
        return self.weights_bytes - self.offloaded_weights_bytes

    @property
    def pool_token_bytes_per_gpu(self) -> float:
        """What the engine allots one token of its KV pool on one GPU (request_bytes)."""
        return pool_token_bytes(self.kv_bytes_per_token_per_gpu, self.window_pool)

    @property
    def request_bytes_per_gpu(self) -> float:
        """KV space one request of request_context tokens takes on one GPU at its end (request_bytes;
        its states are in the state pool where the engine keeps one)."""
        return request_bytes(self.request_context, self.kv_bytes_per_token_per_gpu, self._bounded_in_kv,
                             self.window_pool)

    @property
    def _bounded_in_kv(self) -> float:
        """The bounded cache of a request that lives in the KV space: all of it, but its states where
        the engine keeps them in a state pool."""
        pool = self.state_pool
        return self.bounded_bytes_per_request_per_gpu - (pool.slot_bytes_per_gpu if pool is not None else 0.0)

    def pool_tokens(self, page: int) -> int | None:
        """Tokens the KV pool of one scheduler (an attention-DP rank) holds, in whole pages of `page`
        tokens: the KV space over what a token takes on one GPU, the bounded cache of a request of
        request_context tokens spread over its tokens (the serving simulator's pool; under a hybrid
        sliding-window pool, what such a request takes of it, request_bytes); 0 where no KV space is
        left, None where no cache grows with the context (no bound in tokens)."""
        if self.window_pool is None:
            per_token = self.kv_bytes_per_token_per_gpu + self._bounded_in_kv / max(1, self.request_context)
        else:
            per_token = self.request_bytes_per_gpu / max(1, self.request_context)
        if per_token <= 0:
            return None
        return int(max(0.0, self.kv_capacity_bytes) / per_token) // page * page

    @property
    def fits(self) -> bool:
        offload = self.weight_offload
        return (self.kv_capacity_bytes > 0 and self.max_batch_per_gpu >= 1
                and (offload is None or (offload.fits_pool and offload.fits_host)))


def hybrid_groups(model: ModelCard, larger_below: float | None) -> tuple[int, tuple[tuple[str, int], ...]]:
    """(layers per group, (attention kind, groups of it) for each kind the model has) as a hybrid KV
    allocator groups a model's attention layers: each kind's layers in groups of the smaller kind's
    count, or of the larger kind's where it is under `larger_below` times the smaller (None: always
    the smaller's), the last group of a kind padded with empty layers (engine card
    memory.hybrid_group_of_larger_below). A model of one kind is one group of all its layers."""
    counts = [(kind, model.layer_count(kind)) for kind in ATTENTION_KINDS if model.layer_count(kind)]
    if not counts:  # no attention layers: no groups
        return 0, ()
    smallest, largest = min(n for _, n in counts), max(n for _, n in counts)
    group = largest if larger_below is not None and largest < larger_below * smallest else smallest
    return group, tuple((kind, -(-n // group)) for kind, n in counts)


def _blocks(memory: MemoryResult, model: ModelCard, dep: Deployment, page: int, slots: int) -> int:
    """Blocks of `page` tokens the KV space holds, a block one page of `slots` layers (and of the drafter's)."""
    per_token = (slots * kv_bytes_per_token_per_layer(model, dep.precision.kv_cache, dep.attention.tp) / dep.pp
                 + memory.draft_kv_bytes_per_token_per_gpu)
    return int(max(0.0, memory.kv_capacity_bytes) / (per_token * page))


def reported_pool_tokens(memory: MemoryResult, model: ModelCard, dep: Deployment, page: int,
                         larger_below: float | None) -> int | None:
    """The KV pool vLLM reports as it starts ("GPU KV cache size: N tokens", 0.11 and 0.15):
    num_blocks // groups x block_size, a block one page of every layer of a group (hybrid_groups: the
    padding layers included) and of the drafter's layers, on one GPU of the pipeline stage (vLLM
    0.15.1 vllm/v1/core/kv_cache_utils.py:1017-1064 grouping, 829-843 get_num_blocks, 1285-1294
    _report_kv_cache_config). None for a model with recurrent layers: its states are not tokens."""
    if model.recurrent_kinds:
        return None
    group, groups = hybrid_groups(model, larger_below)
    return _blocks(memory, model, dep, page, sum(n for _, n in groups) * group) * page


def logged_pool_tokens(memory: MemoryResult, model: ModelCard, dep: Deployment, engine: EngineCard,
                       hw: HardwareCard) -> int | None:
    """The KV pool the engine logs as it starts, for a server of this memory (reported_pool_tokens, in
    the pages of its attention backend on this GPU), the tokens of the max_model_len-token requests it
    holds (capacity_at_max_model_len), its pool's tokens in whole pages (SGLang's
    max_total_num_tokens) or its primary pool's blocks in tokens (TensorRT-LLM), as the engine card's
    memory.logged_kv_cache_size says. None where the engine logs no such count, no KV space is left,
    or the model's states are not tokens."""
    logged = engine.memory.logged_kv_cache_size
    if logged == "none" or memory.kv_capacity_bytes <= 0:
        return None
    page = engine.page_size(hw, model.is_mla)
    if logged == "max_total_num_tokens":
        # SGLang: the KV space over a token's cells, cut to whole pages (0.5.2 model_executor/model_runner.py
        # profile_max_num_token and :1297-1300; 0.5.23 model_executor/pool_configurator.py:638-647); a
        # drafter's cache is sized beside it (not reproduced)
        token_bytes = memory.pool_token_bytes_per_gpu
        if token_bytes <= 0 or memory.draft_kv_bytes_per_token_per_gpu:
            return None
        return int(memory.kv_capacity_bytes // token_bytes) // page * page
    if logged == "max_tokens_in_paged_kv_cache":
        # TensorRT-LLM: blocks in the primary pool x tokens per block (cpp/tensorrt_llm/batch_manager/
        # kvCacheManager.cpp KVCacheManager::allocatePools); a model of several attention windows has a
        # pool per window, and a drafter's cache its own manager (neither reproduced)
        if set(model.layer_kinds) != {FULL_ATTENTION} or model.is_sparse_attention \
                or memory.draft_kv_bytes_per_token_per_gpu:
            return None
        return reported_pool_tokens(memory, model, dep, page, None)
    larger_below = engine.memory.hybrid_group_of_larger_below
    if logged == "pool":
        return reported_pool_tokens(memory, model, dep, page, larger_below)
    # vLLM 0.33 config/vllm.py max_concurrent_batches: pp + 1 under async scheduling (model runner
    # V2, its default), else pp; max_in_flight_tokens: that many steps of max_num_batched_tokens
    steps = dep.pp + 1 if engine.overheads.overlap_scheduler else dep.pp
    return capacity_at_max_model_len(memory, cache_view(model, engine), dep, page, larger_below,
                                     steps * engine.chunk_tokens(hw.peak.hbm_bytes))


def _request_blocks(model: ModelCard, kind: str, context: int, page: int, in_flight: int) -> int:
    """Blocks one max_model_len request (`context` tokens) takes in a group of `kind`, vLLM 0.33
    v1/kv_cache_interface.py: full attention cdiv(context, page) (:643-648); a sliding window its
    window - 1 tokens and the in-flight ones, in blocks, and one more for a window that does not start
    at a block (:919-944); a chunk its chunk and the in-flight tokens (:864-881); none above the context."""
    if kind == SLIDING_ATTENTION:
        return -(-min(model.sliding_window - 1 + in_flight, context) // page) + 1
    if kind == CHUNKED_ATTENTION:
        return -(-min(model.attention_chunk_size + in_flight, context) // page)
    return -(-context // page)


def capacity_at_max_model_len(memory: MemoryResult, model: ModelCard, dep: Deployment, page: int,
                              larger_below: float | None, in_flight: int) -> int | None:
    """vLLM 0.33's "GPU KV cache size": int(num_blocks / blocks per max_model_len request x
    max_model_len), its max_model_len the model's context (its default), a request's blocks summed
    over the groups (hybrid_groups; _request_blocks: a sliding-window or chunked group's bounded by
    the `in_flight` tokens of the steps scheduled but not settled) (vllm 0.33.0
    v1/core/kv_cache_utils.py:1061-1154). `model` as the engine's cache holds it (cache_view). None
    for a model with recurrent layers or a DSA indexer (their groups are not reproduced), for a hybrid
    model with a drafter (its layers join the groups), without a stated context, or whose pool holds
    no such request (the server refuses to start)."""
    context = model.max_position_embeddings
    if model.recurrent_kinds or model.is_sparse_attention or not context:
        return None
    group, groups = hybrid_groups(model, larger_below)
    if len(groups) > 1 and memory.draft_kv_bytes_per_token_per_gpu:
        return None
    per_request = sum(n * _request_blocks(model, kind, context, page, in_flight) for kind, n in groups)
    blocks = _blocks(memory, model, dep, page, group)
    if blocks < per_request:
        return None
    return int(blocks / per_request * context)


def mixer_weight_params(model: ModelCard, kind: str, attention_tp: int) -> float:
    """Mixer (attention or linear-attention / Mamba-2) parameters of one layer of `kind` on one GPU."""
    if kind in ATTENTION_KINDS:
        return attention_weight_params(model, attention_tp)
    return linear_mixer_weight_params(model, kind, attention_tp)


def _layer_params(model: ModelCard, dep: Deployment) -> tuple[float, float, float]:
    """(linear-layer parameters but routed experts, routed-expert parameters, the mixers' share of
    the first) per GPU of one pipeline stage, summed over the layer kinds."""
    dense, moe = ffn_weight_params(model, dep)
    routed = routed_expert_params(model, dep) if model.is_moe else 0.0
    linear = experts = mixers = 0.0
    for kind, is_moe, layers in layer_composition(model):
        per_stage = layers / dep.pp
        mixer = mixer_weight_params(model, kind, dep.attention.tp)
        mixers += per_stage * mixer
        if is_moe:
            linear += per_stage * (mixer + moe - routed)
            experts += per_stage * routed
        else:
            linear += per_stage * (mixer + dense)
    return linear, experts, mixers


def total_parameters(model: ModelCard) -> float:
    """All parameters of the model (unsharded), embeddings included; MTP modules are not."""
    one = Deployment(num_gpus=1)
    linear, experts, _mixers = _layer_params(model, one)
    norms = 2 * model.hidden_size * model.num_hidden_layers
    embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    return linear + experts + norms + embed


def weights_per_gpu(model: ModelCard, dep: Deployment) -> float:
    linear, experts, mixers = _layer_params(model, dep)
    norms = 2 * model.hidden_size * model.num_hidden_layers / dep.pp
    vocab_rows = model.vocab_size / dep.attention.tp * model.hidden_size
    # with PP the first stage holds the embedding and the last the LM head; report the larger. A
    # gathered LM head (deployment.lm_head) splits its vocab over every attention-DP rank too.
    head_rows = vocab_rows / lm_head_gathered_dp(model, dep)
    embed = vocab_rows if model.tie_word_embeddings or dep.pp > 1 else vocab_rows + head_rows
    prec = dep.precision
    weights = (linear * dtype_bytes(prec.weight_dtype) + experts * dtype_bytes(prec.expert_weight_dtype)
               + (norms + embed) * EMBEDDING_BYTES)
    extra = dtype_bytes(prec.attention_weight_dtype) - dtype_bytes(prec.weight_dtype)
    if extra:  # the attention projections in a format of their own (a checkpoint that leaves them unquantised)
        weights += extra * mixers
    return weights


def encoder_weights_per_gpu(model: ModelCard, dep: Deployment, engine: EngineCard | None) -> float:
    """The checkpoint's multimodal encoder (model card encoder_params, 16-bit) on one GPU, where the
    engine loads it: split over the attention-TP group (vLLM's default mm_encoder_tp_mode "weights"
    shards its linear layers over TP), on every pipeline stage (vLLM and SGLang build the tower on
    every rank whatever its stage: model_executor/models/mllama4.py, srt/models/mllama4.py). 0 without an encoder,
    without an engine card, or where the card says the engine leaves it unloaded or does not say
    (encoder_note)."""
    if not model.encoder_params or engine is None or not engine.memory.loads_encoder \
            or model.encoder_architecture in engine.memory.encoder_off_for:
        return 0.0
    return model.encoder_params * EMBEDDING_BYTES / dep.attention.tp


def encoder_note(model: ModelCard, engine: EngineCard | None) -> list[str]:
    """What a run says when the model has an encoder whose loading the engine card does not state
    (not counted); [] otherwise."""
    if not model.encoder_params or engine is None or engine.memory.loads_encoder is not None:
        return []
    return [f"the checkpoint's multimodal encoder ({model.encoder_params / 1e9:,.2f}B parameters) is not counted in "
            f"memory: engine card {engine.name} {engine.version} does not say whether the engine loads it "
            "(memory.loads_encoder)"]


def mtp_weights_per_gpu(model: ModelCard, dep: Deployment) -> float:
    """The MTP modules' weights per GPU: each one transformer layer (MoE FFN when the model has
    experts) plus its input projection [embedding; hidden] -> hidden and three norms; embedding and
    LM head are shared with the model."""
    one_layer = mtp_card(model)
    linear, experts, _mixers = _layer_params(one_layer, dep)
    prec = dep.precision
    n = model.num_nextn_predict_layers
    h = model.hidden_size
    per_module = 2 * h * h * dtype_bytes(prec.weight_dtype) + (2 * h + 3 * h) * EMBEDDING_BYTES
    return n * (linear * dtype_bytes(prec.weight_dtype) + experts * dtype_bytes(prec.expert_weight_dtype)) + n * per_module


def mtp_card(model: ModelCard) -> ModelCard:
    """The model card of one MTP module: one full-attention layer (DSA when the model has it) with
    the model's MoE FFN (dense FFN for a dense model)."""
    from dataclasses import replace

    return replace(model, num_hidden_layers=1, first_k_dense_replace=0, layer_types=(), full_attention_interval=0,
                   num_nextn_predict_layers=0)


def kv_bytes_per_token(model: ModelCard, kv_dtype: str, attention_tp: int = 1) -> float:
    """Cache bytes one token of context adds over the layers whose cache grows with the context
    (full attention), on one GPU of the attention TP group (the whole model for tp = 1)."""
    return model.layer_count(FULL_ATTENTION) * kv_bytes_per_token_per_layer(model, kv_dtype, attention_tp)


def bounded_bytes_per_request(model: ModelCard, kv_dtype: str, context: int, attention_tp: int = 1) -> float:
    """Cache bytes of one request of `context` tokens that do not grow past a bound: sliding-window
    and chunked KV (min(context, window or chunk) tokens) and recurrent + conv states, on one GPU of
    the attention TP group."""
    total = 0.0
    for kind in set(model.layer_kinds) - {FULL_ATTENTION}:
        layers = model.layer_count(kind)
        if kind in LOCAL_KINDS:
            total += layers * min(context, model.local_window) * kv_bytes_per_token_per_layer(model, kv_dtype, attention_tp)
        else:
            total += layers * state_bytes_per_request_per_layer(model, kind, attention_tp)
    return total


def activation_bytes(model: ModelCard, dep: Deployment, tokens: int) -> float:
    """Peak activation memory of one forward over `tokens` tokens per GPU: the residual stream and
    its normalised copy (2 x hidden) plus the widest intermediate of a layer - the QKV output, or
    the FFN's gate+up output and its activation (3 x width on this GPU), for a routed MoE layer
    the top-k copies of every token (k x 3 x expert width, spread over the local experts) - plus
    the logits of the last position, all in the activation format. Engines free each layer's
    intermediates before the next, so one layer's worth is live at a time."""
    h = model.hidden_size
    attn_width = (model.num_attention_heads + 2 * max(model.num_key_value_heads, 1)) * max(model.head_dim, 1) \
        / dep.attention.tp
    widths = [attn_width]
    if model.intermediate_size:
        widths.append(3 * model.intermediate_size / dense_ffn_tp(dep))
    if model.is_moe:
        widths.append(3 * model.num_experts_per_tok * model.moe_intermediate_size / dep.ffn.tp
                      + 3 * model.shared_width / dep.ffn.tp)
    return tokens * dep.attention.tp * (2 * h + max(widths)) * ACT_BYTES


def offload_pool_per_layer(model: ModelCard, dep: Deployment) -> tuple[str, tuple[float, ...]]:
    """(which weights, bytes of one layer on one GPU per layer kind in layer_composition order) that
    weight offload takes its equal share of: the routed experts of every MoE layer for an MoE model,
    every layer's linear weights (mixer and FFN) for a dense one."""
    from infersim.costing.weight_offload import LAYER_WEIGHTS, ROUTED_EXPERTS

    prec = dep.precision
    composition = layer_composition(model)
    if model.is_moe:
        routed = routed_expert_params(model, dep) * dtype_bytes(prec.expert_weight_dtype)
        return ROUTED_EXPERTS, tuple(routed if is_moe else 0.0 for _kind, is_moe, _layers in composition)
    dense, _moe = ffn_weight_params(model, dep)
    linear, attention = dtype_bytes(prec.weight_dtype), dtype_bytes(prec.attention_weight_dtype)
    mixers = [mixer_weight_params(model, kind, dep.attention.tp) for kind, _is_moe, _layers in composition]
    return LAYER_WEIGHTS, tuple((mixer + dense) * linear if attention == linear else mixer * attention + dense * linear
                                for mixer in mixers)


def plan_weight_offload(model: ModelCard, hw: HardwareCard, dep: Deployment, shortfall_bytes: float) -> WeightOffload:
    """Keep `shortfall_bytes` per GPU in host memory, an equal share of every layer's pool (at most
    the whole pool: WeightOffload.fits_pool tells when that is not enough)."""
    from infersim.costing.weight_offload import WeightOffload, host_link_bytes_per_s

    pool, per_layer = offload_pool_per_layer(model, dep)
    # a GPU holds 1/pp of the layers (pipeline stages are equal)
    pool_bytes = sum(b * layers for b, (_k, _m, layers) in zip(per_layer, layer_composition(model))) / dep.pp
    fraction = min(shortfall_bytes / pool_bytes, 1.0) if pool_bytes > 0 else 0.0
    return WeightOffload(min(shortfall_bytes, pool_bytes), pool, pool_bytes, tuple(b * fraction for b in per_layer),
                         host_link_bytes_per_s(hw), hw.host_memory_bytes, shortfall_bytes)


def _pool_need(engine: EngineCard | None, hw: HardwareCard, model: ModelCard, workload: Workload) -> int:
    """Tokens of KV pool the engine's scheduler needs to run one request of the workload as asked,
    where it holds a request to its pool (engine card context_limit.kv_pool: SGLang keeps tokens of
    it free, in whole pages); 0 where it does not."""
    if engine is None or engine.context_limit.kv_pool is None:
        return 0
    return engine.context_limit.pool_for(engine.page_size(hw, model.is_mla), workload.isl, workload.osl)


def cache_view(model: ModelCard, engine: EngineCard | None) -> ModelCard:
    """The model as the engine's KV cache holds it: itself, but with its chunked layers as full
    attention where the engine keeps the whole context on them (engine card
    memory.chunked_layers_keep_context). Only the cache sees it so: the layers still attend
    within their chunks."""
    if engine is None or not engine.memory.chunked_layers_keep_context or CHUNKED_ATTENTION not in model.layer_kinds:
        return model
    kinds = tuple(FULL_ATTENTION if kind == CHUNKED_ATTENTION else kind for kind in model.layer_kinds)
    return evolve(model, layer_types=kinds, attention_chunk_size=0)


def memory_budget(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload,
                  draft: DraftMemory | None = None, engine: EngineCard | None = None,
                  prefill_step_tokens: int = 0, offload: bool = False) -> MemoryResult:
    """KV capacity as the engine sizes it: of the HBM it uses (gpu_memory_utilization), weights,
    a fixed reserve (context, graphs, NCCL buffers) and the activations of one prefill step of
    `prefill_step_tokens` (the engine's chunk, not the whole batch: engines prefill within a token
    budget) are set aside; kv_fraction_of_free of the rest holds KV. Without an engine card the
    reserve is the activations alone.
    offload: apply deployment.weight_offload (callers that also time the weight stream pass True:
    simulate, sweeps); without it every weight counts in HBM, as callers that do not time the
    stream (the serving simulator) need. With auto, the weights that leave less KV space than the
    workload needs - its decode batch (one request when the batch is 'max', two under two-batch
    overlap) or its prefill step, whichever is larger - stay in host memory."""
    encoder = encoder_weights_per_gpu(model, dep, engine)
    weights = weights_per_gpu(model, dep) + encoder
    cached = cache_view(model, engine)
    kv_model = kv_bytes_per_token(cached, dep.precision.kv_cache)
    kv_gpu = kv_bytes_per_token(cached, dep.precision.kv_cache, dep.attention.tp) / dep.pp
    context = workload.isl + workload.osl
    bounded_model = bounded_bytes_per_request(cached, dep.precision.kv_cache, context)
    bounded_gpu = bounded_bytes_per_request(cached, dep.precision.kv_cache, context, dep.attention.tp) / dep.pp
    draft_weights = draft_kv = 0.0
    if draft is not None:
        draft_weights, draft_kv = draft.weights_bytes, draft.kv_bytes_per_token_per_gpu
        weights += draft_weights
        kv_model += draft.kv_bytes_per_token
        kv_gpu += draft_kv
        bounded_model += draft.bounded_bytes_per_request
        bounded_gpu += draft.bounded_bytes_per_request_per_gpu
    step_tokens = prefill_step_tokens or workload.isl
    if engine is not None and engine.memory.activations_of_whole_budget:
        budget = engine.chunk_tokens(hw.peak.hbm_bytes, dp_attention_ranks(dep))
        step_tokens = max(step_tokens, -(-budget // dep.attention.tp))  # each GPU of the TP group runs it all
    usable = hw.peak.hbm_bytes
    kv_fraction = 1.0
    cap = 0
    if engine is not None:
        mem = engine.memory
        usable *= mem.gpu_memory_utilization
        kv_fraction = mem.kv_fraction_of_free
        activations = activation_bytes(model, dep, step_tokens)
        if mem.reserved_per_chunk_token_bytes:
            # the engine's own formula (SGLang) reserves per token of its default chunk (at least
            # 2048); a larger step than that needs at least its own activations
            engine_chunk = engine.chunk_tokens(hw.peak.hbm_bytes)
            activations = max(activations, mem.reserved_per_chunk_token_bytes * max(engine_chunk, 2048))
        reserved = max(mem.reserved_bytes + activations, tier_value(mem.reserved_min_bytes, hw.peak.hbm_bytes))
    else:
        activations = activation_bytes(model, dep, step_tokens)
        reserved = activations
    pool = window_pool(cached, engine, dep, context)
    # batch B per GPU: the attention TP group serves tp*B requests, each micro-batch of the
    # pipeline holds B per GPU and a GPU stores its share of every request's context
    per_request = request_bytes(context, kv_gpu, bounded_gpu, pool) * dep.attention.tp * dep.pp
    offloaded: WeightOffload | None = None
    resident = weights
    if offload and dep.weight_offload == "auto":
        batch = workload.decode_batch_per_gpu
        if batch == "max":
            batch = 2 if dep.overlap == "two-batch" else 1  # see simulate.decode_batch
        need = max(batch * per_request, workload.prefill_tokens * pool_token_bytes(kv_gpu, pool) * dep.attention.tp * dep.pp,
                   _pool_need(engine, hw, model, workload)
                   * (pool_token_bytes(kv_gpu, pool) + _unpooled_bytes(bounded_gpu, pool) / max(1, context)))
        shortfall = weights - (usable - reserved - need / kv_fraction)
        if shortfall > 0:
            # whole bytes and one more: rounding must never leave the needed KV a fraction of a byte short
            offloaded = plan_weight_offload(model, hw, dep, math.ceil(shortfall) + 1.0)
            resident = weights - offloaded.bytes_per_gpu
    free = usable - reserved - resident
    capacity = free * kv_fraction if free > 0 else free
    states = state_pool(model, engine, dep, capacity)
    if states is not None:
        capacity -= states.held_bytes_per_gpu
        per_request = request_bytes(context, kv_gpu, bounded_gpu - states.slot_bytes_per_gpu, pool) \
            * dep.attention.tp * dep.pp
    if engine is not None:
        # a cap per engine instance; batch B per GPU means tp x pp x B requests in an instance
        token_bytes = pool_token_bytes(kv_gpu, pool)
        pool_tokens = int(capacity // token_bytes) if capacity > 0 and token_bytes > 0 else 0
        cap_instance = engine.running_cap(hw.peak.hbm_bytes, pool_tokens, model.max_position_embeddings)
        cap = max(1, cap_instance // (dep.attention.tp * dep.pp)) if cap_instance else 0
    kv_fit = int(capacity // per_request) if capacity > 0 else 0
    state_fit = states.requests // (dep.attention.tp * dep.pp) if states is not None else kv_fit
    state_bound = state_fit < kv_fit
    kv_fit = min(kv_fit, state_fit)
    max_batch = min(kv_fit, cap) if cap else kv_fit
    if capacity <= 0:
        binding = "weights" if states is None or capacity + states.held_bytes_per_gpu <= 0 else "recurrent-state pool"
    elif cap and cap < kv_fit:
        binding = "running-request cap"
    else:
        binding = "recurrent-state pool" if state_bound else "kv cache"
    return MemoryResult(weights, kv_model, kv_gpu, hw.peak.hbm_bytes, hw.peak.hbm_bytes - usable + reserved, capacity,
                        context, max_batch, bounded_model, bounded_gpu, draft_weights, draft_kv, activations,
                        step_tokens, kv_fit, cap, binding, offloaded, pool, states, encoder)
