"""How a name that is no file and no bundled card name as written finds a bundled card.

A name matches only
  - exactly, ignoring case and punctuation (vLLM -> vllm, Llama-3.1-8B -> llama-3.1-8b);
  - by a spelling a card lists: its `aliases`, and for models the HF ids of its `checkpoint` and
    `quantized_checkpoints` (whole, or the repository part: DeepSeek-R1 -> deepseek-v3);
  - for models, as such a name followed only by words that name a release of the same weights
    (Instruct, Chat, hf, it, Thinking, Exp, a date or version: Qwen3-30B-A3B-Instruct-2507) or
    their storage format (FP8, GPTQ-Int4, AWQ, NVFP4): the format is then the run's;
  - as the unique prefix, in whole words, of one card's name or spelling (qwen3-235b ->
    qwen3-235b-a22b, H100-80GB -> "H100 80GB HBM3", an alias of h100-sxm).
Anything else is no match (`evilcorp/qwen3-8b-but-actually-70b` is not qwen3-8b), and the message
that says so suggests the closest names (difflib). A weight format a name states that InferSim
cannot price from a name alone (GGUF, bitsandbytes, GPTQ without its bits) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infersim.base.errors import InferSimError

# Words after a model's name that name a release of the same architecture and weights.
_RELEASE_WORDS = frozenset({"instruct", "chat", "hf", "base", "it", "thinking", "exp", "preview", "latest", "pt"})
_RELEASE_PATTERN = re.compile(r"^(v\d+(\.\d+)*|\d{4}|\d{6}|\d{8})$")  # v0.1, 2507, 0528, 20250101
# Words that name how the weights are stored, read into one format below.
_FORMAT_WORDS = frozenset({"fp8", "int4", "int8", "fp4", "nvfp4", "w4a16", "w8a16", "w8a8", "gptq", "awq",
                           "dynamic", "static", "block", "e4m3"})
# Storage formats a name may state that are not priced from a name alone: the checkpoint's
# config.json (quantization_config) says what they hold.
_UNREAD_FORMAT_WORDS = frozenset({"gguf", "bnb", "bitsandbytes", "nf4", "4bit", "8bit", "2bit", "3bit", "exl2",
                                  "exl3", "mlx", "mxfp4", "w4a8", "int2", "int3", "quantized", "hqq", "marlin"})


def fold(name: str) -> str:
    """A name as forgiving matching compares it: lower case, letters, digits and dots only
    ("TensorRT-LLM" and "tensorrt_llm" fold alike; "llama-3.1-8b" keeps its dots)."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


def words(name: str) -> list[str]:
    """The folded words of a name, split at dashes, underscores and spaces."""
    return [w for w in (fold(part) for part in re.split(r"[-_\s]+", name)) if w]


def repo_part(name: str) -> str:
    """The last part of an HF id or path (`Qwen/Qwen3-8B` -> `Qwen3-8B`)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Spelling:
    """A name a bundled card answers to besides its own."""

    text: str
    card: str
    what: str  # "alias", "checkpoint" or "<format> checkpoint"
    weight_format: str | None = None  # the format of a quantized_checkpoints entry


@dataclass(frozen=True)
class NameMatch:
    """A bundled card found for a name, how, and the checkpoint format the name states (models)."""

    card: str
    how: str
    quantization: dict[str, Any] | None = None  # the card's `quantization` section the name implies
    format_note: str = ""


def card_spellings(name: str, data: Any, kind: str) -> list[Spelling]:
    """The spellings a bundled card's YAML lists: aliases, and a model's checkpoint ids."""
    if not isinstance(data, dict):
        return []
    out = [Spelling(str(a), name, "alias") for a in data.get("aliases") or () if isinstance(a, (str, int))]
    if kind == "models":
        if isinstance(data.get("checkpoint"), str):
            out.append(Spelling(data["checkpoint"], name, "checkpoint"))
        quantized = data.get("quantized_checkpoints")
        for fmt, repo in (quantized.items() if isinstance(quantized, dict) else ()):
            if isinstance(repo, str):
                out.append(Spelling(repo, name, f"{fmt} checkpoint", str(fmt)))
    return out


def _spelled(spelling: Spelling, given: str) -> bool:
    folded = fold(given)
    return fold(spelling.text) == folded or ("/" in spelling.text and fold(repo_part(spelling.text)) == folded)


def _exact(name: str, names: list[str], spellings: list[Spelling]) -> tuple[list[str], str, Spelling | None]:
    folded = fold(name)
    hits = [n for n in names if fold(n) == folded]
    if hits:
        return hits, "same name ignoring case and punctuation", None
    found = [s for s in spellings if _spelled(s, name)] or [s for s in spellings if _spelled(s, repo_part(name))]
    cards = sorted({s.card for s in found})
    if not cards:
        return [], "", None
    first = found[0]
    how = (f"an alias of bundled card {first.card}" if first.what == "alias"
           else f"the {first.what} {first.text} of bundled card {first.card}")
    return cards, how, first if len(cards) == 1 else None


def _release_or_format(extra: list[str]) -> bool:
    return all(w in _RELEASE_WORDS or _RELEASE_PATTERN.match(w) or w in _FORMAT_WORDS or w in _UNREAD_FORMAT_WORDS
               for w in extra)


def _base_and_extra(name: str, names: list[str], spellings: list[Spelling]) -> tuple[str, list[str], str] | None:
    """(card, the words after its name, how) where the repository part of `name` is a card's name or
    spelling followed by more words; None when no leading words name a card. The format of a
    quantized checkpoint the leading words spell counts as one of the words after."""
    given = words(repo_part(name))
    for start in (0, 1) if given[:1] == ["meta"] else (0,):  # Meta-Llama-3.1-8B
        for end in range(len(given), start, -1):
            head = "".join(given[start:end])
            cards, how, spelling = _exact(head, names, spellings)
            if len(cards) == 1:
                stated = [spelling.weight_format] if spelling is not None and spelling.weight_format else []
                return cards[0], stated + given[end:], how
    return None


def _prefix_of(name: str, names: list[str], spellings: list[Spelling]) -> dict[str, str]:
    """Card -> the first of its names or spellings that starts with the words of `name`, in whole words."""
    given = words(name)
    if not given:
        return {}
    texts = [(n, n) for n in names] + [(s.text, s.card) for s in spellings]
    texts += [(repo_part(s.text), s.card) for s in spellings if "/" in s.text]
    found: dict[str, str] = {}
    for text, card in texts:
        if len(words(text)) > len(given) and words(text)[:len(given)] == given:
            found.setdefault(card, text)
    return dict(sorted(found.items()))


def match_name(name: str, kind: str, names: list[str], spellings: list[Spelling]) -> NameMatch | None:
    """The bundled card `name` means (see the module docstring); None when none; an error when the
    name may mean several cards or states a weight format that cannot be priced."""
    if not name.strip():
        return None
    cards, how, spelling = _exact(name, names, spellings)
    if len(cards) == 1:
        stated = spelling.weight_format if spelling is not None else None
        return NameMatch(cards[0], how, *(_format_section(name, [stated]) if stated else (None, "")))
    if len(cards) > 1:
        raise ambiguous(name, kind, cards)
    if kind == "models":
        found = _base_and_extra(name, names, spellings)
        if found is not None:
            card, extra, base_how = found
            if not _release_or_format(extra):
                return None  # more words than a release of that model: another model
            quantization, note = _format_section(name, [w for w in extra if not _is_release(w)])
            release = [w for w in extra if _is_release(w)]
            how = base_how if base_how.startswith(("an alias", "the ")) else "the bundled card of that model"
            if release:
                how += f"; '{' '.join(release)}' names a release of the same weights"
            return NameMatch(card, how, quantization, note)
    prefixed = _prefix_of(name, names, spellings)
    if len(prefixed) > 1:
        raise ambiguous(name, kind, prefixed)
    for card, text in prefixed.items():
        whose = "name" if text == card else f"name or alias ({text})"
        return NameMatch(card, f"the only bundled card whose {whose} begins with those words")
    return None


def _is_release(word: str) -> bool:
    return word in _RELEASE_WORDS or bool(_RELEASE_PATTERN.match(word))


def ambiguous(name: str, kind: str, cards: Iterable[str]) -> InferSimError:
    what = kind[:-1] if kind.endswith("s") else kind
    return InferSimError(f"{what} '{name}' is ambiguous: it may mean {', '.join(cards)}; give one of these names")


# ---------------------------------------------------------------------------------------------
# The weight format a model name states


def _format_section(name: str, stated: list[str | None]) -> tuple[dict[str, Any] | None, str]:
    """(the model card's `quantization` section, a note) for the format words of a name (FP8,
    GPTQ-Int4, AWQ, NVFP4 ...); (None, "") when it states none. Raises for a format that cannot be
    priced from a name, or words that contradict each other."""
    found = {w for w in stated if w}
    if not found:
        return None, ""
    unread = sorted(found & _UNREAD_FORMAT_WORDS)
    if unread:
        raise InferSimError(
            f"model '{name}': the name states weights in '{unread[0]}', a format InferSim does not price from a "
            "name: pass the path of the checkpoint's config.json (its quantization_config says what it stores), or "
            "name the bundled model and give --precision")
    fmt = _read_format(name, found)
    method, weights, activations, words_ = fmt
    section: dict[str, Any] = {"method": method, "weights": weights, "expert_weights": weights,
                               "detail": f"{words_}, as the model name '{name}' states (scales not priced)"}
    if activations:
        section["activations"] = activations
    how = f"{weights} weights" + (f" and {activations} GEMM inputs" if activations else ", weight-only (GEMM inputs bf16)")
    return section, f"checkpoint format {words_} read from the name: {how}"


def _read_format(name: str, found: set[str]) -> tuple[str, str, str | None, str]:
    """(quant method, weight format, activation format or None, the format in words)."""
    bits = {w for w in found if w in ("fp8", "int4", "int8", "fp4", "nvfp4", "w4a16", "w8a16", "w8a8")}
    method = "gptq" if "gptq" in found else "awq" if "awq" in found else None
    if "gptq" in found and "awq" in found:
        raise _contradiction(name, "GPTQ and AWQ")
    if method == "awq" and bits <= {"int4", "w4a16"}:
        return "awq", "int4", None, "AWQ int4"
    if method == "gptq" and bits in ({"int4"}, {"int8"}, {"w4a16"}, {"w8a16"}):
        weights = "int4" if bits & {"int4", "w4a16"} else "int8"
        return "gptq", weights, None, f"GPTQ {weights}"
    if method is not None:
        raise InferSimError(f"model '{name}': the name says {method.upper()} but not in how many bits it stores "
                            f"weights ({method.upper()}-Int4 or -Int8): pass the path of the checkpoint's config.json")
    table = {frozenset({"fp8"}): ("fp8", "fp8", "fp8", "fp8 W8A8"),
             frozenset({"w8a8", "fp8"}): ("fp8", "fp8", "fp8", "fp8 W8A8"),
             frozenset({"w8a8", "int8"}): ("compressed-tensors", "int8", "int8", "int8 W8A8"),
             frozenset({"int8"}): ("compressed-tensors", "int8", None, "int8 weight-only"),
             frozenset({"w8a16"}): ("compressed-tensors", "int8", None, "int8 W8A16"),
             frozenset({"int4"}): ("compressed-tensors", "int4", None, "int4 weight-only"),
             frozenset({"w4a16"}): ("compressed-tensors", "int4", None, "int4 W4A16"),
             frozenset({"fp4"}): ("modelopt", "fp4", "fp4", "NVFP4 W4A4"),
             frozenset({"nvfp4"}): ("modelopt", "fp4", "fp4", "NVFP4 W4A4")}
    read = table.get(frozenset(bits))
    if read is None:
        words_ = ", ".join(sorted(found))
        if not bits:
            raise InferSimError(f"model '{name}': '{words_}' does not say how the weights are stored: pass the path "
                                "of the checkpoint's config.json")
        raise _contradiction(name, words_)
    return read


def _contradiction(name: str, what: str) -> InferSimError:
    return InferSimError(f"model '{name}': the name names more than one weight format ({what}): pass the path of the "
                         "checkpoint's config.json")


def near_miss(name: str, names: list[str], spellings: list[Spelling]) -> str:
    """Why a model name that begins with a card's name matched nothing ('' when it does not)."""
    found = _base_and_extra(name, names, spellings)
    if found is None:
        return ""
    card, extra, _how = found
    odd = [w for w in extra if not (_is_release(w) or w in _FORMAT_WORDS or w in _UNREAD_FORMAT_WORDS)]
    return (f"it begins with the name of bundled card {card} but goes on with '{' '.join(odd)}', words that name "
            f"no release or weight format of it (another model is not priced as {card})")


def suggestions(name: str, names: list[str], spellings: list[Spelling], n: int = 3) -> list[str]:
    """The bundled cards closest to `name` (difflib on folded names and spellings, release words
    dropped), best first: for a 'did you mean' after a miss."""
    given = "".join(w for w in words(repo_part(name)) if w not in _RELEASE_WORDS and w not in _FORMAT_WORDS)
    given = given or fold(name)
    options: dict[str, str] = {}
    for text, card in [(n_, n_) for n_ in names] + [(s.text, s.card) for s in spellings] + \
            [(repo_part(s.text), s.card) for s in spellings if "/" in s.text]:
        options.setdefault(fold(text), card)
    import difflib  # only for a name that does not resolve

    close = difflib.get_close_matches(given, list(options), n=n * 3, cutoff=0.6)
    return list(dict.fromkeys(options[c] for c in close))[:n]
