"""Conversion of each of aiconfigurator's kernel tables into the project's rows: pure functions of
the records (infersim.tabletools.aiconfigurator locates and reads them, and writes the table directories).

Latencies there are in milliseconds. What is converted:

  gemm_perf                   gemm         gemm_dtype bfloat16 -> bf16, fp8 (per-tensor) -> fp8, nvfp4 -> fp4
                                           (NVFP4: e2m1 inputs and weights with fp8 scales per 16 elements,
                                           Blackwell); m, n, k as they are. fp8_block is not imported (the
                                           simulator has one fp8 format; its GEMM rate is per-tensor fp8).
  context_attention_perf      attention    prefill, MHA/GQA: batch_size 1; seq_len = isl; num_heads /
                                           num_key_value_heads per GPU; qk = v = head_dim. window_size > 0
                                           (sliding window: 128, GPT-OSS; 1024 on Blackwell; 8192) kept as
                                           the row's window; beam_width > 1 skipped.
  generation_attention_perf   attention    decode, MHA/GQA: batch_size, q_len 1 (isl), kv_len = isl + step
                                           (the cached tokens plus the new one), windowed rows too: their
                                           kv_len is the whole context, of which each query attends to the
                                           last window_size (measured times settle by about 2 x window, on
                                           Hopper still rising ~8% up to 4 x window); beam_width > 1 skipped.
  moe_perf                    grouped_gemm the whole routed-expert computation of one MoE layer on one GPU
                                           (moe_tp_size 1 only). Their num_tokens are the tokens of the whole EP
                                           group, so tokens_per_gpu = num_tokens / moe_ep_size (rows where that
                                           is not whole are skipped). The measured time covers both projections;
                                           it is split into `up` and `down` rows in proportion to their FLOPs
                                           (gated: 2/3 and 1/3), so up + down reproduces the measurement.
                                           The time is measured on the most loaded rank under power-law
                                           routing with exponent alpha: 1.01 for the DeepSeek/Kimi family
                                           (hidden 7168), 1.2 for others, as aiconfigurator's models do. The
                                           table records it (`moe_routing`), so the simulator must not add
                                           its own expert-load imbalance on top (MfuTables.moe_includes_imbalance).
                                           Written twice, as stage prefill and stage decode (one kernel serves both).
                                           moe_dtype bf16, fp8 (fp8_block where a shape has no per-tensor fp8)
                                           and nvfp4 -> fp4 (TensorRT-LLM's default CUTLASS MoE rows; its opt-in
                                           min-latency NVFP4 kernel, kernel_source moe_torch_flow_min_latency,
                                           is left out). MXFP4 weights with 16- or 8-bit activations (GPT-OSS's
                                           experts): w4a16_mxfp4 -> dtype bf16, weight_dtype fp4 (Hopper has no
                                           fp4 tensor cores: the weights are widened to bf16 in the main loop);
                                           w4a8_mxfp4_mxfp8 -> dtype fp8, weight_dtype fp4.

  custom_allreduce_perf       collective   the engine's all-reduce (TP all-reduce), CUDA-graph rows where both
                                           graph and eager were measured; message_bytes = 2 x message_size
                                           (16-bit elements); 2-8 GPUs in one node.
  nccl_perf (newest NCCL)     collective   all_gather and reduce_scatter (all_reduce too where the engine has no
                                           custom all-reduce table), half precision.

  context_mla_perf            attention    MLA prefill as MHA (qk 192, v 128, heads = num_heads / tp_size), batch 1.
  generation_mla_perf         attention    absorbed MLA decode (kind mla, qk 576, v 512), kv_len = isl + step.
                                           Both in DeepSeek-V3 geometry, which the tables do not name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Sequence

from infersim.base.errors import InferSimError
from infersim.tables.format import AttentionRow, CollectiveRow, GemmRow, GroupedGemmRow, Row

DTYPES: dict[str, str] = {"bfloat16": "bf16", "fp8": "fp8"}
#: GEMM and MoE formats: also NVFP4 (e2m1 inputs and weights, fp8 block scales per 16 elements), our fp4
GEMM_DTYPES: dict[str, str] = {**DTYPES, "nvfp4": "fp4"}
#: weight-only quantised MoE formats: aiconfigurator's moe_dtype -> (activation dtype, weight dtype). MXFP4 is
#: e2m1 weights with an 8-bit power-of-two scale per 32 elements (OCP MX spec), stored as our fp4
MOE_WEIGHT_ONLY: dict[str, tuple[str, str]] = {"w4a16_mxfp4": ("bf16", "fp4"), "w4a8_mxfp4_mxfp8": ("fp8", "fp4")}
#: the MoE kernel aiconfigurator times TensorRT-LLM's opt-in min-latency NVFP4 MoE with (not the default)
MIN_LATENCY_MOE = "moe_torch_flow_min_latency"
NVFP4_NOTE = ("NVFP4 (e2m1 inputs and weights, fp8 scales per 16 elements) stored as dtype fp4; efficiency relative "
              "to peak_flops.fp4")

#: power-law exponent aiconfigurator's models route MoE tokens with: DeepSeek/Kimi family 1.01
MOE_ALPHA_DEEPSEEK_FAMILY = 1.01
MOE_ALPHA_OTHERS = 1.2
DEEPSEEK_FAMILY_HIDDEN = 7168

def moe_alpha(hidden: int) -> float:
    """The power-law exponent aiconfigurator routes an MoE of this hidden size with."""
    return MOE_ALPHA_DEEPSEEK_FAMILY if hidden == DEEPSEEK_FAMILY_HIDDEN else MOE_ALPHA_OTHERS


def _int(record: dict[str, Any], name: str, where: str) -> int:
    value = record.get(name)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InferSimError(f"{where}: column {name} = {value!r} is not a number") from None
    if not number.is_integer():
        raise InferSimError(f"{where}: column {name} = {value!r} is not a whole number")
    return int(number)


def _latency_us(record: dict[str, Any], where: str) -> float:
    """aiconfigurator latencies are milliseconds."""
    try:
        ms = float(record["latency"])
    except (KeyError, TypeError, ValueError):
        raise InferSimError(f"{where}: column latency = {record.get('latency')!r} is not a number") from None
    return ms * 1000.0


@dataclass
class Converted:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _count_note(skipped: dict[str, int]) -> list[str]:
    return [f"{n} rows skipped: {why}" for why, n in sorted(skipped.items()) if n]


def convert_gemm(records: Iterable[dict[str, Any]], where: str) -> dict[str, Converted]:
    """GEMM rows by our dtype."""
    out: dict[str, Converted] = {}
    skipped: dict[str, dict[str, int]] = {}
    for record in records:
        dtype = GEMM_DTYPES.get(str(record.get("gemm_dtype")))
        if dtype is None:
            why = f"gemm_dtype {record.get('gemm_dtype')} (not a format the simulator's GEMM tables key on)"
            skipped.setdefault("*", {})[why] = skipped.get("*", {}).get(why, 0) + 1
            continue
        row = GemmRow(dtype=dtype, m=_int(record, "m", where), k=_int(record, "k", where), n=_int(record, "n", where),
                      latency_us=_latency_us(record, where))
        if row.latency_us > 0:
            out.setdefault(dtype, Converted()).rows.append(row)
    for converted in out.values():
        converted.notes += _count_note(skipped.get("*", {}))
    if "fp4" in out:
        out["fp4"].notes.append(f"gemm_dtype nvfp4: {NVFP4_NOTE}")
    return out


def _dtypes(record: dict[str, Any]) -> tuple[str, str] | None:
    dtype = DTYPES.get(str(record.get("attn_dtype")))
    kv_dtype = DTYPES.get(str(record.get("kv_cache_dtype")))
    return (dtype, kv_dtype) if dtype and kv_dtype else None


def _heads(record: dict[str, Any], where: str) -> tuple[int, int] | None:
    heads = _int(record, "num_heads", where)
    kv_heads = _int(record, "num_key_value_heads", where)
    if kv_heads <= 0 or kv_heads > heads or heads % kv_heads:
        return None
    return heads, kv_heads


def _window(record: dict[str, Any], where: str) -> int:
    """A record's sliding window in tokens (0: full attention; aiconfigurator writes 0 for none)."""
    window = _int(record, "window_size", where) if record.get("window_size") not in (None, "") else 0
    if window < 0:
        raise InferSimError(f"{where}: column window_size = {window} is negative")
    return window


def _single_beam(record: dict[str, Any], where: str) -> bool:
    return (_int(record, "beam_width", where) if record.get("beam_width") not in (None, "") else 1) == 1


_MHA_SKIPS = ("beam search (beam_width > 1)", "num_key_value_heads not a divisor of num_heads", "dtype not bf16/fp8")
WINDOW_NOTE = ("window_size > 0 rows kept with their window (sliding-window attention: each query attends to the "
               "last `window` positions); kv_len is the whole context, as for full attention")


def _mha_fields(record: dict[str, Any], where: str, skipped: dict[str, int]) -> dict[str, Any] | None:
    """The AttentionRow fields an MHA/GQA record shares across phases, or None (counted in
    `skipped`) for a record the table format does not hold."""
    if not _single_beam(record, where):
        skipped[_MHA_SKIPS[0]] += 1
        return None
    heads = _heads(record, where)
    if heads is None:
        skipped[_MHA_SKIPS[1]] += 1
        return None
    dtypes = _dtypes(record)
    if dtypes is None:
        skipped[_MHA_SKIPS[2]] += 1
        return None
    head_dim = _int(record, "head_dim", where)
    return dict(kind="mha", dtype=dtypes[0], kv_dtype=dtypes[1], num_heads=heads[0], num_kv_heads=heads[1],
                qk_head_dim=head_dim, v_head_dim=head_dim, causal=True, latency_us=_latency_us(record, where),
                window=_window(record, where))


def convert_context_attention(records: Iterable[dict[str, Any]], where: str) -> Converted:
    out = Converted()
    skipped = {"batch_size > 1 (prefill rows are one sequence)": 0, **{k: 0 for k in _MHA_SKIPS}}
    for record in records:
        if _int(record, "batch_size", where) != 1:
            skipped["batch_size > 1 (prefill rows are one sequence)"] += 1
            continue
        fields = _mha_fields(record, where, skipped)
        if fields is None:
            continue
        isl = _int(record, "isl", where)
        out.rows.append(AttentionRow(stage="prefill", batch=1, q_len=isl, kv_len=isl, **fields))
    out.notes += _count_note(skipped)
    if any(row.window for row in out.rows if isinstance(row, AttentionRow)):
        out.notes.append(WINDOW_NOTE)
    return out


def convert_generation_attention(records: Iterable[dict[str, Any]], where: str) -> Converted:
    out = Converted()
    skipped = {k: 0 for k in _MHA_SKIPS}
    for record in records:
        fields = _mha_fields(record, where, skipped)
        if fields is None:
            continue
        q_len = _int(record, "isl", where)
        kv_len = q_len + _int(record, "step", where)
        out.rows.append(AttentionRow(stage="decode", batch=_int(record, "batch_size", where), q_len=q_len,
                                     kv_len=kv_len, **fields))
    out.notes += _count_note(skipped)
    out.notes.append("kv_len = isl + step (aiconfigurator's step is the number of cached tokens before this one)")
    windows = sorted({row.window for row in out.rows if isinstance(row, AttentionRow) and row.window})
    if windows:
        out.notes.append(WINDOW_NOTE + f" (windows {', '.join(map(str, windows))})")
    return out


def convert_moe(records: Iterable[dict[str, Any]], where: str) -> dict[tuple[str, str], Converted]:
    """Grouped-GEMM rows by (label, routing), each measurement split into up and down, both stages.

    label is the dtype, or fp8_block for block-scaled fp8 MoEs that have no per-tensor fp8 measurement
    (stored as dtype fp8: the simulator has one fp8 format). nvfp4 becomes fp4, from TensorRT-LLM's
    default (CUTLASS) MoE rows; the opt-in min-latency kernel's rows are skipped."""
    out: dict[tuple[str, str], Converted] = {}
    not_imported = "moe_dtype not bf16/fp8/nvfp4/w4a16_mxfp4/w4a8_mxfp4_mxfp8 (fp8_block only where no " \
                   "per-tensor fp8)"
    min_latency = f"kernel_source {MIN_LATENCY_MOE} (TensorRT-LLM's opt-in min-latency NVFP4 MoE, not the default)"
    skipped = {"moe_tp_size > 1 (the format has no expert-TP axis)": 0,
               "num_tokens not a multiple of moe_ep_size": 0, not_imported: 0, min_latency: 0,
               "routing other than the model family's power law": 0}
    records = list(records)

    def shape_key(record: dict[str, Any]) -> tuple:
        return tuple(str(record.get(c)) for c in ("hidden_size", "inter_size", "num_experts", "topk"))

    per_tensor_fp8 = {shape_key(r) for r in records if str(r.get("moe_dtype")) == "fp8"}
    for record in records:
        moe_dtype = str(record.get("moe_dtype"))
        dtype = GEMM_DTYPES.get(moe_dtype)
        label, weight_dtype = dtype, None
        if moe_dtype == "fp8_block" and shape_key(record) not in per_tensor_fp8:
            dtype, label = "fp8", "fp8_block"  # the only fp8 measurement of this MoE (DeepSeek-style block scales)
        if moe_dtype in MOE_WEIGHT_ONLY:
            (dtype, weight_dtype), label = MOE_WEIGHT_ONLY[moe_dtype], moe_dtype
        if dtype is None:
            skipped[not_imported] += 1
            continue
        if str(record.get("kernel_source")) == MIN_LATENCY_MOE:
            skipped[min_latency] += 1
            continue
        if _int(record, "moe_tp_size", where) != 1:
            skipped["moe_tp_size > 1 (the format has no expert-TP axis)"] += 1
            continue
        hidden = _int(record, "hidden_size", where)
        routing = f"power_law_{moe_alpha(hidden):g}"
        if str(record.get("distribution")) != routing:
            skipped["routing other than the model family's power law"] += 1
            continue
        tokens = _int(record, "num_tokens", where)
        ep = _int(record, "moe_ep_size", where)
        if tokens % ep:
            skipped["num_tokens not a multiple of moe_ep_size"] += 1
            continue
        gated = "nongated" not in str(record.get("kernel_source", ""))
        total = _latency_us(record, where)
        up_share = (2.0 if gated else 1.0) / (3.0 if gated else 2.0)
        common = dict(dtype=dtype, num_experts=_int(record, "num_experts", where), ep=ep,
                      topk=_int(record, "topk", where), hidden=hidden,
                      intermediate=_int(record, "inter_size", where), gated=gated, tokens_per_gpu=tokens // ep,
                      weight_dtype=weight_dtype)
        target = out.setdefault((label, routing), Converted())
        for stage in ("prefill", "decode"):
            target.rows.append(GroupedGemmRow(stage=stage, projection="up", latency_us=total * up_share, **common))
            target.rows.append(GroupedGemmRow(stage=stage, projection="down", latency_us=total * (1.0 - up_share),
                                              **common))
    for converted in out.values():
        converted.rows, dropped = _drop_spikes(converted.rows)
        if dropped:
            converted.notes.append(
                f"{dropped} measurements dropped as outliers: time more than {SPIKE_RATIO:g}x that of the next "
                f"larger token count at the same shape and EP (a kernel's time does not fall when its work grows; "
                f"these are single-run spikes, e.g. 459 us between 81 us and 97 us)")
    for (label, routing), converted in out.items():
        converted.notes += _moe_table_notes(label, routing, skipped)
    return out


def _moe_table_notes(label: str, routing: str, skipped: dict[str, int]) -> list[str]:
    """What one MoE table's rows are: the records skipped, the format of its label, how a measurement
    was split and which routing it was timed under."""
    notes = _count_note(skipped)
    if label == "fp8_block":
        notes.append("moe_dtype fp8_block (block-scaled fp8, as DeepGEMM) stored as dtype fp8: these "
                     "MoE shapes have no per-tensor fp8 measurement")
    if label == "fp4":
        notes.append(f"moe_dtype nvfp4: {NVFP4_NOTE}; TensorRT-LLM's default CUTLASS MoE")
    if label in MOE_WEIGHT_ONLY:
        act, weights = MOE_WEIGHT_ONLY[label]
        notes.append(
            f"moe_dtype {label}: MXFP4 expert weights (e2m1, a power-of-two scale per 32 elements) stored as "
            f"weight_dtype {weights}, {act} activations (dtype {act}; efficiency relative to peak_flops.{act}); "
            f"GPT-OSS's expert shape; a run uses these rows when its precision.expert_gemm is {act} and "
            f"expert_weights {weights}")
    notes.append(
        f"moe_perf rows time the whole routed-expert computation; split up/down by FLOPs "
        f"(gated 2/3 : 1/3); tokens_per_gpu = num_tokens / moe_ep_size; routing {routing} (timed on the most "
        f"loaded rank): do not add an expert-load imbalance factor on top")
    return notes


#: DeepSeek-V3 MLA geometry, the one aiconfigurator's MLA collector measures (its tables do not name it)
MLA_KV_LORA_RANK = 512
MLA_ROPE_DIM = 64
MLA_NOPE_DIM = 128
MLA_V_DIM = 128


def convert_mla(records: Iterable[dict[str, Any]], where: str, stage: str) -> Converted:
    """context_mla_perf (stage prefill) or generation_mla_perf (decode), DeepSeek-V3 geometry. Heads per
    GPU = num_heads / tp_size. Prefill: MLA without absorption, stored as MHA with num_kv_heads =
    num_heads, qk = nope + rope = 192, v = 128, batch-1 rows. Decode: absorbed MLA (kind mla), qk =
    kv_lora_rank + rope = 576, v = kv_lora_rank = 512, kv_len = isl + step."""
    out = Converted()
    skipped = {"batch_size > 1 (prefill rows are one sequence)": 0, "fewer than one head per GPU": 0,
               "dtype not bf16/fp8": 0}
    for record in records:
        heads_total, tp = _int(record, "num_heads", where), _int(record, "tp_size", where)
        if heads_total % tp:
            skipped["fewer than one head per GPU"] += 1
            continue
        heads = heads_total // tp
        dtype = DTYPES.get(str(record.get("mla_dtype")))
        kv_dtype = DTYPES.get(str(record.get("kv_cache_dtype")))
        if dtype is None or kv_dtype is None:
            skipped["dtype not bf16/fp8"] += 1
            continue
        batch = _int(record, "batch_size", where)
        isl = _int(record, "isl", where)
        if stage == "prefill":
            if batch != 1:
                skipped["batch_size > 1 (prefill rows are one sequence)"] += 1
                continue
            out.rows.append(AttentionRow(kind="mha", stage="prefill", dtype=dtype, kv_dtype=kv_dtype, num_heads=heads,
                                         num_kv_heads=heads, qk_head_dim=MLA_NOPE_DIM + MLA_ROPE_DIM,
                                         v_head_dim=MLA_V_DIM, causal=True, batch=1, q_len=isl, kv_len=isl,
                                         latency_us=_latency_us(record, where)))
        else:
            kv_len = isl + _int(record, "step", where)
            out.rows.append(AttentionRow(kind="mla", stage="decode", dtype=dtype, kv_dtype=kv_dtype, num_heads=heads,
                                         num_kv_heads=1, qk_head_dim=MLA_KV_LORA_RANK + MLA_ROPE_DIM,
                                         v_head_dim=MLA_KV_LORA_RANK, causal=True, batch=batch, q_len=isl,
                                         kv_len=kv_len, latency_us=_latency_us(record, where)))
    out.notes += _count_note(skipped)
    out.notes.append("DeepSeek-V3 MLA geometry (kv_lora_rank 512, rope 64, nope 128, v 128), which aiconfigurator's "
                     "MLA collector measures; heads per GPU = num_heads / tp_size"
                     + ("; kv_len = isl + step" if stage == "decode" else ""))
    return out


COLLECTIVE_KINDS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter"}
ELEMENT_BYTES = {"bfloat16": 2, "half": 2, "float16": 2}


def convert_collectives(records: Iterable[dict[str, Any]], where: str, library: str,
                        kinds: Sequence[str]) -> Converted:
    """Collective rows of the given kinds. aiconfigurator's message_size counts elements (16-bit
    here), so message_bytes = 2 x message_size: at 2^29 elements an 8-GPU H100 all-reduce then
    moves 2 x 7/8 x 1.07 GB in 4.0 ms, 470 GB/s of bus bandwidth, what NVLink 4 achieves (read
    as bytes it would be half that). Engines' custom all-reduce tables measured with CUDA graphs
    and eagerly keep the graph rows (what serving runs)."""
    records = list(records)
    out = Converted()
    graph = [r for r in records if "graph" in str(r.get("kernel_source", "")).lower()
             or "graph" in str(r.get("backend", "")).lower()]
    if graph:
        out.notes.append(f"{len(records) - len(graph)} rows skipped: eager (not CUDA-graph) all-reduce")
        records = graph
    skipped = {"op or dtype not imported": 0}
    for record in records:
        kind = COLLECTIVE_KINDS.get(str(record.get("op_name")))
        dtype = str(record.get("allreduce_dtype") or record.get("nccl_dtype"))
        if kind not in kinds or dtype not in ELEMENT_BYTES:
            skipped["op or dtype not imported"] += 1
            continue
        out.rows.append(CollectiveRow(kind=kind, library=library, dtype="bf16", ranks=_int(record, "num_gpus", where),
                                      message_bytes=_int(record, "message_size", where) * ELEMENT_BYTES[dtype],
                                      latency_us=_latency_us(record, where)))
    out.notes += _count_note(skipped)
    out.notes.append("message_bytes = 2 x message_size (aiconfigurator counts 16-bit elements); one node")
    return out


#: a MoE measurement more than this many times the next larger token count's is a spike (see convert_moe)
SPIKE_RATIO = 1.5


def _drop_spikes(rows: list[Row]) -> tuple[list[Row], int]:
    """Grouped-GEMM rows without spikes: a point whose time exceeds SPIKE_RATIO x the time of the next
    larger tokens_per_gpu in the same (shape, ep, stage, projection) row. Returns (kept rows, measurements dropped)."""
    series: dict[tuple, list[GroupedGemmRow]] = {}
    for row in rows:
        assert isinstance(row, GroupedGemmRow)
        key = (row.dtype, row.stage, row.projection, row.num_experts, row.ep, row.topk, row.hidden,
               row.intermediate, row.gated)
        series.setdefault(key, []).append(row)
    spikes: set[int] = set()
    for members in series.values():
        members.sort(key=lambda r: r.tokens_per_gpu)
        for here, after in zip(members, members[1:]):
            if here.latency_us > SPIKE_RATIO * after.latency_us:
                spikes.add(id(here))
    kept = [r for r in rows if id(r) not in spikes]
    measurements = len(spikes) // 4  # each measurement is four rows: up/down x prefill/decode
    return kept, measurements
