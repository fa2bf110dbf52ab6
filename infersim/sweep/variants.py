"""The base configuration, loaded and validated once, and the variants derived from it.

Loading cards from YAML costs milliseconds; a sweep point must cost far less. So the run config is
loaded once (`load_base`) and each variant is derived from the validated objects with
`dataclasses.replace`, re-running the same cross-field validators the loader runs
(`validate_model`, `validate_hardware`, `complete_layout`), so an invalid variant is reported with
the loader's own message instead of being simulated. Derived cards and layouts are cached, so
a grid whose model fields vary slowly re-validates each model once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence
from operator import itemgetter

from infersim.base.records import evolve
from infersim.cards.hardware import HardwareCard, validate_hardware
from infersim.cards.model import ModelCard, validate_model
from infersim.run.config import (
    RunConfig,
    load_hardware_card,
    load_model_card,
    load_run_config,
    parse_override,
    read_run_mapping,
)
from infersim.cards.deployment import (
    AttentionLayout,
    Deployment,
    FfnLayout,
    Workload,
    complete_layout,
    with_checkpoint_precision,
    with_engine_defaults,
    without_checkpoint_precision,
)
from infersim.run.flags import RunFlags, flag_fields
from infersim.base.errors import ConfigError, InferSimError
from infersim.sweep.grid import GridAxis

_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class Base:
    """A validated run config plus what is needed to derive variants of it anywhere (picklable)."""

    config: RunConfig
    deployment: Deployment  # the config's deployment with derived DP sizes reset to 0 (= derive again)
    source: str
    base_dir: str | None = None
    card_overrides: dict[str, tuple[tuple[tuple[str, ...], Any, str], ...]] = field(default_factory=dict)


def load_base(path: str | Path | None, overrides: Sequence[str] = (), mfu_tables: str | None = None,
              flags: RunFlags | None = None) -> Base:
    """Load, override and validate a run config once (raises InferSimError subclasses only);
    `path` None: the run the direct `flags` name (infersim.run.flags)."""
    config = load_run_config(path, list(overrides), mfu_tables, flags)
    raw, source, base_dir = read_run_mapping(path, flags)
    if flags is not None:
        raw = {**raw, **{k: v for k, v in flag_fields(flags).items() if "." not in k}}  # the cards a flag names
    card_overrides: dict[str, list[tuple[tuple[str, ...], Any, str]]] = {"model": [], "hardware": []}
    for text in overrides:
        dotted, value = parse_override(text)
        if dotted[0] in card_overrides and len(dotted) > 1 and not isinstance(raw.get(dotted[0]), dict):
            card_overrides[dotted[0]].append((tuple(dotted[1:]), value, text))
    return from_config(config, source, str(base_dir) if base_dir is not None else None,
                       {k: tuple(v) for k, v in card_overrides.items()})


def from_config(config: RunConfig, source: str = "", base_dir: str | None = None,
                card_overrides: dict[str, tuple] | None = None) -> Base:
    """A Base from an already validated RunConfig (the Python API's entry point)."""
    dep = without_checkpoint_precision(config.deployment, config.named_deployment)  # derived again per variant
    dep = evolve(dep, attention=evolve(dep.attention, dp=0),
                 ffn=evolve(dep.ffn, dp=0))
    return Base(config, dep, source or config.source, base_dir, dict(card_overrides or {}))


def set_path(obj: Any, parts: Sequence[str], value: Any) -> Any:
    """A copy of a frozen dataclass (or dict) tree with the dotted leaf replaced."""
    head, rest = parts[0], parts[1:]
    if isinstance(obj, dict):
        new = dict(obj)
        new[head] = set_path(obj[head], rest, value) if rest else value
        return new
    current = getattr(obj, head)
    return evolve(obj, **{head: set_path(current, rest, value) if rest else value})


def _picker(positions: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """What takes the values at `positions` out of a point's values, as a tuple (at C speed)."""
    if len(positions) == 1:
        single = itemgetter(*positions)
        return lambda values: (single(values),)
    return itemgetter(*positions) if positions else (lambda values: ())


class Deriver:
    """Derives validated RunConfigs for grid points (and searched layouts) from a Base."""

    def __init__(self, base: Base, axes: Sequence[GridAxis]) -> None:
        self.base = base
        self.axes = tuple(axes)
        self._card_axis: dict[str, int | None] = {"model": None, "hardware": None}
        self._fields: dict[str, list[tuple[int, tuple[str, ...]]]] = {
            "model": [], "hardware": [], "deployment": [], "workload": [], "speculative": []}
        for i, axis in enumerate(self.axes):
            parts = axis.parts
            if len(parts) == 1:
                self._card_axis[parts[0]] = i
            else:
                self._fields[parts[0]].append((i, parts[1:]))
        # each kind's swept values of a point, as a tuple
        self._pick = {kind: _picker([i for i, _ in fields]) for kind, fields in self._fields.items()}
        self._cards: dict[tuple[str, Any], Any] = {}
        self._models: dict[tuple, Any] = {}
        self._hardware: dict[tuple, Any] = {}
        self._layouts: dict[tuple, Any] = {}
        self._last_layout: tuple[Any, ...] = (None, None, None, None)  # (deployment, model, hardware, answer)
        self._runs: dict[tuple, Any] = {}
        self._deployments: dict[tuple, Any] = {}
        self._workloads: dict[tuple, Any] = {}
        # engine-derived deployment fields named by the run or by an axis: kept as given
        self._named = base.config.named_deployment | {parts[0] for _, parts in self._fields["deployment"]} | {
            ".".join(parts[:2]) for _, parts in self._fields["deployment"] if parts[0] == "precision"}

    # -- cards -----------------------------------------------------------------------------

    def _card(self, kind: str, values: tuple[Any, ...]) -> ModelCard | HardwareCard:
        i = self._card_axis[kind]
        if i is None:
            return getattr(self.base.config, kind)
        ref = values[i]
        key = (kind, ref)
        if key not in self._cards:
            base_dir = Path(self.base.base_dir) if self.base.base_dir else None
            overrides = [(list(p), v, t) for p, v, t in self.base.card_overrides.get(kind, ())]
            loader = load_model_card if kind == "model" else load_hardware_card
            try:
                self._cards[key] = loader(ref, base_dir, overrides)[0]
            except InferSimError as exc:
                self._cards[key] = exc
        card = self._cards[key]
        if isinstance(card, InferSimError):
            raise card
        return card

    def _derived(self, kind: str, values: tuple[Any, ...], cache: dict[tuple, Any]) -> Any:
        fields = self._fields[kind]
        if not fields and self._card_axis[kind] is None:
            return getattr(self.base.config, kind)  # the base's own card, validated on load: nothing to derive
        key = self._pick[kind](values)
        if self._card_axis[kind] is not None:
            key += (values[self._card_axis[kind]],)
        hit = cache.get(key)
        if hit is None:
            try:
                card = self._card(kind, values)
                for i, parts in fields:
                    card = set_path(card, parts, values[i])
                if fields:
                    validator = validate_model if kind == "model" else validate_hardware
                    card = validator(card, "")
                hit = card
            except InferSimError as exc:
                hit = exc
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[key] = hit
        if isinstance(hit, InferSimError):
            raise hit
        return hit

    def model(self, values: tuple[Any, ...]) -> ModelCard:
        return self._derived("model", values, self._models)

    def hardware(self, values: tuple[Any, ...]) -> HardwareCard:
        return self._derived("hardware", values, self._hardware)

    # -- deployment and workload ------------------------------------------------------------

    def deployment(self, values: tuple[Any, ...]) -> Deployment:
        """The variant's deployment before layout completion (DP sizes 0 = derive)."""
        return self._section("deployment", self.base.deployment, values, self._deployments)

    def workload(self, values: tuple[Any, ...]) -> Workload:
        return self._section("workload", self.base.config.workload, values, self._workloads)

    def _section(self, kind: str, base: Any, values: tuple[Any, ...], cache: dict[tuple, Any]) -> Any:
        """`base` with the point's fields of `kind` set, cached on those fields' values: most axes
        leave a section alone, and copying frozen dataclasses per point is a large part of a sweep."""
        fields = self._fields[kind]
        if not fields:
            return base
        # typed: an axis may hold both 2 and 2.0 (or 1 and true), which are equal as keys
        picked = self._pick[kind](values)
        key = (picked, tuple(map(type, picked)))
        try:
            hit = cache.get(key)
        except TypeError:  # an unhashable value (a YAML list): nothing to cache on
            key, hit = None, None
        if hit is None:
            if all(len(parts) == 1 for _, parts in fields):
                # fields of the section itself (workload.isl, workload.decode_batch_per_gpu): one copy
                # sets them all (replace() copies every field of the section, a large part of a
                # sweep's first pass over the values)
                hit = evolve(base, **{parts[0]: values[i] for i, parts in fields})
            else:
                hit = base
                for i, parts in fields:
                    hit = set_path(hit, parts, values[i])
            if key is not None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[key] = hit
        return hit

    def complete(self, dep: Deployment, model: ModelCard, hw: HardwareCard) -> Deployment:
        """The engine-derived fields the run did not name, set afresh for this variant's model and
        layout (with_engine_defaults), then complete_layout; cached on the (model, hardware,
        deployment) triple, and the last answer kept with the objects it was for (the next grid point
        mostly differs in its workload only: the same triple, not hashed again)."""
        last_dep, last_model, last_hw, hit = self._last_layout
        if not (last_dep is dep and last_model is model and last_hw is hw):
            hit = self._layout(dep, model, hw)
            self._last_layout = (dep, model, hw, hit)
        if isinstance(hit, InferSimError):
            raise hit
        return hit

    def _layout(self, dep: Deployment, model: ModelCard, hw: HardwareCard) -> Deployment | InferSimError:
        """complete's answer, or the error it raises, cached on the (model, hardware, deployment) triple."""
        key = (id(model), id(hw), dep)
        entry = self._layouts.get(key)
        if entry is None:
            try:
                derived = with_engine_defaults(dep, self._named, model, self.base.config.engine)
                derived = with_checkpoint_precision(derived, self._named, model, hw)
                hit = complete_layout(derived, model, hw, "")
            except InferSimError as exc:
                hit = exc
            if len(self._layouts) >= _CACHE_LIMIT:
                self._layouts.clear()
            # the entry holds the cards, so their ids cannot be reused while it exists
            entry = self._layouts[key] = (model, hw, hit)
        return entry[2]

    def run_base(self, values: tuple[Any, ...]) -> RunConfig:
        """The base config with the point's speculative fields; a swept draft model is loaded here
        (once per card), so that `with_variant` only checks and places it."""
        fields = self._fields["speculative"]
        if not fields:
            return self.base.config
        key = tuple(values[i] for i, _ in fields)
        hit = self._runs.get(key)
        if hit is None:
            base = self.base.config
            spec = base.speculative
            for i, parts in fields:
                spec = set_path(spec, parts, values[i])
            try:
                draft, source = base.draft_model, base.draft_model_source
                if spec.draft_model != base.speculative.draft_model:
                    draft, source = (None, "") if spec.draft_model is None else load_model_card(
                        spec.draft_model, Path(self.base.base_dir) if self.base.base_dir else None)
                hit = evolve(base, speculative=spec, draft_model=draft, draft_model_source=source)
            except InferSimError as exc:
                hit = exc
            if len(self._runs) >= _CACHE_LIMIT:
                self._runs.clear()
            self._runs[key] = hit
        if isinstance(hit, InferSimError):
            raise hit
        return hit

    def config(self, values: tuple[Any, ...]) -> RunConfig:
        """The validated RunConfig of one grid point (raises InferSimError when the variant is invalid)."""
        model, hw, dep, run, work = self.parts(values)
        return evolve(run, model=model, hardware=hw, deployment=dep, workload=work)

    def parts(self, values: tuple[Any, ...]) -> tuple[ModelCard, HardwareCard, Deployment, RunConfig, Workload]:
        """config(values)'s model, hardware, completed deployment, run_base and workload, validated
        in the same order, without assembling the RunConfig (the sweep's fast path needs the parts)."""
        model = self.model(values)
        hw = self.hardware(values)
        dep = self.complete(self.deployment(values), model, hw)
        return model, hw, dep, self.run_base(values), self.workload(values)


def with_layout(dep: Deployment, num_gpus: int, num_nodes: int, pp: int, attn_tp: int, ffn_tp: int,
                ffn_ep: int) -> Deployment:
    """A deployment with a searched parallel layout, its DP sizes those the layout implies (what
    complete_layout would derive: the search proposes only TP and EP sizes that divide a stage).

    Expert TP (ffn_tp > 1) only works with tokens gathered onto every shard, so such layouts use
    moe_comm all-gather whatever the base config says (dense models ignore moe_comm)."""
    per_stage = num_gpus // pp
    comm = "all-gather" if ffn_tp > 1 else dep.moe_comm
    return evolve(dep, num_gpus=num_gpus, num_nodes=num_nodes, pp=pp, moe_comm=comm,
                  attention=AttentionLayout(tp=attn_tp, dp=per_stage // attn_tp),
                  ffn=FfnLayout(tp=ffn_tp, ep=ffn_ep, dp=per_stage // (ffn_tp * ffn_ep)))


def problem_text(exc: InferSimError) -> str:
    """The reason a variant was rejected, without the value (so equal reasons group together)."""
    if isinstance(exc, ConfigError):
        return f"{exc.field}: {exc.problem}" if exc.field else exc.problem
    return str(exc)
