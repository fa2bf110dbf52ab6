"""HuggingFace config.json -> model card fields.

Families differ in key names (n_routed_experts vs num_experts, n_layer vs num_hidden_layers, ...);
this maps them onto the card's normalised names and says which family rule was used. A field the
card needs that the config does not have is an error naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infersim.errors import MISSING, ConfigError

# card field -> candidate HF keys, first present wins
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner"),
    "num_experts": ("num_experts", "n_routed_experts", "num_routed_experts", "num_local_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k", "top_k"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "head_dim": ("head_dim",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "attention_bias": ("attention_bias", "enable_bias", "bias"),
    "mlp_bias": ("mlp_bias", "enable_bias", "bias"),
}

_PLAIN_MLP_FAMILIES = {"opt": "relu", "bloom": "gelu", "gpt2": "gelu", "gpt_neox": "gelu", "falcon": "gelu"}


def read_hf_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "", MISSING, "file not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), "", MISSING, f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", MISSING, "expected a JSON object (a HuggingFace config.json)")
    return data


def card_fields_from_hf(config: dict[str, Any], source: str, name: str) -> dict[str, Any]:
    """Model card fields (a plain dict, validated later by the card schema) from an HF config."""
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal wrappers keep the language model under text_config
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    model_type = str(config.get("model_type", ""))
    fields: dict[str, Any] = {"name": name, "source": f"HuggingFace config {source} (model_type {model_type or '?'})"}
    for card_key, hf_keys in _ALIASES.items():
        for hf_key in hf_keys:
            if config.get(hf_key) is not None:
                fields[card_key] = config[hf_key]
                break
    for required in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if required not in fields:
            raise ConfigError(source, _ALIASES[required][0], MISSING, "required by InferSim but not in the config")
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    if fields.get("kv_lora_rank") and "head_dim" not in fields:
        fields["head_dim"] = fields.get("qk_nope_head_dim", 0) + fields.get("qk_rope_head_dim", 0)
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])

    family = model_type.split("_")[0] if model_type else ""
    activation = _PLAIN_MLP_FAMILIES.get(model_type) or _PLAIN_MLP_FAMILIES.get(family)
    if activation:
        fields["ffn_activation"] = activation
        fields.setdefault("intermediate_size", 4 * fields["hidden_size"])
    if "num_experts" in fields and not fields.get("num_experts"):
        fields.pop("num_experts")
    if fields.get("num_experts"):
        # Mixtral/GPT-OSS-style configs give the expert width as intermediate_size
        fields.setdefault("moe_intermediate_size", fields.get("intermediate_size", 0))
        if fields.get("shared_expert_intermediate_size") and not fields.get("num_shared_experts"):
            fields["num_shared_experts"] = 1
        if "decoder_sparse_step" in config and config["decoder_sparse_step"] not in (1, None):
            raise ConfigError(source, "decoder_sparse_step", config["decoder_sparse_step"],
                              "MoE on every n-th layer is not supported yet (only 1)")
        if fields["moe_intermediate_size"] == fields.get("intermediate_size") and "first_k_dense_replace" not in fields:
            fields.pop("intermediate_size", None)  # no dense layers: the only width is the experts'
    else:
        for key in ("num_experts_per_tok", "num_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size"):
            fields.pop(key, None)
    if not fields.get("kv_lora_rank"):
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            fields.pop(key, None)
    elif fields.get("q_lora_rank") is None:
        fields.pop("q_lora_rank", None)
    return fields


def card_from_hf_file(path: Path, name: str | None = None) -> dict[str, Any]:
    fields = card_fields_from_hf(read_hf_config(path), str(path), name or default_card_name(path))
    fields["source"] = fields["source"].replace(str(path), path.name)
    return fields


def default_card_name(path: Path) -> str:
    stem = path.name
    for suffix in (".json", "_config", "-config", "config"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return stem.strip("_-").lower() or "model"
