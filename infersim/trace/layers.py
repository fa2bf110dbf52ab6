"""Layers inside a step, and each kernel's module at its place in the layer.

Layers come from, in order of preference:
- forward regions (`attn(F)`, `mlp(F)`, ...: DeepSeek's annotations): a layer runs from one
  `attn(F)` region up to the next;
- decoder-layer nn.Module frames (`nn.Module: LlamaDecoderLayer_3`, with_stack=True): one layer per
  frame call;
- the kernel sequence: each run of attention-core kernels (role `attention`) is one layer's
  attention; the first norm after it starts the FFN half; the first norm after FFN work starts the
  next layer. This works on CUDA-graph replays and compiled code, which carry no frames.

A dense GEMM whose module neither its operator's frames nor a rule decide (`gemm`) becomes an
attention projection before the post-attention norm, the router gate when a top-k kernel follows,
a shared expert (layers with routed experts) or dense FFN after it, the LM head after the last layer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from infersim.cards import categories as cat
from infersim.trace.attribution import Kernel, final_module
from infersim.trace.rules import GEMM, OTHER, RuleTable

# modules that only occur in the FFN half of a layer (used when no norm marks the boundary)
FFN_MODULES = frozenset({cat.MOE_EXPERTS, cat.ROUTER, cat.DISPATCH, cat.COMBINE, cat.SHARED_EXPERT, cat.DENSE_FFN})
# kernels that count as real work between two norms (two back-to-back norms do not end a layer)
_CONTENT_MODULES = frozenset({GEMM, cat.MOE_EXPERTS, cat.ROUTER, cat.DISPATCH, cat.COMBINE, cat.ALL_REDUCE,
                              cat.DP_GATHER, cat.SHARED_EXPERT, cat.DENSE_FFN, cat.ATTN_PROJ})
# kernels that end the router look-ahead of a GEMM: the next GEMM-like step has started
_ROUTER_STOP = frozenset({GEMM, cat.MOE_EXPERTS, cat.DISPATCH, cat.COMBINE, cat.SHARED_EXPERT, cat.DENSE_FFN})
ROUTER_LOOKAHEAD = 10  # kernels after a GEMM searched for the top-k that makes it the router gate


def attention_runs(kernels: Sequence[Kernel]) -> list[tuple[int, int]]:
    """(first, last) index of each attention call: attention-role kernels, with the attention
    helpers (split-KV combine, metadata) and other streams' kernels allowed in between."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(kernels)
    while i < n:
        if kernels[i].role != "attention":
            i += 1
            continue
        stream, last, j = kernels[i].stream, i, i + 1
        while j < n and (kernels[j].module1 == cat.ATTN_CORE or kernels[j].stream != stream):
            if kernels[j].role == "attention" and kernels[j].stream == stream:
                last = j
            j += 1
        runs.append((i, last))
        i = last + 1
    return runs


def _has_content(kernels: Sequence[Kernel], lo: int, hi: int) -> bool:
    return any(kernels[j].module1 in _CONTENT_MODULES for j in range(lo, hi))


def pattern_layers(kernels: Sequence[Kernel]) -> list[tuple[int, int, int]]:
    """(start, ffn_start, end) index ranges of the layers in a step without layer annotations."""
    runs = attention_runs(kernels)
    if not runs:
        return []
    n = len(kernels)
    boundaries: list[int] = []  # FFN-half start per layer
    for i, (_, last) in enumerate(runs):
        limit = runs[i + 1][0] if i + 1 < len(runs) else n
        ffn = next((j for j in range(last + 1, limit) if kernels[j].role == "norm"), None)
        if ffn is None:
            ffn = next((j for j in range(last + 1, limit) if kernels[j].module1 in FFN_MODULES), limit)
        boundaries.append(ffn)
    first_start = next((j for j in range(runs[0][0]) if kernels[j].role == "norm"), 0)
    starts = [first_start]
    ends: list[int] = []
    for i in range(len(runs)):
        limit = runs[i + 1][0] if i + 1 < len(runs) else n
        ffn = boundaries[i]
        end = next((j for j in range(ffn + 1, limit)
                    if kernels[j].role == "norm" and _has_content(kernels, ffn + 1, j)), None)
        if end is None and i + 1 < len(runs):
            # no norm marks the next layer: it starts after the last FFN-side kernel
            stop = next((j for j in range(limit - 1, ffn, -1)
                         if kernels[j].module1 in FFN_MODULES | {cat.ALL_REDUCE, cat.DP_GATHER}), None)
            end = stop + 1 if stop is not None else runs[i + 1][0]
        if end is None:
            end = n
        end = max(end, ffn)
        ends.append(end)
        if i + 1 < len(runs):
            starts.append(min(end, runs[i + 1][0]))
    return [(starts[i], min(boundaries[i], ends[i]), ends[i]) for i in range(len(runs))]


def assign_pattern_layers(kernels: list[Kernel]) -> int:
    layers = pattern_layers(kernels)
    if not layers:
        for k in kernels:
            k.place = "outside_layers"
        return 0
    first, last_end = layers[0][0], layers[-1][2]
    for k in kernels[:first]:
        k.place = "before_layers"
    for k in kernels[last_end:]:
        k.place = "after_layers"
    for number, (start, ffn, end) in enumerate(layers):
        for j in range(start, end):
            k = kernels[j]
            k.place, k.layer, k.ffn_phase = "in_layers", number, j >= ffn
    return len(layers)


def assign_marked_layers(kernels: list[Kernel], layer_of: dict[int, int], marker: str,
                         ffn_markers: frozenset[int] = frozenset()) -> int:
    """Layers from markers on the kernels (`region`: forward-region annotations; `layer_frame`:
    decoder-layer frames), `layer_of` mapping each marker to its layer number. `ffn_markers` are
    markers that are the FFN half themselves (an `mlp(F)` region)."""
    in_layers = [i for i, k in enumerate(kernels) if getattr(k, marker) >= 0 and getattr(k, marker) in layer_of]
    if not in_layers:
        return 0
    first, last = in_layers[0], in_layers[-1]
    by_layer: dict[int, list[Kernel]] = defaultdict(list)
    for i, k in enumerate(kernels):
        mark = getattr(k, marker)
        if mark >= 0 and mark in layer_of:
            k.place, k.layer = "in_layers", layer_of[mark]
            by_layer[k.layer].append(k)
        else:
            k.place = "before_layers" if i < first else "after_layers" if i > last else "in_layers"
    for layer_kernels in by_layer.values():
        runs = attention_runs(layer_kernels)
        after = runs[0][1] + 1 if runs else 0
        ffn = next((j for j in range(len(layer_kernels))
                    if getattr(layer_kernels[j], marker) in ffn_markers
                    or (j >= after and runs and layer_kernels[j].role == "norm")), len(layer_kernels))
        for j, k in enumerate(layer_kernels):
            k.ffn_phase = j >= ffn
    return len(by_layer)


def _resolve_gemm(k: Kernel, layer_kernels: Sequence[Kernel], at: int, layer_has_experts: bool) -> str:
    if k.place == "after_layers":
        return cat.LM_HEAD
    if k.place != "in_layers" or k.layer < 0:
        return OTHER
    if not k.ffn_phase:
        return cat.ATTN_PROJ
    for nxt in layer_kernels[at + 1:at + 1 + ROUTER_LOOKAHEAD]:
        if nxt.role == "topk":
            return cat.ROUTER
        if nxt.module1 in _ROUTER_STOP:
            break
    return cat.SHARED_EXPERT if layer_has_experts else cat.DENSE_FFN


def assign_modules(kernels: list[Kernel], rules: RuleTable) -> None:
    by_layer: dict[int, list[Kernel]] = defaultdict(list)
    for k in kernels:
        if k.layer >= 0:
            by_layer[k.layer].append(k)
    experts = {layer for layer, ks in by_layer.items() if any(k.module1 == cat.MOE_EXPERTS for k in ks)}
    position_in_layer = {id(k): i for ks in by_layer.values() for i, k in enumerate(ks)}
    for k in kernels:
        module, source, reason = final_module(k, rules)
        if module == GEMM:
            module = _resolve_gemm(k, by_layer.get(k.layer, ()), position_in_layer.get(id(k), 0), k.layer in experts)
        k.module, k.source, k.reason = module, source, reason
