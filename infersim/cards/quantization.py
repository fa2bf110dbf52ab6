"""The checkpoint's weight format: how a model's published weights are stored (HF quantization_config).

A checkpoint is part of the model: DeepSeek-V3's weights are fp8 in 128x128 blocks, GPT-OSS's routed
experts MXFP4, a GPTQ Qwen3-8B int4 in groups of 128. `cards import-hf` reads `quantization_config`
into the card's `quantization` section (`quantization_from_hf`), and a run prices the weights in
those formats unless its run config names the formats itself (`infersim.run.config.with_checkpoint_precision`).

Which modules a checkpoint leaves unquantised (`modules_to_not_convert`, `ignored_layers`,
`ignore`, `exclude_modules`) is read against the weights InferSim prices: attention projections
(`attention_weights` where the checkpoint leaves them alone unquantised), dense FFN and shared
experts (one format: `weights`) and routed experts (`expert_weights`). A pattern
is matched as the libraries match it - `re:` a regular expression (compressed-tensors), `*` a glob,
else a substring of the module name (transformers) - against module names of the common layouts
(`model.layers.N.self_attn.q_proj`, `...mlp.experts.N.up_proj`, ...). Embeddings, the LM head,
routers, norms and convolutions are kept in bf16 by the simulator whatever the checkpoint says.
Scales (one per group of `group_size` weights) are recorded but not priced: 0.02% of the bytes for
128x128 fp8 blocks, 6% for MXFP4 (one byte per 32 half-bytes), 12.5% for NVFP4, ~4% for int4 in
groups of 128.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from infersim.cards.schema import check_number, spec
from infersim.base.errors import ConfigError

WeightFormat = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
ActivationFormat = Literal["fp8", "fp4", "int8"]
METHODS = ("fp8", "fbgemm_fp8", "mxfp4", "modelopt", "gptq", "awq", "compressed-tensors", "bitsandbytes")


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """How a checkpoint stores its weights (read from a HuggingFace config's quantization_config)."""

    method: Literal["fp8", "fbgemm_fp8", "mxfp4", "modelopt", "gptq", "awq", "compressed-tensors", "bitsandbytes"] = spec(
        doc="the checkpoint's quant_method, as its config names it")
    weights: WeightFormat = spec(doc="storage format of the linear weights outside the routed experts (attention, "
                                     "dense FFN, shared experts)")
    expert_weights: WeightFormat = spec(doc="storage format of the routed experts' weights")
    attention_weights: WeightFormat | None = spec(
        None, doc="storage format of every layer's attention (mixer) projections where the checkpoint leaves them "
                  "unquantised and quantises the rest (compressed-tensors ignoring self_attn); null: as weights")
    activations: ActivationFormat | None = spec(
        None, doc="format the checkpoint's kernels quantise GEMM inputs to (W8A8 fp8, NVFP4 W4A4); null: "
                  "weight-only, inputs stay bf16")
    group_size: int = spec(0, doc="weights sharing one scale (128x128 blocks: 16384; MXFP4: 32; NVFP4: 16; GPTQ/AWQ: "
                                  "their group_size; 0: one scale per tensor or channel); scales are not priced",
                           ge=0)
    excluded: tuple[str, ...] = spec((), doc="modules the checkpoint leaves unquantised, as its config lists them")
    detail: str = spec("", doc="the format in words, and how the exclusions were read")

    def describe(self) -> str:
        return self.detail or self.method


# ---------------------------------------------------------------------------------------------
# Reading quantization_config

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", "float": "bf16"}

# module names of one layer in the common HF layouts, by what InferSim prices them as
_PREFIXES = ("model.layers.{i}.", "model.language_model.layers.{i}.", "language_model.model.layers.{i}.",
             "transformer.h.{i}.", "model.decoder.layers.{i}.")
_CATEGORY_NAMES = {
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "self_attn.qkv_proj", "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                  "self_attn.kv_b_proj", "linear_attn.in_proj_qkvz", "linear_attn.out_proj", "mixer.in_proj",
                  "mixer.out_proj"),
    "dense FFN": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "feed_forward.gate_proj",
                  "feed_forward.up_proj", "feed_forward.down_proj"),
    "shared experts": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.down_proj", "mlp.shared_expert.gate_proj",
                       "mlp.shared_expert.down_proj", "feed_forward.shared_expert.down_proj"),
    "routed experts": ("mlp.experts.3.gate_proj", "mlp.experts.3.down_proj", "mlp.experts.gate_up_proj",
                       "mlp.experts.down_proj", "block_sparse_moe.experts.3.w1", "feed_forward.experts.down_proj"),
}
_PROBE_LAYERS = (0, 1, 2, 3, 5, 7, 10, 17, 31, 47, 60, 93)


def _matcher(pattern: str) -> Any:
    """How the libraries match an exclusion: 're:' a regular expression from the name's start
    (compressed-tensors); else a dotted part of the name, '*' standing for anything (transformers,
    vLLM, ModelOpt): 'self_attn' and 'model.layers.*.self_attn' cover every attention projection,
    'mlp.gate' the router but not mlp.gate_proj."""
    if pattern.startswith("re:"):
        try:
            regex = re.compile(pattern[3:])
        except re.error:
            return None
        return lambda name: regex.match(name) is not None
    body = ".*".join(re.escape(part) for part in pattern.strip(".").split("*"))
    regex = re.compile(rf"(?:^|\.){body}(?:\.|$)")
    return lambda name: regex.search(name) is not None


def classify_exclusions(patterns: list[str]) -> tuple[dict[str, str], list[str]]:
    """For each priced category, 'all' (every layer's weights unquantised) or 'some' (a few layers'),
    and the patterns that name no priced weight (embeddings, LM head, routers, norms, vision ...)."""
    coverage: dict[str, str] = {}
    other = []
    for pattern in patterns:
        match = _matcher(pattern)
        hit = False
        if match is not None:
            for category, names in _CATEGORY_NAMES.items():
                layers = {i for i in _PROBE_LAYERS for prefix in _PREFIXES for name in names
                          if match(prefix.format(i=i) + name)}
                if not layers:
                    continue
                hit = True
                full = len(layers) == len(_PROBE_LAYERS)
                if full or coverage.get(category) != "all":
                    coverage[category] = "all" if full else "some"
        if not hit:
            other.append(pattern)
    return coverage, other


def _strings(value: Any, source: str, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(source, f"quantization_config.{key}", value, "expected a list of module names")
    return list(value)


def _bits_format(bits: int, kind: Any, source: str, key: str) -> str:
    kind = str(kind or "int").lower()
    formats = {(8, "float"): "fp8", (8, "int"): "int8", (4, "int"): "int4", (4, "float"): "fp4"}
    found = formats.get((bits, "float" if kind.startswith("float") else "int"))
    if found is None:
        raise ConfigError(source, f"quantization_config.{key}", {"num_bits": bits, "type": kind},
                          "not modelled: InferSim prices 8-bit (fp8, int8) and 4-bit (int4, fp4) weights")
    return found


@dataclass(frozen=True)
class _Scheme:
    """What one quant_method stores: the weight format, the GEMM inputs' format (None: weight-only),
    the scale group size (0: per tensor or channel), whether only the routed experts are quantised."""

    weights: str
    activations: str | None
    group: int
    experts_only: bool
    detail: str


def quantization_from_hf(config: dict[str, Any], source: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The card's `quantization` section from an HF config's quantization_config (None: unquantised).
    `fields` are the card fields read so far (to weigh a split exclusion by parameter counts)."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError(source, "quantization_config", qc, "expected a mapping")
    if isinstance(qc.get("quantization"), dict):  # ModelOpt's hf_quant_config.json nests it
        qc = {**qc, **qc["quantization"]}
    method = str(qc.get("quant_method", "")).lower().replace("_", "-") if qc.get("quant_method") else ""
    method = {"fbgemm-fp8": "fbgemm_fp8", "compressed_tensors": "compressed-tensors"}.get(method, method)
    stored = _DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower(), "bf16")
    reader = _SCHEME_READERS.get(method)
    if reader is None:
        raise ConfigError(source, "quantization_config.quant_method", qc.get("quant_method", "<missing>"),
                          f"not modelled (modelled: {', '.join(METHODS)}): remove quantization_config from a copy of "
                          "the config to import the model unquantised")
    scheme = reader(qc, source, method)
    weights, activations, group, experts_only = scheme.weights, scheme.activations, scheme.group, scheme.experts_only
    excluded = []
    for key in ("modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules"):
        excluded += _strings(qc.get(key), source, key)
    coverage, _other = classify_exclusions(excluded)
    for part in ("dense FFN", "shared experts"):
        if not _params(fields, part):
            coverage.pop(part, None)  # the model has none
    if not fields.get("num_experts"):
        coverage.pop("routed experts", None)
    # attention unquantised beside other quantised linear weights (dense FFN, shared experts) has a
    # format of its own; where it is the only linear weight outside the experts, it is `weights`
    others = ("dense FFN", "shared experts")
    attention = None
    if coverage.get("attention") == "all" and not experts_only and any(_params(fields, p) for p in others):
        attention = stored
        del coverage["attention"]
    parts = others if attention else ("attention", *others)
    non_expert, full, notes = _non_expert_format(coverage, fields, weights, stored, experts_only, parts)
    if attention == non_expert:
        attention = None  # the attention's format is the rest's
    detail = scheme.detail
    expert = stored if coverage.get("routed experts") == "all" else weights
    partial = [p for p, how in coverage.items() if how == "some"]
    if partial:
        notes.append(f"the checkpoint leaves {', '.join(partial)} of some layers unquantised; priced as quantised")
    if non_expert == stored and weights != stored and not experts_only:
        detail += f"; {', '.join(full)} kept {stored}"
    if attention is not None:
        detail += f"; attention kept {stored}"
    if expert == stored and weights != stored:
        detail += f"; routed experts kept {stored}"
    detail = "; ".join([detail, *notes])
    return {"method": method, "weights": non_expert, "expert_weights": expert if fields.get("num_experts") else non_expert,
            **({"attention_weights": attention} if attention else {}),
            **({"activations": activations} if activations else {}), **({"group_size": group} if group else {}),
            **({"excluded": excluded} if excluded else {}), "detail": detail}


def _non_expert_format(coverage: dict[str, str], fields: dict[str, Any], weights: str, stored: str,
                       experts_only: bool, parts: tuple[str, ...]) -> tuple[str, list[str], list[str]]:
    """The one format of `parts` (of attention, dense FFN, shared experts) when the checkpoint leaves
    some of them wholly unquantised (the larger share of their parameters decides), the parts it
    leaves so, and notes saying what was chosen."""
    notes: list[str] = []
    non_expert = stored if experts_only else weights
    full = [p for p in parts if coverage.get(p) == "all"]
    if full and not experts_only:
        kept = [p for p in parts if p not in full and _params(fields, p)]
        unquantised = sum(_params(fields, p) for p in full)
        quantised = sum(_params(fields, p) for p in kept)
        if unquantised >= quantised:
            non_expert = stored
            if kept:
                notes.append(f"{', '.join(full)} unquantised and {', '.join(kept)} {weights}: InferSim has one format "
                             f"for these, priced {stored} (the larger share of their parameters)")
        else:
            notes.append(f"{', '.join(full)} unquantised and {', '.join(kept)} {weights}: InferSim has one format for "
                         f"these, priced {weights} (the larger share of their parameters)")
    return non_expert, full, notes


def _fp8_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    fmt = str(qc.get("fmt", "e4m3"))
    block = qc.get("weight_block_size")
    group = 0
    if block is not None:
        if not isinstance(block, list) or len(block) != 2:
            raise ConfigError(source, "quantization_config.weight_block_size", block, "expected [rows, columns]")
        rows, cols = (int(check_number(b, source, "quantization_config.weight_block_size", whole=True, gt=0))
                      for b in block)
        group = rows * cols
    # dynamic or static scheme: inputs are quantised to fp8 too (W8A8)
    detail = (f"fp8 {fmt}" + (f", {block[0]}x{block[1]} blocks" if block else ", one scale per tensor")
              + f", {qc.get('activation_scheme', 'dynamic')} fp8 activations"
              + (f", {qc['scale_fmt']} scales" if qc.get("scale_fmt") else ""))
    return _Scheme("fp8", "fp8", group, False, detail)


def _fbgemm_fp8_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    return _Scheme("fp8", "fp8", 0, False, "fp8 per output channel, dynamic per-token fp8 activations (fbgemm)")


def _mxfp4_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    # transformers' Mxfp4HfQuantizer converts the MoE experts only (GPT-OSS); the rest keeps its dtype
    return _Scheme("fp4", None, 32, True, "MXFP4 routed experts (e2m1 in 32-element blocks, e8m0 scales), weight-only")


def _modelopt_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    algo = str(qc.get("quant_algo", "")).upper()
    known = {"NVFP4": ("fp4", "fp4", 16), "FP8": ("fp8", "fp8", 0), "FP8_PER_CHANNEL_PER_TOKEN": ("fp8", "fp8", 0),
             "FP8_PB_WO": ("fp8", None, 16384), "W4A8_AWQ": ("int4", "fp8", 128), "MXFP8": ("fp8", "fp8", 32)}
    if algo not in known:
        raise ConfigError(source, "quantization_config.quant_algo", qc.get("quant_algo") or None,
                          f"not modelled (known ModelOpt algorithms: {', '.join(known)})")
    weights, activations, group = known[algo]
    group = int(qc.get("group_size") or group) if algo in ("NVFP4", "W4A8_AWQ") else group
    return _Scheme(weights, activations, group, False, f"ModelOpt {algo}" + (f", groups of {group}" if group else ""))


def _integer_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    """GPTQ and AWQ: 4- or 8-bit integer weights in groups, bf16 inputs."""
    bits = int(check_number(qc.get("bits", qc.get("w_bit", 4)), source, "quantization_config.bits", whole=True, gt=0))
    if bits not in (4, 8):
        raise ConfigError(source, "quantization_config.bits", bits,
                          "not modelled: InferSim prices 4- and 8-bit integer weights")
    group = int(check_number(qc.get("group_size", qc.get("q_group_size", 128)), source,
                             "quantization_config.group_size", whole=True))
    group = max(group, 0)  # -1: one scale per output channel
    detail = f"{method.upper()} int{bits}" + (f", groups of {group}" if group else ", per channel") + \
        ", weight-only (inputs bf16)"
    return _Scheme("int4" if bits == 4 else "int8", None, group, False, detail)


def _compressed_tensors_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups or not all(isinstance(g, dict) for g in groups.values()):
        raise ConfigError(source, "quantization_config.config_groups", groups, "expected a mapping of scheme groups")
    name, scheme = next(iter(groups.items()))
    w = scheme.get("weights") or {}
    if not isinstance(w, dict) or "num_bits" not in w:
        raise ConfigError(source, f"quantization_config.config_groups.{name}.weights", w,
                          "expected {num_bits, type, ...}")
    weights = _bits_format(int(check_number(w["num_bits"], source, "num_bits", whole=True)), w.get("type"), source,
                           f"config_groups.{name}.weights")
    activations = None
    a = scheme.get("input_activations")
    if isinstance(a, dict) and "num_bits" in a:
        activations = _bits_format(int(check_number(a["num_bits"], source, "num_bits", whole=True)), a.get("type"),
                                   source, f"config_groups.{name}.input_activations")
    group = int(check_number(w.get("group_size") or 0, source, "group_size", whole=True, ge=0))
    detail = (f"compressed-tensors {qc.get('format', '')} {weights} weights".replace("  ", " ")
              + (f", {activations} activations" if activations else ", weight-only")
              + (f", groups of {group}" if group else "")
              + (f" (first of {len(groups)} scheme groups)" if len(groups) > 1 else ""))
    return _Scheme(weights, activations, group, False, detail)


def _bitsandbytes_scheme(qc: dict[str, Any], source: str, method: str) -> _Scheme:
    four = bool(qc.get("load_in_4bit")) or str(qc.get("bnb_4bit_quant_type", "")).lower() in ("nf4", "fp4")
    weights, group = ("int4", 64) if four else ("int8", 0)
    # transformers' BitsAndBytesConfig: bnb_4bit_quant_type defaults to fp4 (priced alike: 4-bit blocks of 64)
    kind = qc.get("bnb_4bit_quant_type") or "fp4 (bnb_4bit_quant_type not stated: transformers' default)"
    detail = ("bitsandbytes " + (f"{kind} 4-bit" if four else "LLM.int8()")
              + ", weight-only (dequantised to bf16 for each GEMM)")
    return _Scheme(weights, None, group, False, detail)


_SCHEME_READERS = {"fp8": _fp8_scheme, "fbgemm_fp8": _fbgemm_fp8_scheme, "mxfp4": _mxfp4_scheme,
                   "modelopt": _modelopt_scheme, "gptq": _integer_scheme, "awq": _integer_scheme,
                   "compressed-tensors": _compressed_tensors_scheme, "bitsandbytes": _bitsandbytes_scheme}


def _params(fields: dict[str, Any], part: str) -> float:
    """Rough parameters of one kind of weight over the model (to weigh a split exclusion)."""
    h = fields.get("hidden_size", 0)
    layers = fields.get("num_hidden_layers", 0)
    if part == "attention":
        heads, kv, d = fields.get("num_attention_heads", 0), fields.get("num_key_value_heads", 0), fields.get("head_dim", 0)
        return layers * h * d * (2 * heads + 2 * kv)
    if part == "dense FFN":
        dense = layers - (layers - fields.get("first_k_dense_replace", 0) if fields.get("num_experts") else 0)
        return dense * 3 * h * fields.get("intermediate_size", 0)
    width = fields.get("shared_expert_intermediate_size") or fields.get("moe_intermediate_size", 0)
    return layers * 3 * h * width * fields.get("num_shared_experts", 0)
