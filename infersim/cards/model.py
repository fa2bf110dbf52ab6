"""Model cards: the architecture hyperparameters the simulator needs.

Field names follow HuggingFace config.json conventions (normalised across model families), so a
model designer can vary `model.num_key_value_heads` exactly as they would in a config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

from infersim.cards.quantization import Quantization, WeightFormat
from infersim.cards.schema import hash_kept, spec
from infersim.base.errors import ConfigError

# Layer mixers (the token-mixing half of a layer), named as HF `layer_types` names them.
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
CHUNKED_ATTENTION = "chunked_attention"  # Llama-4's local layers (HF Llama4TextConfig.layer_types)
LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
MAMBA = "mamba"  # Mamba-2 (SSD)
LayerType = Literal["full_attention", "sliding_attention", "chunked_attention", "linear_attention", "mamba"]
#: softmax-attention layers, which keep a KV cache
ATTENTION_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION)
#: attention layers that keep at most a window of tokens (ModelCard.local_window)
LOCAL_KINDS = (SLIDING_ATTENTION, CHUNKED_ATTENTION)
StateDtype = Literal["fp32", "bf16", "fp16"]


@hash_kept  # a key of every plan piece a PricingMemo keeps (see hash_kept)
@dataclass(frozen=True, kw_only=True)
class ModelCard:
    """A model's architecture: the shapes every kernel and memory figure is derived from (models/*.yaml)."""

    name: str = spec(doc="short name, as used in run configs")
    source: str = spec("", doc="where the numbers come from (HF repo, paper)")
    imported_as: str = spec(
        "", doc="the family an HF config of an architecture InferSim does not model was imported as, at its "
                "config's request (infersim_family); every report says so. Empty: the config's own family")
    aliases: tuple[str, ...] = spec(
        default_factory=tuple, doc="other names the card answers to (HF repo ids whose config has these same "
                                   "fields), matched ignoring case and punctuation")
    hidden_size: int = spec(doc="model width d_model", gt=0)
    num_hidden_layers: int = spec(doc="transformer layers", gt=0, le=100_000)
    num_attention_heads: int = spec(doc="query heads", gt=0)
    num_key_value_heads: int = spec(doc="K/V heads (= query heads for MHA, 1 for MQA); ignored for MLA", gt=0)
    head_dim: int = spec(doc="per-head dimension of Q/K/V (MHA/GQA)", gt=0)
    vocab_size: int = spec(doc="vocabulary size (embedding and LM-head rows)", gt=0)
    max_position_embeddings: int = spec(
        0, doc="context length: the longest sequence (prompt + output tokens) the model takes; vLLM's max_model_len and "
               "SGLang's context length default to it and refuse longer requests (0: not stated)", ge=0, le=1 << 40)
    intermediate_size: int = spec(0, doc="dense FFN width (dense layers and dense models)", ge=0)
    ffn_activation: Literal["swiglu", "geglu", "gelu", "relu", "relu2"] = spec(
        "swiglu", doc="swiglu/geglu: gated MLP with 3 matrices; gelu/relu/relu2: plain MLP with 2")
    tie_word_embeddings: bool = spec(False, doc="LM head shares the embedding matrix")
    attention_bias: bool = spec(False, doc="QKV/O projections have biases (parameter count only)")
    mlp_bias: bool = spec(False, doc="MLP projections have biases (parameter count only)")
    # at most 1,048,576 (the most published: PEER's 1024^2 product-key experts); routing statistics walk every expert
    num_experts: int = spec(0, doc="routed experts per MoE layer (0 = dense model)", ge=0, le=1_048_576)
    num_experts_per_tok: int = spec(0, doc="routed experts each token activates (top-k)", ge=0, le=100_000)
    moe_intermediate_size: int = spec(0, doc="routed expert FFN width", ge=0)
    n_group: int = spec(1, doc="expert groups for group-limited routing (DeepSeek-V3: 8; 1 = no groups)", gt=0)
    topk_group: int = spec(0, doc="groups each token may route to (DeepSeek-V3: 4; 0 = any)", ge=0)
    num_shared_experts: int = spec(0, doc="always-active shared experts per MoE layer", ge=0)
    shared_expert_intermediate_size: int = spec(
        0, doc="width of each shared expert (0 = moe_intermediate_size)", ge=0)
    first_k_dense_replace: int = spec(0, doc="the first k layers use the dense FFN instead of MoE", ge=0)
    moe_layer_interval: int = spec(
        1, doc="MoE on every n-th layer (layer i is MoE when (i + 1) % n == 0), dense FFN on the others "
               "(Llama-4 interleave_moe_layer_step, Qwen2-MoE decoder_sparse_step)", gt=0)
    q_lora_rank: int = spec(0, doc="MLA query compression rank (0 = uncompressed queries)", ge=0)
    kv_lora_rank: int = spec(0, doc="MLA compressed KV rank (> 0 makes attention MLA)", ge=0)
    qk_nope_head_dim: int = spec(0, doc="MLA per-head QK dimension without rotary", ge=0)
    qk_rope_head_dim: int = spec(0, doc="MLA decoupled rotary dimension (shared K part)", ge=0)
    v_head_dim: int = spec(0, doc="MLA per-head value dimension", ge=0)
    # -- per-layer mixers (local/global and hybrid models) --
    layer_types: tuple[LayerType, ...] = spec(
        (), doc="mixer of each layer: full_attention, sliding_attention, chunked_attention, linear_attention (Gated "
                "DeltaNet) or mamba (Mamba-2); a shorter list is a pattern repeated over the layers; empty = all "
                "full_attention")
    full_attention_interval: int = spec(
        0, doc="every n-th layer is full_attention, the others linear_attention (Qwen3-Next; 0 = unused)", ge=0)
    sliding_window: int = spec(0, doc="tokens a sliding_attention layer attends to and keeps in its KV cache", ge=0)
    attention_chunk_size: int = spec(
        0, doc="tokens of a chunked_attention layer's chunk (Llama-4): a query attends to the tokens of its own "
               "chunk up to itself, and the layer keeps at most a chunk in its KV cache (0 = unused)", ge=0)
    attention_output_gate: bool = spec(
        False, doc="attention output gated by a sigmoid of a second query-width projection (Qwen3-Next/3.5)")
    qk_norm: bool = spec(
        False, doc="per-head RMSNorm of queries and keys before RoPE in softmax-attention layers (Qwen3 family, "
                   "OLMo-2, Gemma-3; HF use_qk_norm): one more elementwise kernel per layer")
    # -- Gated DeltaNet (linear_attention layers) --
    linear_num_key_heads: int = spec(0, doc="Gated DeltaNet query/key heads", ge=0)
    linear_num_value_heads: int = spec(0, doc="Gated DeltaNet value heads (one recurrent state each)", ge=0)
    linear_key_head_dim: int = spec(0, doc="Gated DeltaNet query/key head dimension", ge=0)
    linear_value_head_dim: int = spec(0, doc="Gated DeltaNet value head dimension", ge=0)
    linear_conv_kernel_dim: int = spec(4, doc="short causal convolution width of linear_attention/mamba layers", gt=0)
    linear_chunk_size: int = spec(64, doc="chunk length of the chunked Gated DeltaNet prefill kernels (FLA)", gt=0)
    # -- Mamba-2 (mamba layers) --
    mamba_d_state: int = spec(0, doc="Mamba-2 SSM state size N per head (HF ssm_state_size)", ge=0)
    mamba_head_dim: int = spec(64, doc="Mamba-2 head dimension P", gt=0)
    mamba_expand: int = spec(2, doc="Mamba-2 inner width = mamba_expand x hidden_size (when mamba_num_heads is 0)", gt=0)
    mamba_num_heads: int = spec(0, doc="Mamba-2 heads (0 = mamba_expand x hidden_size / mamba_head_dim)", ge=0)
    mamba_n_groups: int = spec(1, doc="Mamba-2 B/C groups (shared by the heads of a group)", gt=0)
    mamba_chunk_size: int = spec(256, doc="chunk length of the chunked Mamba-2 (SSD) prefill kernels", gt=0)
    mamba_ssm_dtype: StateDtype = spec("fp32", doc="storage format of recurrent states (Gated DeltaNet and Mamba-2)")
    # -- DeepSeek sparse attention (DSA) --
    index_n_heads: int = spec(0, doc="DSA lightning-indexer heads", ge=0)
    index_head_dim: int = spec(0, doc="DSA indexer head dimension (its keys are cached in fp8 per token)", ge=0)
    index_topk: int = spec(0, doc="DSA: tokens each query attends to, chosen by the indexer (0 = dense attention)", ge=0)
    # -- multi-token prediction --
    num_nextn_predict_layers: int = spec(0, doc="MTP modules (one transformer layer each) for speculative decoding", ge=0)
    # -- the checkpoint --
    quantization: Quantization | None = spec(
        None, doc="how the checkpoint stores its weights (HF quantization_config: fp8 blocks, MXFP4, NVFP4, GPTQ/AWQ "
                  "...); a run prices its weights so unless the run config names precision.weights/expert_weights; "
                  "null: unquantised (bf16)")
    encoder_params: int = spec(
        0, doc="parameters of the checkpoint's multimodal encoder (vision tower, its adapter and the projector into "
               "the language model), stored in 16-bit: weights an engine that loads the encoder holds beside the "
               "language model, split over the attention-TP group, and never runs for text requests (0: none, "
               "or a text-only checkpoint)", ge=0, le=1 << 50)
    encoder_architecture: str = spec(
        "", doc="the HF architecture of the checkpoint that holds the encoder (Llama4ForConditionalGeneration): an "
                "engine card's memory.encoder_off_for names the ones whose encoder the engine leaves unloaded")
    checkpoint: str | None = spec(
        None, doc="the published weights this card describes, as an engine loads them (a Hugging Face repository id "
                  "or a path), in the formats `quantization` says; null: not named (--emit-launch then asks for it)")
    # not compared (so not hashed either: a dict is not hashable): a checkpoint's name changes no
    # simulated number, and cards are memo keys of the sweeps
    quantized_checkpoints: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, metadata={
        "doc": "other published checkpoints of the same architecture, by weight format (fp8, fp4, int4 ...): what "
               "--emit-launch loads for a run in that format", "gt": None, "ge": None, "le": None})

    # ---- derived --------------------------------------------------------------------------

    # kept once asked (the card is frozen): a sweep builds its plan pieces asking these many times a point
    @cached_property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @cached_property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gated_ffn(self) -> bool:
        return self.ffn_activation in ("swiglu", "geglu")

    @property
    def num_dense_layers(self) -> int:
        return self.num_hidden_layers - self.num_moe_layers

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index >= self.first_k_dense_replace and (index + 1) % self.moe_layer_interval == 0

    @cached_property  # asked for by every layout a sweep completes and every memory budget
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_hidden_layers) if self.is_moe_layer(i))

    @property
    def shared_width(self) -> int:
        """Total width of the shared experts (they run as one FFN)."""
        each = self.shared_expert_intermediate_size or self.moe_intermediate_size
        return self.num_shared_experts * each

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated_ffn else 2

    @property
    def qk_head_dim(self) -> int:
        """Per-head dimension of Q.K products (MLA: nope + rope)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """The mixer of every layer, in order (layer_types repeated, or full_attention_interval)."""
        n = self.num_hidden_layers
        if self.layer_types:
            reps, rest = divmod(n, len(self.layer_types))
            return tuple(self.layer_types) * reps + tuple(self.layer_types[:rest])
        if self.full_attention_interval:
            return interval_layer_kinds(n, self.full_attention_interval)
        return (FULL_ATTENTION,) * n

    @cached_property
    def layer_composition(self) -> tuple[tuple[str, bool, int], ...]:
        """(mixer kind, MoE FFN?, layers) of each distinct layer kind, in order of first appearance."""
        counts: dict[tuple[str, bool], int] = {}
        for i, mixer in enumerate(self.layer_kinds):
            key = (mixer, self.is_moe_layer(i))
            counts[key] = counts.get(key, 0) + 1
        return tuple((mixer, moe, n) for (mixer, moe), n in counts.items())

    def layer_count(self, kind: str) -> int:
        return self.layer_kinds.count(kind)

    @property
    def local_window(self) -> int:
        """Tokens a sliding-window or chunked layer keeps at most: its window, or its chunk (a model
        has one kind of local layer; 0 without either)."""
        return self.attention_chunk_size if self.attention_chunk_size else self.sliding_window

    @cached_property
    def recurrent_kinds(self) -> tuple[str, ...]:
        """The kinds of its layers that keep a recurrent state per request (linear attention, Mamba)."""
        return tuple(kind for kind in (LINEAR_ATTENTION, MAMBA) if kind in self.layer_kinds)

    @cached_property
    def is_hybrid(self) -> bool:
        """Some layer is not full attention."""
        return any(k != FULL_ATTENTION for k in self.layer_kinds)

    @cached_property
    def is_sparse_attention(self) -> bool:
        """DeepSeek sparse attention: an indexer picks index_topk tokens per query for MLA."""
        return self.index_topk > 0

    @property
    def mamba_heads(self) -> int:
        return self.mamba_num_heads or self.mamba_expand * self.hidden_size // self.mamba_head_dim


def _validate_checkpoints(card: ModelCard, source: str) -> None:
    for fmt in card.quantized_checkpoints:
        if fmt not in get_args(WeightFormat):
            raise ConfigError(source, f"quantized_checkpoints.{fmt}", card.quantized_checkpoints[fmt],
                              f"keyed by a weight format ({', '.join(get_args(WeightFormat))})")


def validate_model(card: ModelCard, source: str) -> ModelCard:
    """Checks that span several fields; each problem is one message naming field and value."""
    if card.is_mla:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(card, name) <= 0:
                raise ConfigError(source, name, getattr(card, name), "MLA (kv_lora_rank > 0) needs it positive")
    elif card.num_attention_heads % card.num_key_value_heads:
        raise ConfigError(source, "num_key_value_heads", card.num_key_value_heads,
                          f"must divide num_attention_heads ({card.num_attention_heads})")
    _validate_checkpoints(card, source)
    if card.is_moe:
        if not 0 < card.num_experts_per_tok <= card.num_experts:
            raise ConfigError(source, "num_experts_per_tok", card.num_experts_per_tok,
                              f"must be between 1 and num_experts ({card.num_experts})")
        if card.moe_intermediate_size <= 0:
            raise ConfigError(source, "moe_intermediate_size", card.moe_intermediate_size,
                              "an MoE model (num_experts > 0) needs a positive expert width")
        if card.num_experts % card.n_group:
            raise ConfigError(source, "n_group", card.n_group, f"must divide num_experts ({card.num_experts})")
        if card.topk_group > card.n_group:
            raise ConfigError(source, "topk_group", card.topk_group, f"more than n_group ({card.n_group})")
        if card.first_k_dense_replace > card.num_hidden_layers:
            raise ConfigError(source, "first_k_dense_replace", card.first_k_dense_replace,
                              f"more than num_hidden_layers ({card.num_hidden_layers})")
    else:
        for name in ("num_experts_per_tok", "num_shared_experts"):
            if getattr(card, name):
                raise ConfigError(source, name, getattr(card, name), "set, but num_experts is 0 (dense model)")
    _validate_layer_kinds(card, source)
    if card.num_dense_layers > 0 and card.intermediate_size <= 0:
        raise ConfigError(source, "intermediate_size", card.intermediate_size,
                          f"{card.num_dense_layers} dense FFN layers need a positive width")
    return card


def interval_layer_kinds(layers: int, interval: int) -> tuple[str, ...]:
    """Every `interval`-th layer (1-based) full attention, the others linear attention (Qwen3-Next)."""
    return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers))


def _validate_chunks(card: ModelCard, kinds: set[str], source: str) -> None:
    if CHUNKED_ATTENTION in kinds and card.attention_chunk_size <= 0:
        raise ConfigError(source, "attention_chunk_size", card.attention_chunk_size,
                          "chunked_attention layers need a positive chunk")
    if card.attention_chunk_size and CHUNKED_ATTENTION not in kinds:
        raise ConfigError(source, "attention_chunk_size", card.attention_chunk_size,
                          "no layer is chunked_attention (layer_types): the chunk would go unused")
    if CHUNKED_ATTENTION in kinds and SLIDING_ATTENTION in kinds:
        # vLLM refuses the pair (0.15.1 v1/kv_cache_interface.py:175, 368); no model has it
        raise ConfigError(source, "layer_types", sorted(kinds),
                          "sliding_attention and chunked_attention layers in one model: give one kind of local layer")


def _validate_layer_kinds(card: ModelCard, source: str) -> None:
    n = card.num_hidden_layers
    if card.layer_types and n % len(card.layer_types):
        raise ConfigError(source, "layer_types", list(card.layer_types),
                          f"{len(card.layer_types)} entries: must list all {n} layers or a pattern whose length divides {n}")
    if card.layer_types and card.full_attention_interval:
        if interval_layer_kinds(n, card.full_attention_interval) != card.layer_kinds:
            raise ConfigError(source, "full_attention_interval", card.full_attention_interval,
                              "disagrees with layer_types (give one of them)")
    kinds = set(card.layer_kinds)
    if SLIDING_ATTENTION in kinds and card.sliding_window <= 0:
        raise ConfigError(source, "sliding_window", card.sliding_window, "sliding_attention layers need a positive window")
    _validate_chunks(card, kinds, source)
    if LINEAR_ATTENTION in kinds:
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
            if getattr(card, name) <= 0:
                raise ConfigError(source, name, getattr(card, name), "linear_attention (Gated DeltaNet) layers need it positive")
        if card.linear_num_value_heads % card.linear_num_key_heads:
            raise ConfigError(source, "linear_num_value_heads", card.linear_num_value_heads,
                              f"must be a multiple of linear_num_key_heads ({card.linear_num_key_heads})")
    if MAMBA in kinds:
        _validate_mamba(card, source)
    if card.index_topk:
        _validate_sparse_attention(card, source)


def _validate_mamba(card: ModelCard, source: str) -> None:
    """The Mamba-2 state size, head split and groups a card with mamba layers needs."""
    if card.mamba_d_state <= 0:
        raise ConfigError(source, "mamba_d_state", card.mamba_d_state, "mamba layers need a positive SSM state size")
    if card.mamba_heads <= 0 or (not card.mamba_num_heads and card.mamba_expand * card.hidden_size % card.mamba_head_dim):
        raise ConfigError(source, "mamba_head_dim", card.mamba_head_dim,
                          f"must divide mamba_expand x hidden_size ({card.mamba_expand * card.hidden_size}) "
                          "when mamba_num_heads is not given")
    if card.mamba_heads % card.mamba_n_groups:
        raise ConfigError(source, "mamba_n_groups", card.mamba_n_groups, f"must divide the {card.mamba_heads} Mamba-2 heads")


def _validate_sparse_attention(card: ModelCard, source: str) -> None:
    """DSA (index_topk > 0): an MLA model with a positive indexer."""
    if not card.is_mla:
        raise ConfigError(source, "index_topk", card.index_topk, "DSA sparse attention is modelled on MLA only (kv_lora_rank > 0)")
    for name in ("index_n_heads", "index_head_dim", "q_lora_rank"):
        if getattr(card, name) <= 0:
            raise ConfigError(source, name, getattr(card, name), "DSA (index_topk > 0) needs it positive")
