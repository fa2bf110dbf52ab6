"""Model cards: the architecture hyperparameters the simulator needs.

Field names follow HuggingFace config.json conventions (normalised across model families), so a
model designer can vary `model.num_key_value_heads` exactly as they would in a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infersim.cards.schema import spec
from infersim.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    name: str = spec(doc="short name, as used in run configs")
    source: str = spec("", doc="where the numbers come from (HF repo, paper)")
    hidden_size: int = spec(doc="model width d_model", gt=0)
    num_hidden_layers: int = spec(doc="transformer layers", gt=0)
    num_attention_heads: int = spec(doc="query heads", gt=0)
    num_key_value_heads: int = spec(doc="K/V heads (= query heads for MHA, 1 for MQA); ignored for MLA", gt=0)
    head_dim: int = spec(doc="per-head dimension of Q/K/V (MHA/GQA)", gt=0)
    vocab_size: int = spec(doc="vocabulary size (embedding and LM-head rows)", gt=0)
    intermediate_size: int = spec(0, doc="dense FFN width (dense layers and dense models)", ge=0)
    ffn_activation: Literal["swiglu", "gelu", "relu"] = spec(
        "swiglu", doc="swiglu: gated MLP with 3 matrices; gelu/relu: plain MLP with 2")
    tie_word_embeddings: bool = spec(False, doc="LM head shares the embedding matrix")
    attention_bias: bool = spec(False, doc="QKV/O projections have biases (parameter count only)")
    mlp_bias: bool = spec(False, doc="MLP projections have biases (parameter count only)")
    num_experts: int = spec(0, doc="routed experts per MoE layer (0 = dense model)", ge=0)
    num_experts_per_tok: int = spec(0, doc="routed experts each token activates (top-k)", ge=0)
    moe_intermediate_size: int = spec(0, doc="routed expert FFN width", ge=0)
    num_shared_experts: int = spec(0, doc="always-active shared experts per MoE layer", ge=0)
    shared_expert_intermediate_size: int = spec(
        0, doc="width of each shared expert (0 = moe_intermediate_size)", ge=0)
    first_k_dense_replace: int = spec(0, doc="the first k layers use the dense FFN instead of MoE", ge=0)
    q_lora_rank: int = spec(0, doc="MLA query compression rank (0 = uncompressed queries)", ge=0)
    kv_lora_rank: int = spec(0, doc="MLA compressed KV rank (> 0 makes attention MLA)", ge=0)
    qk_nope_head_dim: int = spec(0, doc="MLA per-head QK dimension without rotary", ge=0)
    qk_rope_head_dim: int = spec(0, doc="MLA decoupled rotary dimension (shared K part)", ge=0)
    v_head_dim: int = spec(0, doc="MLA per-head value dimension", ge=0)

    # ---- derived --------------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gated_ffn(self) -> bool:
        return self.ffn_activation == "swiglu"

    @property
    def num_dense_layers(self) -> int:
        return self.num_hidden_layers if not self.is_moe else self.first_k_dense_replace

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.num_dense_layers

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

    @property
    def attn_v_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim


def validate_model(card: ModelCard, source: str) -> ModelCard:
    """Checks that span several fields; each problem is one message naming field and value."""
    if card.is_mla:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(card, name) <= 0:
                raise ConfigError(source, name, getattr(card, name), "MLA (kv_lora_rank > 0) needs it positive")
    elif card.num_attention_heads % card.num_key_value_heads:
        raise ConfigError(source, "num_key_value_heads", card.num_key_value_heads,
                          f"must divide num_attention_heads ({card.num_attention_heads})")
    if card.is_moe:
        if not 0 < card.num_experts_per_tok <= card.num_experts:
            raise ConfigError(source, "num_experts_per_tok", card.num_experts_per_tok,
                              f"must be between 1 and num_experts ({card.num_experts})")
        if card.moe_intermediate_size <= 0:
            raise ConfigError(source, "moe_intermediate_size", card.moe_intermediate_size,
                              "an MoE model (num_experts > 0) needs a positive expert width")
        if card.first_k_dense_replace > card.num_hidden_layers:
            raise ConfigError(source, "first_k_dense_replace", card.first_k_dense_replace,
                              f"more than num_hidden_layers ({card.num_hidden_layers})")
    else:
        for name in ("num_experts_per_tok", "num_shared_experts"):
            if getattr(card, name):
                raise ConfigError(source, name, getattr(card, name), "set, but num_experts is 0 (dense model)")
    if card.num_dense_layers > 0 and card.intermediate_size <= 0:
        raise ConfigError(source, "intermediate_size", card.intermediate_size,
                          f"{card.num_dense_layers} dense FFN layers need a positive width")
    return card
