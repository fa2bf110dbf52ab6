"""Engine-card facts that depend on the GPU an engine runs on: which GPUs it runs on at all, the
attention backend it picks, the compiler fusions it applies, and how large its CUDA graphs are.

Engines choose these by vendor and compute capability (vLLM's `current_platform`, SGLang's
`get_platform()`), not by memory size, so the conditions here name the vendor and a range of
compute capabilities (`GpuMatch`); a card lists its choices in order and the first that matches
the hardware card applies, as the engines' own priority lists do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infersim.cards.hardware import HardwareCard
from infersim.cards.schema import spec
from infersim.base.errors import ConfigError

Vendor = Literal["nvidia", "amd"]


@dataclass(frozen=True, kw_only=True)
class GpuMatch:
    """Which GPUs a choice applies to: a vendor and a half-open range of compute capabilities
    (NVIDIA: 8.0 A100, 8.9 L40S, 9.0 Hopper, 10.0 B200/GB200, 10.3 B300/GB300, 12.0 RTX PRO 6000).
    A condition left out matches every GPU; a capability range never matches a card without one."""

    vendor: Vendor | None = spec(None, doc="GPU vendor the choice applies to (null: any)")
    min_compute_capability: float | None = spec(
        None, doc="lowest compute capability it applies to, inclusive (null: no lower bound)", gt=0)
    below_compute_capability: float | None = spec(
        None, doc="compute capability it stops at, exclusive (null: no upper bound)", gt=0)

    def matches(self, hw: HardwareCard) -> bool:
        if self.vendor is not None and hw.vendor != self.vendor:
            return False
        if self.min_compute_capability is None and self.below_compute_capability is None:
            return True
        cc = hw.compute_capability
        if cc is None:
            return False
        if self.min_compute_capability is not None and cc < self.min_compute_capability - 1e-9:
            return False
        return self.below_compute_capability is None or cc < self.below_compute_capability - 1e-9


@dataclass(frozen=True, kw_only=True)
class AttentionBackendChoice(GpuMatch):
    """One entry of the engine's attention-backend priority: the backend it runs on matching GPUs."""

    backend: str = spec(doc="the attention backend, as the engine names it (FLASH_ATTN (FA3), FLASHINFER, fa3, "
                            "trtllm_mha, TRITON_ATTN, ...)")
    mla: bool | None = spec(None, doc="applies to MLA models only (true), to other models only (false), or to both "
                                      "(null)")
    page_size: int | None = spec(
        None, doc="KV block (page) size this backend forces, tokens (null: the scheduler's page_size)", gt=0)
    why: str = spec("", doc="what the engine's source says about this choice")

    def applies(self, hw: HardwareCard, mla: bool) -> bool:
        return (self.mla is None or self.mla == mla) and self.matches(hw)


@dataclass(frozen=True, kw_only=True)
class AllReduceLimit:
    """The largest all-reduce (bytes per rank) a fusion handles at one TP size."""

    ranks: int = spec(doc="GPUs of the all-reduce", gt=0)
    max_bytes: float = spec(doc="largest all-reduced tensor the fused kernel takes, bytes", gt=0)


@dataclass(frozen=True, kw_only=True)
class FusionPass(GpuMatch):
    """A compiler pass that folds named plan operations into a neighbouring kernel on matching GPUs.
    The folded operations cost no kernel time of their own (their bytes ride on the kernel they join).

    With `all_reduce_limits` the pass fuses the operations into the TP all-reduce before them (vLLM's
    FlashInfer all-reduce + residual add + RMSNorm): it applies in a layer group only where every
    all-reduce of the group runs over a TP size it lists and moves at most that size's max_bytes."""

    name: str = spec(doc="the pass, as the engine names it")
    operations: tuple[str, ...] = spec(doc="plan operations it folds away (names as in infersim/cards/categories.py)")
    all_reduce_limits: tuple[AllReduceLimit, ...] = spec(
        default_factory=tuple, doc="for a pass that folds into the all-reduce: the TP sizes it supports and the "
                                   "largest all-reduce at each (empty: not tied to an all-reduce)")

    def max_all_reduce_bytes(self, ranks: int) -> float:
        """The largest all-reduce the pass fuses at this TP size (0: that size is not supported)."""
        return next((limit.max_bytes for limit in self.all_reduce_limits if limit.ranks == ranks), 0.0)


@dataclass(frozen=True, kw_only=True)
class CaptureCeiling(GpuMatch):
    """The largest CUDA graph an engine captures by default on matching GPUs."""

    value: int = spec(doc="largest captured batch, tokens", gt=0)


@dataclass(frozen=True, kw_only=True)
class GraphCaptureRule:
    """CUDA-graph capture sizes that follow the running-request cap (vLLM `_set_cudagraph_sizes`):
    largest captured batch = min(requests_factor x max running requests, the ceiling of the GPU,
    the per-step token budget when capped_by_token_budget)."""

    requests_factor: int = spec(doc="the largest graph is this many times the running-request cap (max_num_seqs)",
                                gt=0)
    ceiling: int = spec(doc="the default ceiling, tokens", gt=0)
    ceilings: tuple[CaptureCeiling, ...] = spec(
        default_factory=tuple, doc="ceilings of particular GPUs; the first that matches replaces `ceiling`")
    capped_by_token_budget: bool = spec(True, doc="never above the per-step token budget (max_num_batched_tokens)")
    captures_max_requests: bool = spec(
        False, doc="the running-request cap itself is a captured size, so a full batch runs unpadded")

    def ceiling_for(self, hw: HardwareCard | None) -> int:
        if hw is not None:
            for ceiling in self.ceilings:
                if ceiling.matches(hw):
                    return ceiling.value
        return self.ceiling

    def largest(self, max_requests: int, token_budget: int, hw: HardwareCard | None) -> int:
        """The largest captured decode batch under a running-request cap and token budget (0: none)."""
        size = self.ceiling_for(hw)
        if max_requests > 0:
            size = min(size, self.requests_factor * max_requests)
        if self.capped_by_token_budget and token_budget > 0:
            size = min(size, token_budget)
        return size


def check_operation_names(names: Sequence[str], field: str, source: str) -> None:
    """Every name is an operation a step plan can hold; else one ConfigError naming the closest."""
    from infersim.cards.categories import OPERATION_NAMES, is_operation_name

    for i, name in enumerate(names):
        if not is_operation_name(name):
            import difflib

            close = difflib.get_close_matches(name, sorted(OPERATION_NAMES), n=3)
            raise ConfigError(source, f"{field}[{i}]", name,
                              "no step plan holds an operation of this name"
                              + (f" (did you mean {', '.join(close)}?)" if close else
                                 " (operation names: see infersim/cards/categories.py OPERATION_NAMES)"))


def _check_range(match: GpuMatch, field: str, source: str) -> None:
    low, high = match.min_compute_capability, match.below_compute_capability
    if low is not None and high is not None and high <= low:
        raise ConfigError(source, field, {"min_compute_capability": low, "below_compute_capability": high},
                          "the range is empty: below_compute_capability must be above min_compute_capability")


def validate_platform_fields(card: Any, source: str) -> None:
    """The GPU-dependent fields of an engine card (EngineCard: vendors, attention_backends,
    fusion_passes, overheads.cuda_graph_capture, overheads.graph_break_operations) make sense."""
    if not card.vendors:
        raise ConfigError(source, "vendors", [], "list the GPU vendors the engine runs on (nvidia, amd)")
    if len(set(card.vendors)) != len(card.vendors):
        raise ConfigError(source, "vendors", list(card.vendors), "a vendor is listed twice")
    for i, choice in enumerate(card.attention_backends):
        _check_range(choice, f"attention_backends[{i}]", source)
        if choice.vendor is not None and choice.vendor not in card.vendors:
            raise ConfigError(source, f"attention_backends[{i}].vendor", choice.vendor,
                              f"the card runs on {', '.join(card.vendors)} only (vendors)")
    for i, fusion in enumerate(card.fusion_passes):
        _check_range(fusion, f"fusion_passes[{i}]", source)
        if not fusion.operations:
            raise ConfigError(source, f"fusion_passes[{i}].operations", [], "name the operations the pass folds away")
        check_operation_names(fusion.operations, f"fusion_passes[{i}].operations", source)
        ranks = [limit.ranks for limit in fusion.all_reduce_limits]
        if len(set(ranks)) != len(ranks):
            raise ConfigError(source, f"fusion_passes[{i}].all_reduce_limits", ranks, "a TP size is listed twice")
    check_operation_names(card.overheads.graph_break_operations, "overheads.graph_break_operations", source)
    rule = card.overheads.cuda_graph_capture
    if rule is not None:
        if card.overheads.cuda_graph_max_batch:
            raise ConfigError(source, "overheads.cuda_graph_max_batch", "tiers",
                              "give either cuda_graph_max_batch or cuda_graph_capture, not both (the capture rule "
                              "derives the largest graph from the running-request cap)")
        for i, ceiling in enumerate(rule.ceilings):
            _check_range(ceiling, f"overheads.cuda_graph_capture.ceilings[{i}]", source)
