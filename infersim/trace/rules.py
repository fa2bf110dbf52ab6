"""Kernel-name rules: which simulator module a GPU kernel belongs to.

The shipped table (`kernel_rules.yaml`, next to this file) is an ordered list; the first rule whose
regular expression is found in the kernel name wins. User files given with `--rules` come first,
so they take precedence. Each rule is validated on load and every problem is one error naming
the file and the rule.

A rule maps to a module category (`infersim.cards.categories.ALL`), to `other` (known kernels
the simulator does not model: memcpy, memset, allocator fills) or to `gemm`: a dense GEMM whose
module depends on where it runs (attention projection, router gate, dense FFN, shared expert, LM
head), decided from its place in the layer. Optional fields:

- `role`: `attention` marks the attention-core kernel that occurs once per layer (layers are
  counted from it when the trace has no layer annotations); `norm` marks a normalisation that
  starts a sub-block (the post-attention norm, the next layer's input norm); `topk` marks a
  routing top-k / gating kernel, which makes the GEMM just before it the router gate.
- `where`: `before_layers`, `after_layers`, `in_layers` or `outside_layers`: the rule applies only
  to kernels at that place in the step (e.g. a softmax after the last layer is sampling, inside a
  layer it is not). Layer boundaries are found without these rules, so a rule with `where` cannot
  also have a `role`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from infersim.cards.schema import load_yaml
from infersim.base.errors import MISSING, ConfigError
from infersim.cards import categories as cat

GEMM = "gemm"  # dense GEMM, resolved by position
OTHER = "other"  # known, not modelled by the simulator
UNMATCHED = "unmatched"  # matched no rule: listed by name, never dropped
RULE_MODULES = (*cat.ALL, GEMM, OTHER)
ROLES = ("attention", "norm", "topk")
POSITIONS = ("before_layers", "in_layers", "after_layers", "outside_layers")
RULE_KEYS = ("name", "pattern", "module", "role", "where", "note")
SHIPPED_RULES = "kernel_rules.yaml"


@dataclass(frozen=True)
class KernelRule:
    name: str
    pattern: re.Pattern[str]
    module: str
    role: str | None = None
    where: str | None = None
    source: str = ""

    def applies_at(self, position: str | None) -> bool:
        """Whether this rule may match a kernel at `position` (None: position not known yet)."""
        if self.where is None:
            return True
        if position is None:
            return False
        if self.where == "outside_layers":
            return position != "in_layers"
        return self.where == position


@dataclass(frozen=True)
class RuleTable:
    rules: tuple[KernelRule, ...]
    sources: tuple[str, ...] = ()
    _cache: dict[tuple[str, str | None], KernelRule | None] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    def match(self, kernel_name: str, position: str | None = None) -> KernelRule | None:
        """The first rule matching the kernel name at this position, or None.

        Cached per (name, position): a trace repeats a few hundred distinct names millions of times.
        """
        key = (kernel_name, position)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = None
        for rule in self.rules:
            if rule.applies_at(position) and rule.pattern.search(kernel_name):
                found = rule
                break
        self._cache[key] = found
        return found

    def has_place_rule(self, kernel_name: str) -> bool:
        """Whether a rule that applies at some places only (`where`) matches the name."""
        return any(rule.where is not None and rule.pattern.search(kernel_name) for rule in self.rules)

    def module_of(self, kernel_name: str, position: str | None = None) -> str:
        rule = self.match(kernel_name, position)
        return rule.module if rule else UNMATCHED


def _fail(source: str, field_name: str, value: Any, problem: str) -> ConfigError:
    return ConfigError(source, field_name, value, problem)


def parse_rules(data: Any, source: str) -> tuple[KernelRule, ...]:
    """Validate a rule document: a mapping with a `rules` list, or a bare list of rules."""
    if isinstance(data, dict):
        unknown = sorted(set(map(str, data)) - {"rules", "version"})
        if unknown:
            raise _fail(source, unknown[0], data[unknown[0]], "unknown key (known keys: rules, version)")
        if "rules" not in data:
            raise _fail(source, "rules", MISSING, "required: a list of {pattern, module} rules")
        items = data["rules"]
    elif data is None:
        raise _fail(source, "", MISSING, "empty rules file: expected a list of {pattern, module} rules")
    else:
        items = data
    if not isinstance(items, list):
        if isinstance(data, dict):
            raise _fail(source, "rules", items, "expected a list of {pattern, module} rules")
        raise _fail(source, "", items, "not a mapping with a 'rules' list, nor a list of {pattern, module} rules")
    if not items:
        raise _fail(source, "rules" if isinstance(data, dict) else "", items,
                    "the list holds no rules: expected {pattern, module} rules")
    return tuple(_parse_rule(item, i, source) for i, item in enumerate(items))


def _parse_rule(item: Any, i: int, source: str) -> KernelRule:
    """One rule of the list (the `i`-th), validated."""
    where_ = f"rules[{i}]"
    if not isinstance(item, dict):
        raise _fail(source, where_, item, "expected a mapping with pattern and module")
    unknown = sorted(set(map(str, item)) - set(RULE_KEYS))
    if unknown:
        raise _fail(source, f"{where_}.{unknown[0]}", item[unknown[0]],
                    f"unknown key (known keys: {', '.join(RULE_KEYS)})")
    for required in ("pattern", "module"):
        if required not in item:
            raise _fail(source, f"{where_}.{required}", MISSING, "required field is missing")
    pattern_text = item["pattern"]
    if not isinstance(pattern_text, str) or not pattern_text:
        raise _fail(source, f"{where_}.pattern", pattern_text, "expected a non-empty regular expression string")
    try:
        pattern = re.compile(pattern_text)
    except re.error as exc:
        raise _fail(source, f"{where_}.pattern", pattern_text, f"invalid regular expression: {exc}") from None
    module = item["module"]
    if module not in RULE_MODULES:
        raise _fail(source, f"{where_}.module", module, f"unknown module (known: {', '.join(RULE_MODULES)})")
    role = item.get("role")
    if role is not None and role not in ROLES:
        raise _fail(source, f"{where_}.role", role, f"unknown role (known: {', '.join(ROLES)})")
    position = item.get("where")
    if position is not None and position not in POSITIONS:
        raise _fail(source, f"{where_}.where", position, f"unknown place (known: {', '.join(POSITIONS)})")
    if role is not None and position is not None:
        raise _fail(source, where_, {"role": role, "where": position},
                    "a rule with 'where' cannot have a 'role' (layers are found before 'where' applies)")
    name = item.get("name", f"{Path(source).name}#{i}")
    if not isinstance(name, str):
        raise _fail(source, f"{where_}.name", name, "expected a string")
    note = item.get("note")
    if note is not None and not isinstance(note, str):
        raise _fail(source, f"{where_}.note", note, "expected a string")
    return KernelRule(name, pattern, module, role, position, source)


def shipped_rules() -> tuple[KernelRule, ...]:
    text = resources.files("infersim.trace").joinpath(SHIPPED_RULES).read_text(encoding="utf-8")
    return parse_rules(yaml.safe_load(text), f"infersim/trace/{SHIPPED_RULES}")


def load_rules(user_files: Sequence[str | Path] = ()) -> RuleTable:
    """The shipped table, preceded by the rules of each user file (earlier files first)."""
    rules: list[KernelRule] = []
    sources = []
    for path in user_files:
        rules.extend(parse_rules(load_yaml(Path(path), "rules file"), str(path)))
        sources.append(str(path))
    rules.extend(shipped_rules())
    sources.append(f"infersim/trace/{SHIPPED_RULES}")
    return RuleTable(tuple(rules), tuple(sources))
