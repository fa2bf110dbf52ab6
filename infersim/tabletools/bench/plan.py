"""Which kernels `mfu bench` times, in which order (pure: model cards in, cases out).

Shapes come from three places:
  - the model cards (default: the models of the GPU validation set, BENCH_MODELS): every projection
    as HuggingFace transformers runs it (q, k, v, gate and up as separate nn.Linear layers) and as the
    serving engines fuse it (QKV, gate+up), the routed-expert configurations, the attention layouts;
  - a K x N grid of the values aiconfigurator's tables use (GEMM_GRID), so that `mfu compare` finds
    the same shapes in the imported tables and the lookup can interpolate between measured planes;
  - the elementwise kernels eager PyTorch launches (infersim.shapes.kernels.ELEMENTWISE_OPS), over sizes
    from a few elements to a few hundred million.
The plan is ordered in passes so that a run cut short by its time budget still covers every family:
pass 0 is a coarse sweep of each family, pass 1 the grids the validation set needs, pass 2 the
comparison grid and fp8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Sequence

from infersim.cards.model import ModelCard
from infersim.base.errors import InferSimError
from infersim.tabletools.bench.cases import (
    BUDGET_GROUPS,
    AttentionCase,
    BenchCase,
    ElementwiseCase,
    GemmCase,
    GroupedGemmCase,
    HostCase,
    budget_group,
    estimated_seconds,
    input_bytes,
)

FAMILIES = ("host", "elementwise", "gemm", "grouped_gemm", "attn_prefill", "attn_decode")
#: the model cards whose shapes are timed by default: the GPU validation set's (benchmarks/gpu/configs).
#: Llama-3.1-8B, Qwen3-8B and Qwen3-30B-A3B are left out on purpose: a held-out set measured those.
BENCH_MODELS = ("llama-3.1-70b", "llama-2-7b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
#: K and N values of the comparison grid: a subset of aiconfigurator's GEMM grid (32 ... 65536)
GEMM_GRID = (512, 1024, 2048, 4096, 8192, 16384, 32768)
COARSE_M = (1, 16, 128, 1024, 8192)

#: (op, input dtype) of every eager kernel timed: the dtypes HF's model code runs them in
ELEMENTWISE_KERNELS: tuple[tuple[str, str], ...] = (
    ("to_fp32", "bf16"), ("to_bf16", "fp32"), ("pow", "fp32"), ("mean", "fp32"), ("add_scalar", "fp32"),
    ("rsqrt", "fp32"), ("mul_broadcast", "fp32"), ("mul_broadcast", "bf16"), ("mul", "bf16"), ("add", "bf16"),
    ("neg", "bf16"), ("cat", "bf16"), ("silu", "bf16"), ("sigmoid", "bf16"), ("copy", "bf16"), ("softmax", "fp32"),
    ("topk", "fp32"), ("sort", "int64"), ("gather", "bf16"), ("scatter", "bf16"), ("masked_fill", "bf16"),
    ("sum", "bf16"), ("cumsum", "int32"), ("histc", "int32"), ("fill", "bf16"), ("mul", "fp32"), ("add", "fp32"),
    # the MoE block's routing bookkeeping (infersim/modules/eager.py moe_routing_eager)
    ("sum", "fp32"), ("gather", "fp32"), ("add_scalar", "int64"), ("copy", "int64"), ("fill", "int64"),
    ("scatter", "int64"), ("sigmoid", "fp32"), ("masked_fill", "fp32"), ("scatter", "fp32"), ("fill", "fp32"),
)


@dataclass(frozen=True)
class BenchOptions:
    kernels: tuple[str, ...] = FAMILIES
    dtypes: tuple[str, ...] = ("bf16", "fp8")
    tp_sizes: tuple[int, ...] = (1,)
    m_values: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    gemm_grid: tuple[int, ...] = GEMM_GRID
    grid_m_values: tuple[int, ...] = (1, 16, 64, 256, 1024, 4096, 16384)
    ep_sizes: tuple[int, ...] = (1,)
    grouped_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    prefill_seq_lens: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_kv_lens: tuple[int, ...] = (128, 256, 1024, 2048, 4096, 8192, 16384)
    elementwise_elements: tuple[int, ...] = tuple(4 ** k for k in range(4, 15))  # 256 ... 268,435,456
    elementwise_kernels: tuple[tuple[str, str], ...] = ELEMENTWISE_KERNELS
    host_probes: tuple[str, ...] = ("launch", "launch_linear", "view", "module_call", "sync", "hf_decode_step")
    #: routed-expert configurations timed beside the cards' own: (experts, top-k, hidden, intermediate, gated)
    extra_moe: tuple[tuple[int, int, int, int, bool], ...] = ()
    max_input_bytes: float = 24e9  # cases needing more device memory for their inputs are not planned

    def quick(self) -> BenchOptions:
        """A reduced grid (a few minutes): every other point of each axis, no comparison grid."""
        return replace(self, m_values=(1, 16, 128, 1024, 8192), gemm_grid=(1024, 4096, 16384),
                       grid_m_values=(16, 1024), grouped_tokens=(1, 16, 128, 1024, 8192),
                       prefill_seq_lens=(512, 2048, 8192), decode_batches=(1, 16, 128), decode_kv_lens=(1024, 8192),
                       elementwise_elements=tuple(4 ** k for k in range(4, 15, 2)))

    def smoke(self) -> BenchOptions:
        """Tiny shapes that a CPU runs in seconds (`--device cpu`): to prove the harness, not to measure."""
        return replace(self, dtypes=("bf16",), m_values=(1, 16), gemm_grid=(256, 512), grid_m_values=(16,),
                       grouped_tokens=(1, 16), prefill_seq_lens=(64, 128), decode_batches=(1, 4),
                       decode_kv_lens=(64, 256), elementwise_elements=(256, 65536), max_input_bytes=2e8,
                       extra_moe=((8, 2, 256, 512, True),))


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int | None:
    if tp <= kv_heads:
        return kv_heads // tp if kv_heads % tp == 0 else None
    return 1 if tp % kv_heads == 0 else None


def _split(total: int, parts: int) -> int | None:
    return total // parts if total % parts == 0 else None


def gemm_kn_from_card(card: ModelCard, tp: int) -> list[tuple[int, int]]:
    """(K, N) of every GEMM one GPU runs for `card` at TP `tp`, both as HF transformers runs them (one
    nn.Linear per projection: q, k, v, gate, up) and as the serving engines fuse them (QKV, gate+up)."""
    h = card.hidden_size
    out: list[tuple[int, int]] = []
    heads = _split(card.num_attention_heads, tp)
    if heads is not None:
        if card.is_mla:
            latent = card.kv_lora_rank + card.qk_rope_head_dim
            qk, v = card.qk_head_dim, card.v_head_dim
            if card.q_lora_rank:
                out += [(h, card.q_lora_rank), (h, card.q_lora_rank + latent), (card.q_lora_rank, heads * qk)]
            else:
                out += [(h, heads * qk)]
            out += [(h, latent), (card.kv_lora_rank, heads * (card.qk_nope_head_dim + v)), (heads * v, h)]
        else:
            kv = _kv_heads_per_rank(card.num_key_value_heads, tp)
            if kv is not None:
                d = card.head_dim
                out += [(h, heads * d), (h, kv * d), (h, (heads + 2 * kv) * d), (heads * d, h)]
    widths = []
    if card.num_dense_layers and card.intermediate_size:
        widths.append(card.intermediate_size)
    if card.is_moe and card.num_shared_experts:
        widths.append(card.shared_width)
    for full in widths:
        width = _split(full, tp)
        if width:
            out += [(h, width), (h, 2 * width), (width, h)] if card.gated_ffn else [(h, width), (width, h)]
    if card.is_moe:
        out.append((h, card.num_experts))  # router gate
    vocab = _split(card.vocab_size, tp)
    if vocab:
        out.append((h, vocab))  # LM head
    return out


def plan_gemm(cards: Sequence[ModelCard], options: BenchOptions) -> list[tuple[int, GemmCase]]:
    """(pass, case): the cards' shapes in bf16 (coarse m first), then the K x N grid in every dtype."""
    shapes = sorted({kn for card in cards for tp in options.tp_sizes for kn in gemm_kn_from_card(card, tp)})
    planned: list[tuple[int, GemmCase]] = []
    seen: set[GemmCase] = set()

    def add(pass_index: int, case: GemmCase) -> None:
        if case not in seen and input_bytes(case) <= options.max_input_bytes:
            seen.add(case)
            planned.append((pass_index, case))

    if "bf16" in options.dtypes:
        for k, n in shapes:
            for m in options.m_values:
                add(0 if m in COARSE_M else 1, GemmCase("bf16", m, k, n))
    for dtype in options.dtypes:
        for k in options.gemm_grid:
            for n in options.gemm_grid:
                for m in options.grid_m_values:
                    add(2, GemmCase(dtype, m, k, n))
    return planned


def plan_grouped_gemm(cards: Sequence[ModelCard], options: BenchOptions) -> list[tuple[int, GroupedGemmCase]]:
    configs = sorted({(c.num_experts, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size, c.gated_ffn)
                      for c in cards if c.is_moe} | set(options.extra_moe))
    planned = []
    for experts, topk, hidden, inter, gated in configs:
        for ep in options.ep_sizes:
            if experts % ep:
                continue
            for tokens in options.grouped_tokens:
                for projection in ("up", "down"):
                    case = GroupedGemmCase("bf16", projection, experts, ep, topk, hidden, inter, gated, tokens)  # type: ignore[arg-type]
                    if input_bytes(case) <= options.max_input_bytes:
                        planned.append((0 if tokens in (1, 16, 128, 1024, 8192) else 1, case))
    return planned


def attention_layouts(cards: Sequence[ModelCard], tp_sizes: Sequence[int],
                      with_repeated_kv: bool = False) -> list[tuple[int, int, int, int]]:
    """(heads, kv heads, qk dim, v dim) per GPU for every card and TP, as HF transformers runs
    attention: MHA/GQA as the card says; MLA as MHA over decompressed keys and values (HF's
    DeepseekV3Attention expands the cached latents with kv_b_proj and calls SDPA, in prefill and
    decode alike: no absorbed-latent kernel). with_repeated_kv adds, for GQA, the layout with K and V
    repeated to every query head (the compiled static-cache decode)."""
    layouts = set()
    for card in cards:
        for tp in tp_sizes:
            heads = _split(card.num_attention_heads, tp)
            if heads is None:
                continue
            if card.is_mla:
                layouts.add((heads, heads, card.qk_head_dim, card.v_head_dim))
                continue
            kv = _kv_heads_per_rank(card.num_key_value_heads, tp)
            if kv is not None:
                layouts.add((heads, kv, card.head_dim, card.head_dim))
                if with_repeated_kv and kv != heads:
                    # HF under torch.compile with a static cache: repeat_kv gives every query head its own K/V
                    layouts.add((heads, heads, card.head_dim, card.head_dim))
    return sorted(layouts)


def plan_attention(cards: Sequence[ModelCard], options: BenchOptions, stage: str) -> list[tuple[int, AttentionCase]]:
    planned = []
    for heads, kv_heads, qk, v in attention_layouts(cards, options.tp_sizes, with_repeated_kv=stage == "decode"):
        if stage == "prefill":
            for s in options.prefill_seq_lens:
                case = AttentionCase("mha", "prefill", "bf16", "bf16", heads, kv_heads, qk, v, 1, s, s)
                if input_bytes(case) <= options.max_input_bytes:
                    planned.append((0 if s in (512, 2048, 8192) else 1, case))
            continue
        for batch in options.decode_batches:
            for kv_len in options.decode_kv_lens:
                case = AttentionCase("mha", "decode", "bf16", "bf16", heads, kv_heads, qk, v, batch, 1, kv_len)
                if input_bytes(case) <= options.max_input_bytes:
                    planned.append((0 if batch in (1, 16, 128) and kv_len in (1024, 8192) else 1, case))
    return planned


def plan_elementwise(options: BenchOptions) -> list[tuple[int, ElementwiseCase]]:
    coarse = set(options.elementwise_elements[::3]) | {options.elementwise_elements[-1]}
    planned = []
    for op, dtype in options.elementwise_kernels:
        for elements in options.elementwise_elements:
            case = ElementwiseCase(op, dtype, elements)
            if input_bytes(case) <= options.max_input_bytes:
                planned.append((0 if elements in coarse else 1, case))
    return planned


#: the order of families inside a pass: cheap and widely used first
_FAMILY_ORDER = {"host": 0, "elementwise": 1, "gemm": 2, "attn_decode": 3, "attn_prefill": 4, "grouped_gemm": 5}


def _family_key(case: BenchCase) -> str:
    if isinstance(case, AttentionCase):
        return f"attn_{case.stage}"
    return case.family


def plan_cases(cards: Sequence[ModelCard], options: BenchOptions,
               group_order: Sequence[str] = ()) -> list[BenchCase]:
    """Every case to time, in pass order (see the module docstring); with `group_order` (names of
    cases.BUDGET_GROUPS) only those groups' cases, one group after the other in that order, each in
    pass order (a budgeted run: `run_bench(group_budgets=...)`)."""
    unknown = [k for k in options.kernels if k not in FAMILIES]
    if unknown:
        raise InferSimError(f"unknown kernel family '{unknown[0]}' (known: {', '.join(FAMILIES)})")
    planned: list[tuple[int, BenchCase]] = []
    if "host" in options.kernels:
        planned += [(0, HostCase(p)) for p in options.host_probes]
    if "elementwise" in options.kernels:
        planned += plan_elementwise(options)
    if "gemm" in options.kernels:
        planned += plan_gemm(cards, options)
    if "grouped_gemm" in options.kernels:
        planned += plan_grouped_gemm(cards, options)
    if "attn_prefill" in options.kernels:
        planned += plan_attention(cards, options, "prefill")
    if "attn_decode" in options.kernels:
        planned += plan_attention(cards, options, "decode")
    if group_order:
        return _in_group_order(planned, group_order)
    # within a pass the families take turns (round robin), so any prefix of the plan covers each of them
    rank: dict[tuple[int, str], int] = {}
    keyed = []
    for i, (pass_index, case) in enumerate(planned):
        family = _family_key(case)
        turn = rank[(pass_index, family)] = rank.get((pass_index, family), -1) + 1
        keyed.append(((pass_index, turn, _FAMILY_ORDER[family], i), case))
    return [case for _key, case in sorted(keyed, key=lambda kc: kc[0])]


def _in_group_order(planned: Sequence[tuple[int, BenchCase]], group_order: Sequence[str]) -> list[BenchCase]:
    unknown = [g for g in group_order if g not in BUDGET_GROUPS]
    if unknown:
        raise InferSimError(f"unknown kernel family '{unknown[0]}' in a budget (known: {', '.join(BUDGET_GROUPS)})")
    position = {group: i for i, group in enumerate(group_order)}
    keyed = [((position[budget_group(case)], pass_index, i), case) for i, (pass_index, case) in enumerate(planned)
             if budget_group(case) in position]
    return [case for _key, case in sorted(keyed, key=lambda kc: kc[0])]


def load_cards(directory: Path, names: Sequence[str] = ()) -> list[ModelCard]:
    """Model cards from a directory of YAML cards (those named, or all of them)."""
    from infersim.run.config import load_model_card

    directory = Path(directory)
    paths = sorted(directory.glob("*.yaml"))
    if names:
        wanted = set(names)
        paths = [p for p in paths if p.stem in wanted]
        missing = wanted - {p.stem for p in paths}
        if missing:
            raise InferSimError(f"model card(s) not found in {directory}: {', '.join(sorted(missing))}")
    if not paths:
        raise InferSimError(f"no model cards (*.yaml) in {directory}: the harness derives kernel shapes from them")
    return [load_model_card(str(p))[0] for p in paths]


def cases_summary(cases: Sequence[BenchCase]) -> str:
    """'1,234 gemm, 56 attn_decode, ...' with the estimated wall time of the whole plan."""
    counts: dict[str, int] = {}
    for case in cases:
        counts[_family_key(case)] = counts.get(_family_key(case), 0) + 1
    total = sum(estimated_seconds(c) for c in cases)
    return ", ".join(f"{n} {f}" for f, n in counts.items()) + f" (about {math.ceil(total / 60)} min on a Hopper GPU)"
