"""HuggingFace config.json -> model card fields.

Families differ in key names (n_routed_experts vs num_experts, n_layer vs num_hidden_layers, ...);
this maps them onto the card's normalised names and says which family rule was used. A field the
card needs that the config does not have is an error naming the file and the field.

Per-layer mixers: `layer_types` (GPT-OSS, Qwen3.5, Gemma) is read as is and written as its
shortest repeating pattern; `full_attention_interval` (Qwen3-Next) becomes the pattern
(n-1) x linear_attention + full_attention; a `sliding_window` without layer_types makes every
layer sliding (Mistral) unless `use_sliding_window` is false (Qwen2/3), Gemma-2 alternates and
Gemma-3's `sliding_window_pattern` n makes every n-th layer global. Layouts InferSim does not
model (Nemotron-H `hybrid_override_pattern`, Jamba periods, MLP-only layers) are refused with
one message rather than imported as something else.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path
from typing import Any, get_type_hints

from infersim.cards.hf_families import Family, card_activation, family_of
from infersim.cards.model import CHUNKED_ATTENTION, FULL_ATTENTION, LINEAR_ATTENTION, MAMBA, SLIDING_ATTENTION, ModelCard
from infersim.cards.quantization import quantization_from_hf
from infersim.cards.schema import check_number
from infersim.base.plaindata import loads_json
from infersim.base.errors import MISSING, ConfigError

# card field -> candidate HF keys, first present wins
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner"),
    "num_experts": ("num_experts", "n_routed_experts", "num_routed_experts", "num_local_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k", "top_k"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "n_group": ("n_group",),
    "topk_group": ("topk_group",),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "moe_layer_interval": ("interleave_moe_layer_step", "decoder_sparse_step"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "head_dim": ("head_dim",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "attention_bias": ("attention_bias", "enable_bias", "bias"),
    "mlp_bias": ("mlp_bias", "enable_bias", "bias"),
    "sliding_window": ("sliding_window",),
    "attention_chunk_size": ("attention_chunk_size",),
    "linear_num_key_heads": ("linear_num_key_heads",),
    "linear_num_value_heads": ("linear_num_value_heads",),
    "linear_key_head_dim": ("linear_key_head_dim",),
    "linear_value_head_dim": ("linear_value_head_dim",),
    "linear_conv_kernel_dim": ("linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv"),
    "mamba_d_state": ("mamba_d_state", "ssm_state_size", "state_size"),
    "mamba_head_dim": ("mamba_head_dim",),
    "mamba_num_heads": ("mamba_num_heads",),
    "mamba_n_groups": ("mamba_n_groups", "n_groups"),
    "mamba_expand": ("mamba_expand", "expand"),
    "mamba_chunk_size": ("mamba_chunk_size", "chunk_size"),
    "index_n_heads": ("index_n_heads",),
    "index_head_dim": ("index_head_dim",),
    "index_topk": ("index_topk",),
    "num_nextn_predict_layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
}

# HF layer-type names -> card mixer kinds
_LAYER_TYPE_NAMES = {
    "full_attention": FULL_ATTENTION, "attention": FULL_ATTENTION, "global_attention": FULL_ATTENTION,
    "sliding_attention": SLIDING_ATTENTION, "local_attention": SLIDING_ATTENTION, "chunked_attention": CHUNKED_ATTENTION,
    "linear_attention": LINEAR_ATTENTION, "mamba": MAMBA, "mamba2": MAMBA,
}
_STATE_DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16"}
_UNSUPPORTED_LAYOUTS = {
    "hybrid_override_pattern": "Nemotron-H style hybrid patterns are not imported; write the card's layer_types by hand",
    "attn_layer_period": "Jamba style attention periods are not imported; write the card's layer_types by hand",
}
_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
_MAMBA_FIELDS = ("mamba_d_state", "mamba_head_dim", "mamba_num_heads", "mamba_n_groups", "mamba_expand", "mamba_chunk_size")

_ALWAYS_BIASED = {"bloom", "gpt2", "gpt_neox", "falcon"}

_COUNT_FIELDS = frozenset(k for k, hint in get_type_hints(ModelCard).items() if hint is int)
# the card's own upper bounds, checked before the layer patterns below are built layer by layer
_COUNT_LIMITS = {f.name: f.metadata["le"] for f in dataclasses.fields(ModelCard) if f.metadata.get("le") is not None}
_POSITIVE_FIELDS = frozenset(("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                              "num_key_value_heads", "head_dim"))


def _hf_key(config: dict[str, Any], card_key: str) -> str:
    """The config key a card field was read from (for messages)."""
    return next((k for k in _ALIASES.get(card_key, ()) if config.get(k) is not None), card_key)


def read_hf_config(path: Path) -> dict[str, Any]:
    try:
        data = loads_json(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise ConfigError(str(path), "", MISSING, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "", MISSING, "is a directory, not a HuggingFace config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(str(path), "", MISSING, f"cannot read file: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", MISSING, "expected a JSON object (a HuggingFace config.json)")
    return data


def card_fields_from_hf(config: dict[str, Any], source: str, name: str) -> dict[str, Any]:
    """Model card fields (a plain dict, validated later by the card schema) from an HF config."""
    encoder = _encoder_fields(config, source)
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal wrappers keep the language model under text_config
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    family, family_note = family_of(config, source)
    model_type = str(config.get("model_type") or "")
    fields: dict[str, Any] = {"name": name, "source": f"HuggingFace config {source} (model_type {model_type or '?'})"}
    note = encoder.pop("note", "")
    fields.update(encoder)
    if note:
        fields["source"] += f"; {note}"
    if family_note:
        fields["source"] += f"; {family_note}"
        fields["imported_as"] = family.name
        model_type = family.name  # the family's rules, not the unknown architecture's
    config = _count_fields(config, fields, source)
    _scaled_context(config, fields)

    prefix = model_type.split("_")[0] if model_type else ""
    # transformers' PretrainedConfig ties the LM head to the embedding unless a config says otherwise
    fields.setdefault("tie_word_embeddings", True)
    if prefix in _ALWAYS_BIASED and "attention_bias" not in fields:
        fields["attention_bias"] = fields["mlp_bias"] = True  # BLOOM's modeling code has biases but no config key
    activation = card_activation(config, family, source)
    if activation != "swiglu":
        fields["ffn_activation"] = activation
    if not family.gated_mlp:
        fields.setdefault("intermediate_size", 4 * fields["hidden_size"])
    _check_experts(config, fields, family, source)
    _moe_fields(config, fields, model_type)
    if not fields.get("kv_lora_rank"):
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            fields.pop(key, None)
    elif fields.get("q_lora_rank") is None:
        fields.pop("q_lora_rank", None)
    _layer_fields(config, fields, source, model_type)
    quantization = quantization_from_hf(config, source, fields)
    if quantization is not None:
        fields["quantization"] = quantization
    return fields


#: an image's colour channels where a vision_config leaves them out (transformers' Llama4VisionConfig
#: num_channels and Qwen3-VL / Qwen3.5 vision configs' in_channels default to 3: RGB)
_RGB = 3
#: vision_config keys the Llama-4 vision tower's parameter count is made of
_LLAMA4_VISION_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "image_size",
                       "pixel_shuffle_ratio", "projector_input_dim", "projector_output_dim", "vision_output_dim")


def _encoder_fields(config: dict[str, Any], source: str) -> dict[str, Any]:
    """encoder_params and encoder_architecture of a multimodal checkpoint's config (Llama-4's vision
    tower: transformers' Llama4VisionModel and Llama4MultiModalProjector), or a note that its
    encoder is not counted; empty for a text-only config."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return {}
    architectures = config.get("architectures")
    architecture = str(architectures[0]) if isinstance(architectures, list) and architectures else ""
    kind = str(vision.get("model_type") or "")
    if kind == "llama4_vision_model":
        text = config.get("text_config")
        hidden = (text if isinstance(text, dict) else config).get("hidden_size")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
            raise ConfigError(source, "text_config.hidden_size", hidden, "a positive whole number is needed")
        params = llama4_vision_params(_vision_numbers(vision, _LLAMA4_VISION_KEYS, {"num_channels": _RGB}, source), hidden)
    elif kind.startswith(("qwen3_5", "qwen3_vl")):
        numbers = _vision_numbers(vision, _QWEN3_VISION_KEYS, {"in_channels": _RGB}, source)
        deepstack = vision.get("deepstack_visual_indexes") or []
        if not isinstance(deepstack, list):
            raise ConfigError(source, "vision_config.deepstack_visual_indexes", deepstack, "expected a list of layers")
        params = qwen3_vision_params(numbers, len(deepstack))
    else:
        return {"note": f"its {kind or 'vision'} encoder (vision_config) is not counted in memory: InferSim counts "
                        "the vision towers of Llama-4 and Qwen3-VL / Qwen3.5 (encoder_params sets it by hand)"}
    return {"encoder_params": params, "encoder_architecture": architecture}


def _vision_numbers(vision: dict[str, Any], keys: tuple[str, ...], defaults: dict[str, int],
                    source: str) -> dict[str, float]:
    """The vision_config numbers a parameter count is made of, each checked positive."""
    numbers: dict[str, float] = {}
    for key in keys + tuple(defaults):
        value = vision.get(key, defaults.get(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(source, f"vision_config.{key}", value,
                              "a positive number is needed to count the vision tower's parameters")
        numbers[key] = value
    return numbers


#: vision_config keys a Qwen3-VL / Qwen3.5 vision tower's parameter count is made of
_QWEN3_VISION_KEYS = ("hidden_size", "intermediate_size", "depth", "patch_size", "temporal_patch_size",
                      "num_position_embeddings", "spatial_merge_size", "out_hidden_size")


def _vit_block_params(hidden: int, inner: int) -> int:
    """One vision-transformer block of both towers below: q, k, v and o (or fused qkv and proj) with
    biases, the MLP's fc1 and fc2 with biases, and two layer norms with biases."""
    return 4 * hidden * hidden + 2 * hidden * inner + 9 * hidden + inner


def qwen3_vision_params(vision: dict[str, float], deepstack_mergers: int) -> int:
    """Parameters of a Qwen3-VL / Qwen3.5 vision tower from its vision_config (transformers 5.17
    models/qwen3_5_moe, qwen3_5, qwen3_vl modeling: VisionPatchEmbed, VisionBlock, VisionPatchMerger):
    the Conv3d patch embedding with bias, the learned position embeddings, per block two layer norms
    with biases, qkv and proj with biases and the MLP's fc1, fc2 with biases; the merger (a layer
    norm over the hidden size, fc1 over hidden x merge^2 and fc2 into out_hidden_size, with biases)
    and each deepstack merger (the same, its norm over hidden x merge^2)."""
    h, inner = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch, merged = int(vision["patch_size"]), h * int(vision["spatial_merge_size"]) ** 2
    embed = int(vision["in_channels"]) * int(vision["temporal_patch_size"]) * patch * patch * h + h
    positions = int(vision["num_position_embeddings"]) * h
    mlp = merged * merged + merged + merged * int(vision["out_hidden_size"]) + int(vision["out_hidden_size"])
    mergers = (2 * h + mlp) + deepstack_mergers * (2 * merged + mlp)
    return embed + positions + int(vision["depth"]) * _vit_block_params(h, inner) + mergers


def llama4_vision_params(vision: dict[str, float], text_hidden: int) -> int:
    """Parameters of Llama-4's vision tower, adapter and projector from its vision_config: per layer
    q, k, v, o and the MLP's fc1, fc2 with biases and two layer norms with biases; the class token,
    position embeddings of (image / patch)^2 + 1 positions, the patch projection and the pre and post
    norms; the pixel-shuffle adapter (hidden / ratio^2 -> projector_input_dim -> projector_output_dim)
    and the projector into the language model (vision_output_dim -> its hidden size)."""
    h, inner = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch = int(vision["patch_size"])
    positions = (int(vision["image_size"]) // patch) ** 2 + 1
    embeddings = h + positions * h + int(vision["num_channels"]) * patch * patch * h + 4 * h
    adapter_in = round(h / vision["pixel_shuffle_ratio"] ** 2)
    adapter = adapter_in * int(vision["projector_input_dim"]) + int(vision["projector_input_dim"]) * int(
        vision["projector_output_dim"])
    projector = int(vision["vision_output_dim"]) * text_hidden
    return int(vision["num_hidden_layers"]) * _vit_block_params(h, inner) + embeddings + adapter + projector


def _scaled_context(config: dict[str, Any], fields: dict[str, Any]) -> None:
    """The context a RoPE scaling stretches the config's positions to, where vLLM and SGLang agree on
    it: both multiply by rope_scaling.factor unless the scaling names its original length or is
    Llama-3's (vllm config/model.py _get_and_verify_max_len, sglang hf_transformers_utils.py
    get_context_length); YaRN with an original length they read differently, and the config's own
    value stands."""
    scaling = config.get("rope_scaling")
    context = fields.get("max_position_embeddings")
    if not isinstance(scaling, dict) or not context:
        return
    kind = str(scaling.get("rope_type") or scaling.get("type") or "")
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        return
    original = scaling.get("original_max_position_embeddings")
    if kind == "yarn" and isinstance(original, int) and not isinstance(original, bool) and original > 0:
        if int(original * factor) == context:  # both engines take the config's value (DeepSeek-V3: 4,096 x 40)
            return
        fields["source"] += (f"; context: the config's max_position_embeddings {context:,}, as SGLang takes it; vLLM "
                             f"takes YaRN's original_max_position_embeddings x factor = {int(original * factor):,} "
                             "(--set model.max_position_embeddings=N for a vLLM run that relies on it)")
        return
    if original is not None or kind in ("llama3", "su", "longrope"):
        return
    fields["max_position_embeddings"] = int(context * factor)
    fields["source"] += f"; context {context:,} x rope_scaling {kind or 'factor'} {factor:g}"


def _count_fields(config: dict[str, Any], fields: dict[str, Any], source: str) -> dict[str, Any]:
    """The card fields the aliases give, every count through the number rule before any arithmetic on
    it (head_dim, layer patterns), and the head defaults; the config with its pattern counts checked."""
    for card_key, hf_keys in _ALIASES.items():
        for hf_key in hf_keys:
            if config.get(hf_key) is not None:
                fields[card_key] = config[hf_key]
                break
    for required in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if required not in fields:
            raise ConfigError(source, _ALIASES[required][0], MISSING, "required by InferSim but not in the config")
    for key in [k for k in fields if k in _COUNT_FIELDS]:
        fields[key] = check_number(fields[key], source, _hf_key(config, key), whole=True, le=_COUNT_LIMITS.get(key),
                                   **({"gt": 0} if key in _POSITIVE_FIELDS else {"ge": 0}))
    for key in ("full_attention_interval", "sliding_window_pattern"):
        if config.get(key) is not None:
            config = {**config, key: check_number(config[key], source, key, whole=True, ge=0)}
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    if fields.get("kv_lora_rank") and "head_dim" not in fields:
        fields["head_dim"] = fields.get("qk_nope_head_dim", 0) + fields.get("qk_rope_head_dim", 0)
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    return config


def _moe_fields(config: dict[str, Any], fields: dict[str, Any], model_type: str) -> None:
    """The expert fields of an MoE model, the family rules for its widths; none for a dense one."""
    if fields.get("num_experts"):
        # Mixtral/GPT-OSS-style configs give the expert width as intermediate_size
        fields.setdefault("moe_intermediate_size", fields.get("intermediate_size", 0))
        if fields.get("shared_expert_intermediate_size") and not fields.get("num_shared_experts"):
            fields["num_shared_experts"] = 1
        if model_type.startswith("llama4"):
            # Llama-4: intermediate_size is the expert width (and its one shared expert's), the
            # interleaved dense layers use intermediate_size_mlp
            fields["moe_intermediate_size"] = config.get("intermediate_size", fields["moe_intermediate_size"])
            fields["num_shared_experts"] = 1
            fields["shared_expert_intermediate_size"] = fields["moe_intermediate_size"]
            if config.get("intermediate_size_mlp"):
                fields["intermediate_size"] = config["intermediate_size_mlp"]
        if fields.get("moe_layer_interval", 1) in (None, 1):
            fields.pop("moe_layer_interval", None)
        if (fields["moe_intermediate_size"] == fields.get("intermediate_size") and "first_k_dense_replace" not in fields
                and "moe_layer_interval" not in fields):
            fields.pop("intermediate_size", None)  # no dense layers: the only width is the experts'
    else:
        for key in ("num_experts_per_tok", "num_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
                    "n_group", "topk_group", "moe_layer_interval"):
            fields.pop(key, None)


def _check_experts(config: dict[str, Any], fields: dict[str, Any], family: Family, source: str) -> None:
    """Routed experts where the family's modeling file has them, and only there: a count of 0 in an
    MoE family's config is not that model (it was imported as a dense one), and an expert count in a
    dense family's config is a key its modeling file never reads."""
    experts = fields.get("num_experts")
    key = _hf_key(config, "num_experts")
    if family.moe and not experts:
        raise ConfigError(source, key, experts if experts is not None else MISSING,
                          f"the {family.name} family's FFN layers are routed experts: a count of at least 1 is needed "
                          "(a dense model of another family is not this one)")
    if not family.moe and experts:
        raise ConfigError(source, key, experts, f"the {family.name} family has no routed experts (its modeling file "
                          "reads no expert count): which MoE architecture this is is unknown")
    if not experts:
        fields.pop("num_experts", None)


def _shortest_pattern(kinds: list[str]) -> list[str]:
    n = len(kinds)
    for period in range(1, n + 1):
        if n % period == 0 and kinds == kinds[:period] * (n // period):
            return kinds[:period]
    return kinds


#: model_type prefixes whose attention normalises q and k per head (Qwen3, Qwen3-MoE, Qwen3-Next,
#: Qwen3.5, OLMo-2, Gemma-3: q_norm/k_norm in their transformers modeling files)
_QK_NORM_TYPES = ("qwen3", "olmo2", "gemma3")


def _layer_fields(config: dict[str, Any], fields: dict[str, Any], source: str, model_type: str) -> None:
    """layer_types / sliding window / linear-attention / Mamba-2 / DSA / MTP fields, consistent with each other."""
    for key, problem in _UNSUPPORTED_LAYOUTS.items():
        if config.get(key):
            raise ConfigError(source, key, config[key], problem)
    if config.get("mlp_only_layers"):
        raise ConfigError(source, "mlp_only_layers", config["mlp_only_layers"],
                          "dense-FFN layers at given positions of an MoE model are not supported yet")
    kinds = _layer_kinds(config, fields, source, model_type)
    fields.pop("layer_types", None)
    if any(k != FULL_ATTENTION for k in kinds):
        fields["layer_types"] = _shortest_pattern(kinds)
    _drop_fields_of_absent_kinds(config, fields, source, set(kinds))
    if config.get("attn_output_gate") or (model_type.startswith("qwen3_next") and config.get("attn_output_gate") is not False):
        fields["attention_output_gate"] = True
    # the architectures with q_norm/k_norm in their attention (transformers' modeling files); others
    # that have it say use_qk_norm
    if config.get("use_qk_norm") or (config.get("use_qk_norm") is None and model_type.startswith(_QK_NORM_TYPES)):
        fields["qk_norm"] = True
    if not fields.get("index_topk"):
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            fields.pop(key, None)
    if not fields.get("num_nextn_predict_layers"):
        fields.pop("num_nextn_predict_layers", None)


def _layer_kinds(config: dict[str, Any], fields: dict[str, Any], source: str, model_type: str) -> list[str]:
    """Each layer's kind of attention, from layer_types or the interval/pattern fields each family
    uses (Llama-4's no-RoPE interval: chunked layers between its global ones)."""
    n = fields["num_hidden_layers"]
    window = fields.get("sliding_window") or 0
    raw = config.get("layer_types")
    if raw is not None:
        if not isinstance(raw, list) or not raw:
            raise ConfigError(source, "layer_types", raw, "expected a list of layer type names")
        unknown = sorted({str(t) for t in raw if t not in _LAYER_TYPE_NAMES})
        if unknown:
            raise ConfigError(source, "layer_types", unknown[0],
                              f"unknown layer type (InferSim models {', '.join(sorted(set(_LAYER_TYPE_NAMES)))})")
        if len(raw) != n:
            raise ConfigError(source, "layer_types", f"{len(raw)} entries", f"must list all {n} layers")
        return [_LAYER_TYPE_NAMES[t] for t in raw]
    if config.get("attention_chunk_size") and config.get("no_rope_layer_interval"):
        # Llama-4: every n-th layer global (no RoPE), the others attend within fixed chunks of
        # attention_chunk_size tokens (transformers' Llama4TextConfig names them chunked_attention)
        k = int(config["no_rope_layer_interval"])
        return [FULL_ATTENTION if (i + 1) % k == 0 else CHUNKED_ATTENTION for i in range(n)]
    if config.get("full_attention_interval"):
        k = int(config["full_attention_interval"])
        return [FULL_ATTENTION if (i + 1) % k == 0 else LINEAR_ATTENTION for i in range(n)]
    if window and config.get("use_sliding_window") is not False:
        if config.get("sliding_window_pattern"):  # Gemma-3: every n-th layer global
            k = int(config["sliding_window_pattern"])
            return [FULL_ATTENTION if (i + 1) % k == 0 else SLIDING_ATTENTION for i in range(n)]
        if model_type.startswith("gemma2"):
            return [SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(n)]
        return [SLIDING_ATTENTION] * n  # Mistral: every layer slides
    return [FULL_ATTENTION] * n


def _drop_fields_of_absent_kinds(config: dict[str, Any], fields: dict[str, Any], source: str,
                                 present: set[str]) -> None:
    """Keep the sliding-window, chunk, linear-attention and Mamba-2 fields only where such layers exist;
    the state format of linear/Mamba layers is checked and named."""
    if SLIDING_ATTENTION not in present:
        fields.pop("sliding_window", None)
    if CHUNKED_ATTENTION not in present:
        fields.pop("attention_chunk_size", None)
    if LINEAR_ATTENTION not in present:
        for key in _LINEAR_FIELDS:
            fields.pop(key, None)
    if MAMBA not in present:
        for key in _MAMBA_FIELDS:
            fields.pop(key, None)
    if not present & {LINEAR_ATTENTION, MAMBA}:
        fields.pop("linear_conv_kernel_dim", None)
        return
    dtype = config.get("mamba_ssm_dtype")
    if dtype is not None:
        if str(dtype) not in _STATE_DTYPES:
            raise ConfigError(source, "mamba_ssm_dtype", dtype, f"unknown state format (known: {', '.join(_STATE_DTYPES)})")
        fields["mamba_ssm_dtype"] = _STATE_DTYPES[str(dtype)]


def card_from_hf_file(path: Path, name: str | None = None) -> dict[str, Any]:
    config = read_hf_config(path)
    fields = card_fields_from_hf(config, str(path), name or default_card_name(path, config))
    fields["source"] = fields["source"].replace(str(path), path.name)
    return fields


_NAME_CHARS = re.compile(r"[^a-z0-9._+-]+")
#: the longest card name (`cards import-hf --name` takes 1 to 128 characters: it becomes a file name)
MAX_CARD_NAME = 128


def _name_rule(text: str) -> str:
    """`text` as a card name: accents dropped (é -> e), lower case, each run of characters a card
    name cannot hold as one '-', no punctuation at the ends, at most MAX_CARD_NAME characters."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return _NAME_CHARS.sub("-", plain.lower()).strip("-._+")[:MAX_CARD_NAME].rstrip("-._+")


def _card_name_of(text: str) -> str:
    """A model name as a card name: its last path part, lower case, other characters as '-'."""
    last = text.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    if last.startswith("models--"):  # the HF hub cache's directory of a repository: models--Org--Name
        last = last.split("--")[-1]
    return _name_rule(last)


def default_card_name(path: Path, config: dict[str, Any] | None = None) -> str:
    """The card name of an HF config file: its file name less the config suffix
    (qwen3-8B_config.json -> qwen3-8b); for a file named just config.json, the model it belongs to:
    its `_name_or_path` (meta-llama/Llama-3.1-70B -> llama-3.1-70b), else its directory (the
    repository directory of the HF hub cache for a snapshot), else "model". Every name follows the
    rule `--name` is held to, so a card written under it can be named on a command line: characters
    a name cannot hold become '-' ("My Model é.json" -> my-model-e)."""
    stem = path.name
    for suffix in (".json", "_config", "-config", "config"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    stem = _name_rule(stem)
    if stem:
        return stem
    candidates = [str(config.get("_name_or_path") or "")] if isinstance(config, dict) else []
    directory = path.resolve().parent
    if directory.parent.name == "snapshots":  # <cache>/models--Org--Name/snapshots/<commit>/config.json
        candidates.append(directory.parent.parent.name)
    candidates.append(directory.name)
    for candidate in candidates:
        name = _card_name_of(candidate)
        if name:
            return name
    return "model"
