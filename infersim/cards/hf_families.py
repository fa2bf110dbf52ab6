"""The model families InferSim reads from a HuggingFace config, and how each builds its MLP.

A config names its model twice: `model_type` (the config class transformers loads) and
`architectures` (the model classes its weights were saved from). The importer maps a config's
fields onto a card by family rules (key names, which layers slide, whose MLP is gated), so a config
of a family it does not know would be priced as something else. Both names must belong to one
family of FAMILIES; a config of another architecture is refused, unless it asks to be simulated as
the nearest known one with the key `infersim_family` (a model_type of FAMILIES), which the card and
every report then say.

Each family's MLP shape follows its transformers modeling file (modeling_<model_type>.py):
gated (act(gate_proj x) * up_proj x, three matrices) or plain (fc1, act, fc2: two), and whether its
FFN layers are mixtures of experts (a config of such a family with 0 routed experts is not that
model). The activation is read from every key that names one (hidden_act, hidden_activation,
activation_function, mlp_hidden_act, ...): the MLP's own key wins, and an activation InferSim does
not price as one elementwise kernel, or a key of a part it does not model, is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from infersim.base.errors import MISSING, ConfigError, echo

#: the config key asking for a config of an unknown architecture to be simulated as a known family
FAMILY_KEY = "infersim_family"


@dataclass(frozen=True)
class Family:
    name: str  # the family's model_type
    model_types: tuple[str, ...]  # model_type values of the family (multimodal wrappers' text models too)
    class_prefixes: tuple[str, ...]  # architectures class names without For.../LMHeadModel/Model
    gated_mlp: bool
    moe: bool = False  # the FFN layers are routed experts (some may be dense)
    activation: str = "silu"  # when the config names none


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), ("Llama",), True),
    Family("llama4", ("llama4", "llama4_text"), ("Llama4",), True, moe=True),
    Family("mistral", ("mistral",), ("Mistral",), True),
    Family("mixtral", ("mixtral",), ("Mixtral",), True, moe=True),
    Family("qwen2", ("qwen2",), ("Qwen2",), True),
    Family("qwen2_moe", ("qwen2_moe",), ("Qwen2Moe",), True, moe=True),
    Family("qwen3", ("qwen3",), ("Qwen3",), True),
    Family("qwen3_moe", ("qwen3_moe",), ("Qwen3Moe",), True, moe=True),
    Family("qwen3_next", ("qwen3_next",), ("Qwen3Next",), True, moe=True),
    Family("qwen3_5", ("qwen3_5", "qwen3_5_text"), ("Qwen3_5",), True),
    Family("qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text"), ("Qwen3_5Moe",), True, moe=True),
    Family("deepseek_v2", ("deepseek_v2",), ("DeepseekV2",), True, moe=True),
    Family("deepseek_v3", ("deepseek_v3",), ("DeepseekV3",), True, moe=True),
    Family("deepseek_v32", ("deepseek_v32",), ("DeepseekV32",), True, moe=True),
    Family("gpt_oss", ("gpt_oss",), ("GptOss",), True, moe=True),
    Family("gemma", ("gemma",), ("Gemma",), True, activation="gelu_pytorch_tanh"),
    Family("gemma2", ("gemma2",), ("Gemma2",), True, activation="gelu_pytorch_tanh"),
    Family("gemma3", ("gemma3", "gemma3_text"), ("Gemma3",), True, activation="gelu_pytorch_tanh"),
    Family("olmo2", ("olmo2",), ("Olmo2",), True),
    Family("phi3", ("phi3",), ("Phi3",), True),
    Family("opt", ("opt",), ("OPT",), False, activation="relu"),
    Family("bloom", ("bloom",), ("Bloom",), False, activation="gelu"),
    Family("gpt2", ("gpt2",), ("GPT2",), False, activation="gelu_new"),
    Family("gpt_neox", ("gpt_neox",), ("GPTNeoX",), False, activation="gelu"),
    Family("falcon", ("falcon",), ("Falcon",), False, activation="gelu"),
    Family("nemotron", ("nemotron",), ("Nemotron",), False, activation="relu2"),
)
#: families whose layer layout the importer does not build, with why (refused by name, not as unknown)
UNMODELLED = {
    "nemotron_h": "Nemotron-H interleaves Mamba-2, attention and MLP-only layers by hybrid_override_pattern "
                  "(transformers' default pattern when the config has none), which the importer does not build; "
                  "write the card's layer_types by hand",
    "jamba": "Jamba's attention periods and expert layers are not imported; write the card's layer_types by hand",
}
_UNMODELLED_PREFIXES = {"NemotronH": "nemotron_h", "Jamba": "jamba"}
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_BY_PREFIX = {p: f for f in FAMILIES for p in f.class_prefixes}
_CLASS_SUFFIX = re.compile(r"(For[A-Z][A-Za-z]*|LMHeadModel|Model)$")

#: activation names (transformers' ACT2FN keys) priced as one elementwise kernel, by kind
ACTIVATIONS = {
    "silu": "silu", "swish": "silu",
    "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_python": "gelu",
    "gelu_accurate": "gelu", "quick_gelu": "gelu",
    "relu": "relu", "relu2": "relu2",
}
#: the card's ffn_activation for a (gated MLP, activation kind)
_CARD_ACTIVATION = {(True, "silu"): "swiglu", (True, "gelu"): "geglu", (False, "gelu"): "gelu",
                    (False, "relu"): "relu", (False, "relu2"): "relu2"}
_ACTIVATION_KEY = re.compile(r"(?:^|_)(?:act|activation)(?:_fn|_function)?$")
#: keys naming the MLP's activation, the more specific first
_MLP_KEYS = ("mlp_hidden_act", "mlp_activation", "ffn_act_fn", "ffn_hidden_act", "hidden_activation", "hidden_act",
             "activation_function", "activation", "act_fn")
#: other parts whose activation a key may name, which InferSim prices whatever it is (Mamba-2's gate)
_OTHER_PARTS = ("mamba_",)


def known_families() -> str:
    return ", ".join(f.name for f in FAMILIES)


def _class_family(name: Any, source: str) -> Family | None:
    if not isinstance(name, str):
        raise ConfigError(source, "architectures", name, "expected model class names (text)")
    return _BY_PREFIX.get(_CLASS_SUFFIX.sub("", name))


def _requested(config: dict[str, Any], source: str) -> Family:
    wanted = config[FAMILY_KEY]
    family = _BY_TYPE.get(wanted) if isinstance(wanted, str) else None
    if family is None:
        raise ConfigError(source, FAMILY_KEY, wanted, f"not a family InferSim models (known: {known_families()})")
    return family


def family_of(config: dict[str, Any], source: str) -> tuple[Family, str]:
    """The family a config's model_type and architectures name, and a note ('' unless the config asked
    for the nearest known family with FAMILY_KEY); one ConfigError for an unknown or mixed architecture."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    if architectures is not None and not isinstance(architectures, list):
        raise ConfigError(source, "architectures", architectures, "expected a list of model class names")
    own = ", ".join(str(a) for a in architectures or ()) or str(model_type)
    if config.get(FAMILY_KEY) is not None:
        family = _requested(config, source)
        return family, (f"simulated as the {family.name} family at the config's request ({FAMILY_KEY}): its own "
                        f"architecture {echo(own)} is not one InferSim models")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(source, "model_type", model_type, "expected a model type name (text)")
    by_type = _BY_TYPE.get(model_type) if model_type else None
    classes = [(name, _class_family(name, source)) for name in architectures or ()]
    hint = (f"InferSim models the families {known_families()}; to simulate it as the nearest of them, add "
            f"\"{FAMILY_KEY}\": \"<family>\" to the config (the card and every report then say so)")
    unmodelled = model_type if model_type in UNMODELLED else next(
        (_UNMODELLED_PREFIXES[p] for p in (_CLASS_SUFFIX.sub("", str(n)) for n in architectures or ())
         if p in _UNMODELLED_PREFIXES), None)
    if unmodelled:
        raise ConfigError(source, "model_type" if model_type == unmodelled else "architectures",
                          model_type if model_type == unmodelled else own, f"{UNMODELLED[unmodelled]}; {hint}")
    if model_type and by_type is None:
        raise ConfigError(source, "model_type", model_type, f"not a model family InferSim models: {hint}")
    unknown = [name for name, family in classes if family is None]
    if unknown:
        raise ConfigError(source, "architectures", unknown[0], f"not a model class InferSim models: {hint}")
    families = {family for _, family in classes if family is not None} | ({by_type} if by_type else set())
    if not families:
        raise ConfigError(source, "model_type", MISSING, f"the config names no architecture (model_type or "
                          f"architectures): {hint}")
    if len(families) > 1:
        raise ConfigError(source, "architectures", architectures,
                          f"names another family than model_type {model_type!r}: which one the weights are is unknown")
    return families.pop(), ""


def _activation_keys(config: dict[str, Any]) -> list[str]:
    return [key for key in config if isinstance(key, str) and _ACTIVATION_KEY.search(key)]


def _activation_kind(config: dict[str, Any], key: str, source: str) -> str:
    value = config[key]
    if not isinstance(value, str) or value not in ACTIVATIONS:
        raise ConfigError(source, key, value, f"not an activation InferSim prices (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[value]


def card_activation(config: dict[str, Any], family: Family, source: str) -> str:
    """The card's ffn_activation: the family's MLP shape with the activation the config names (every
    activation key is read: the MLP's own wins; others must be of a part InferSim prices)."""
    mlp_key = None
    for key in _activation_keys(config):
        if config[key] is None:
            continue
        _activation_kind(config, key, source)
        if key in _MLP_KEYS:
            if mlp_key is None or _MLP_KEYS.index(key) < _MLP_KEYS.index(mlp_key):
                mlp_key = key
        elif not key.startswith(_OTHER_PARTS):
            raise ConfigError(source, key, config[key], "the activation of a part InferSim does not model (it models "
                              "the MLP's and Mamba-2's)")
    name = config[mlp_key] if mlp_key else family.activation
    card = _CARD_ACTIVATION.get((family.gated_mlp, ACTIVATIONS[name]))
    if card is None:
        shape = "gated" if family.gated_mlp else "plain (two-matrix)"
        raise ConfigError(source, mlp_key or "model_type", name if mlp_key else family.name,
                          f"a {shape} MLP with activation {name} is not modelled ({family.name} family)")
    return card
