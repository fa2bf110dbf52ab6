"""Measuring harness: time the kernels the simulator asks about on the GPU it runs on, and write
them as a table directory with provenance.

    python -m infersim mfu bench --kernels gemm,grouped_gemm,attn_prefill,attn_decode --out mfu_tables/h100-sxm/

Three parts, so the harness can be tested without a GPU:
  - the plan (pure): which kernels to time, derived from the model cards (models/*.yaml) at
    TP 1/2/4/8 — the (K, N) of every projection, the expert configurations at EP 1..64, the
    attention head layouts;
  - a `KernelBackend`: allocates inputs for a case and returns a launch closure, and says which
    library runs it and what the device is (`TorchBackend`, importing torch lazily);
  - a `KernelTimer`: times a launch closure (`CudaEventTimer`: warm-up, CUDA events around each
    run, median of repeats, L2 flushed before each run of a memory-bound kernel).
Tests inject a fake backend and timer; without torch or a CUDA device `TorchBackend.create`
raises `NoGpuError`, which the command reports in one line (non-zero exit).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Protocol, Sequence, TextIO, Union

from infersim.cards.model import ModelCard
from infersim.errors import InferSimError
from infersim.kernels import GroupedGemmShape
from infersim.mfu.format import (
    FORMAT_VERSION,
    AttentionRow,
    DeviceInfo,
    GemmRow,
    GroupedGemmRow,
    Provenance,
    Row,
    TableDirectory,
    TableInfo,
    efficiency_of,
    write_table_dir,
)

KERNEL_FAMILIES = ("gemm", "grouped_gemm", "attn_prefill", "attn_decode")
#: kernels with fewer FLOPs per byte than this are memory-bound on Hopper-class GPUs (bf16 ridge
#: ~ 989e12 / 3.35e12 ~ 300): their inputs are evicted from L2 before every timed run
MEMORY_BOUND_INTENSITY = 300.0


class NoGpuError(InferSimError):
    """The harness needs a CUDA GPU and PyTorch; this machine lacks one of them."""


# ---------------------------------------------------------------------------------------------
# Cases: one kernel launch to time, and the table row its latency becomes


@dataclass(frozen=True)
class GemmCase:
    dtype: str
    m: int
    k: int
    n: int

    family = "gemm"

    def row(self, latency_us: float) -> GemmRow:
        return GemmRow(dtype=self.dtype, m=self.m, k=self.k, n=self.n, latency_us=latency_us)

    def label(self) -> str:
        return f"gemm {self.dtype} m={self.m} k={self.k} n={self.n}"


@dataclass(frozen=True)
class GroupedGemmCase:
    dtype: str
    stage: Literal["prefill", "decode"]
    projection: Literal["up", "down"]
    num_experts: int
    ep: int
    topk: int
    hidden: int
    intermediate: int
    gated: bool
    tokens_per_gpu: int

    family = "grouped_gemm"

    @property
    def shape(self) -> GroupedGemmShape:
        """The simulator's shape for this launch (through the table row, so the harness, the tables
        and the simulator share one definition of K, N and the local experts)."""
        return self.row(latency_us=0.0).shape()

    @property
    def local_experts(self) -> int:
        return self.shape.local_experts

    @property
    def k(self) -> int:
        return self.shape.k

    @property
    def n(self) -> int:
        return self.shape.n

    def rows_per_expert(self) -> list[int]:
        """Routed rows per local expert: tokens x topk spread as evenly as possible (balanced routing)."""
        routed = self.tokens_per_gpu * self.topk
        base, extra = divmod(routed, self.local_experts)
        return [base + (1 if i < extra else 0) for i in range(self.local_experts)]

    def row(self, latency_us: float) -> GroupedGemmRow:
        return GroupedGemmRow(dtype=self.dtype, stage=self.stage, projection=self.projection,
                              num_experts=self.num_experts, ep=self.ep, topk=self.topk, hidden=self.hidden,
                              intermediate=self.intermediate, gated=self.gated, tokens_per_gpu=self.tokens_per_gpu,
                              latency_us=latency_us)

    def label(self) -> str:
        return (f"grouped_gemm {self.dtype} {self.stage} {self.projection} E={self.num_experts} ep={self.ep} "
                f"topk={self.topk} h={self.hidden} i={self.intermediate} tokens={self.tokens_per_gpu}")


@dataclass(frozen=True)
class AttentionCase:
    kind: Literal["mha", "mla"]
    stage: Literal["prefill", "decode"]
    dtype: str
    kv_dtype: str
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    batch: int
    q_len: int
    kv_len: int
    causal: bool = True

    @property
    def family(self) -> str:  # type: ignore[override]
        return "attn_prefill" if self.stage == "prefill" else "attn_decode"

    def row(self, latency_us: float) -> AttentionRow:
        return AttentionRow(kind=self.kind, stage=self.stage, dtype=self.dtype, kv_dtype=self.kv_dtype,
                            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, qk_head_dim=self.qk_head_dim,
                            v_head_dim=self.v_head_dim, causal=self.causal, batch=self.batch, q_len=self.q_len,
                            kv_len=self.kv_len, latency_us=latency_us)

    def label(self) -> str:
        layout = f"{self.num_heads}-{self.num_kv_heads}-{self.qk_head_dim}-{self.v_head_dim}"
        return (f"attention {self.kind} {self.stage} {layout} kv {self.kv_dtype} batch={self.batch} "
                f"kv_len={self.kv_len}")


BenchCase = Union[GemmCase, GroupedGemmCase, AttentionCase]


def is_memory_bound(case: BenchCase) -> bool:
    shape = case.row(1.0).shape()
    return shape.flops < MEMORY_BOUND_INTENSITY * shape.bytes


def table_family(case: BenchCase) -> str:
    """The table-format family a case's row belongs to."""
    return "attention" if isinstance(case, AttentionCase) else case.family


def table_file(case: BenchCase) -> str:
    """The CSV a case's row is written to."""
    if isinstance(case, GemmCase):
        return f"gemm_{case.dtype}.csv"
    if isinstance(case, GroupedGemmCase):
        return f"grouped_gemm_{case.stage}_{case.dtype}.csv"
    layout = f"{case.num_heads}-{case.num_kv_heads}-{case.qk_head_dim}-{case.v_head_dim}"
    return f"attention_{case.stage}_{case.kind}_{layout}.csv"


# ---------------------------------------------------------------------------------------------
# Plan: what to time, from the model cards (pure)


@dataclass(frozen=True)
class BenchOptions:
    kernels: tuple[str, ...] = KERNEL_FAMILIES
    dtypes: tuple[str, ...] = ("bf16", "fp8")
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    m_values: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    ep_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_tokens_per_gpu: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    decode_tokens_per_gpu: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    prefill_seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384, 32768)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    decode_kv_lens: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    max_input_bytes: float = 24e9  # cases needing more device memory for their inputs are skipped

    def quick(self) -> "BenchOptions":
        """A reduced grid (minutes, not hours): every other point of each axis, TP 1 and 8."""
        return replace(self, tp_sizes=(1, 8), m_values=(1, 16, 64, 256, 1024, 4096, 16384),
                       ep_sizes=(1, 8, 64), prefill_tokens_per_gpu=(1024, 4096, 16384),
                       decode_tokens_per_gpu=(1, 16, 128, 512), prefill_seq_lens=(1024, 4096, 16384),
                       decode_batches=(1, 16, 128, 512), decode_kv_lens=(1024, 8192, 65536))


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int | None:
    if tp <= kv_heads:
        return kv_heads // tp if kv_heads % tp == 0 else None
    return 1 if tp % kv_heads == 0 else None


def _split(total: int, parts: int) -> int | None:
    return total // parts if total % parts == 0 else None


def gemm_kn_from_card(card: ModelCard, tp: int) -> list[tuple[int, int, bool]]:
    """(K, N, bf16_only) of the GEMMs one GPU runs for `card` at attention/FFN TP `tp`, as the
    simulator's operation builders shape them (bf16_only: kernels that stay bf16 under fp8 GEMMs)."""
    h = card.hidden_size
    out: list[tuple[int, int, bool]] = []
    heads = _split(card.num_attention_heads, tp)
    if heads is not None:
        if card.is_mla:
            latent = card.kv_lora_rank + card.qk_rope_head_dim
            qk, v = card.qk_head_dim, card.v_head_dim
            if card.q_lora_rank:
                out += [(h, card.q_lora_rank + latent, False), (card.q_lora_rank, heads * qk, False)]
            else:
                out += [(h, latent, False), (h, heads * qk, False)]
            out += [(card.kv_lora_rank, heads * (card.qk_nope_head_dim + v), False), (heads * v, h, False),
                    (card.qk_nope_head_dim, heads * card.kv_lora_rank, True), (card.kv_lora_rank, heads * v, True)]
        else:
            kv = _kv_heads_per_rank(card.num_key_value_heads, tp)
            if kv is not None:
                d = card.head_dim
                out += [(h, (heads + 2 * kv) * d, False), (heads * d, h, False)]
    up_factor = 2 if card.gated_ffn else 1
    if card.num_dense_layers and card.intermediate_size:
        width = _split(card.intermediate_size, tp)
        if width:
            out += [(h, up_factor * width, False), (width, h, False)]
    if card.is_moe:
        out.append((h, card.num_experts, True))  # router gate
        if card.num_shared_experts:
            width = _split(card.shared_width, tp)
            if width:
                out += [(h, up_factor * width, False), (width, h, False)]
    vocab = _split(card.vocab_size, tp)
    if vocab:
        out.append((h, vocab, True))  # LM head
    return out


def plan_gemm(cards: Sequence[ModelCard], options: BenchOptions) -> list[GemmCase]:
    shapes: dict[tuple[int, int], bool] = {}
    for card in cards:
        for tp in options.tp_sizes:
            for k, n, bf16_only in gemm_kn_from_card(card, tp):
                shapes[(k, n)] = shapes.get((k, n), True) and bf16_only
    cases = []
    for (k, n), bf16_only in sorted(shapes.items()):
        for dtype in options.dtypes:
            if dtype != "bf16" and bf16_only:
                continue
            cases += [GemmCase(dtype, m, k, n) for m in options.m_values]
    return cases


def plan_grouped_gemm(cards: Sequence[ModelCard], options: BenchOptions) -> list[GroupedGemmCase]:
    configs = sorted({(c.num_experts, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size, c.gated_ffn)
                      for c in cards if c.is_moe})
    cases = []
    for experts, topk, hidden, inter, gated in configs:
        for dtype in options.dtypes:
            for ep in options.ep_sizes:
                if experts % ep:
                    continue
                for stage, tokens_list in (("prefill", options.prefill_tokens_per_gpu),
                                           ("decode", options.decode_tokens_per_gpu)):
                    for tokens in tokens_list:
                        for projection in ("up", "down"):
                            cases.append(GroupedGemmCase(dtype, stage, projection, experts, ep, topk,  # type: ignore[arg-type]
                                                         hidden, inter, gated, tokens))
    return cases


def attention_layouts(cards: Sequence[ModelCard], tp_sizes: Sequence[int]) -> list[tuple[str, str, int, int, int, int]]:
    """(kind, stage, heads, kv heads, qk dim, v dim) per GPU for every card and TP; MLA decode is
    the absorbed latent layout, MLA prefill plain MHA over decompressed K/V."""
    layouts = set()
    for card in cards:
        for tp in tp_sizes:
            heads = _split(card.num_attention_heads, tp)
            if heads is None:
                continue
            if card.is_mla:
                layouts.add(("mha", "prefill", heads, heads, card.qk_head_dim, card.v_head_dim))
                layouts.add(("mla", "decode", heads, 1, card.kv_lora_rank + card.qk_rope_head_dim, card.kv_lora_rank))
            else:
                kv = _kv_heads_per_rank(card.num_key_value_heads, tp)
                if kv is None:
                    continue
                d = card.head_dim
                layouts.add(("mha", "prefill", heads, kv, d, d))
                layouts.add(("mha", "decode", heads, kv, d, d))
    return sorted(layouts)


def plan_attention(cards: Sequence[ModelCard], options: BenchOptions, stage: str) -> list[AttentionCase]:
    cases = []
    for kind, layout_stage, heads, kv_heads, qk, v in attention_layouts(cards, options.tp_sizes):
        if layout_stage != stage:
            continue
        if stage == "prefill":
            for s in options.prefill_seq_lens:
                case = AttentionCase(kind, "prefill", "bf16", "bf16", heads, kv_heads, qk, v, 1, s, s)  # type: ignore[arg-type]
                if attention_input_bytes(case) <= options.max_input_bytes:
                    cases.append(case)
        else:
            for kv_dtype in options.kv_dtypes:
                for batch in options.decode_batches:
                    for kv_len in options.decode_kv_lens:
                        case = AttentionCase(kind, "decode", "bf16", kv_dtype, heads, kv_heads, qk, v,  # type: ignore[arg-type]
                                             batch, 1, kv_len)
                        if attention_input_bytes(case) <= options.max_input_bytes:
                            cases.append(case)
    return cases


def attention_input_bytes(case: AttentionCase) -> float:
    return case.row(1.0).shape().bytes


def plan_cases(cards: Sequence[ModelCard], options: BenchOptions) -> list[BenchCase]:
    unknown = [k for k in options.kernels if k not in KERNEL_FAMILIES]
    if unknown:
        raise InferSimError(f"unknown kernel family '{unknown[0]}' (known: {', '.join(KERNEL_FAMILIES)})")
    cases: list[BenchCase] = []
    if "gemm" in options.kernels:
        cases += plan_gemm(cards, options)
    if "grouped_gemm" in options.kernels:
        cases += plan_grouped_gemm(cards, options)
    if "attn_prefill" in options.kernels:
        cases += plan_attention(cards, options, "prefill")
    if "attn_decode" in options.kernels:
        cases += plan_attention(cards, options, "decode")
    return cases


def load_cards(directory: Path, names: Sequence[str] = ()) -> list[ModelCard]:
    """Model cards from a directory of YAML cards (all of them, or those named)."""
    from infersim.config import load_model_card

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


# ---------------------------------------------------------------------------------------------
# Device: backend (inputs and launches) and timer


@dataclass(frozen=True)
class Environment:
    device: DeviceInfo
    software: dict[str, str]


class KernelBackend(Protocol):
    def environment(self) -> Environment:
        """What the kernels run on: device name, SM count, clocks; torch/CUDA/library versions."""
        ...

    def prepare(self, case: BenchCase) -> tuple[Callable[[], None], str] | str:
        """Allocate random non-zero inputs; return (launch closure, library that runs it), or a
        reason the case cannot run here (unsupported dtype, no kernel, out of memory)."""
        ...

    def release(self) -> None:
        """Free what the last `prepare` allocated."""
        ...


class KernelTimer(Protocol):
    def measure(self, case: BenchCase, launch: Callable[[], None]) -> float:
        """Median seconds of one `launch` (warm-up first; L2 flushed before each run of a
        memory-bound case)."""
        ...


# ---------------------------------------------------------------------------------------------
# The harness


@dataclass
class BenchResult:
    directory: Path
    measured: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> cases


def _today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def _table_description(name: str, family: str) -> str:
    return {
        "gemm": "dense GEMM C = A @ W over M for each (K, N) of the model cards at TP 1/2/4/8",
        "grouped_gemm": "routed-expert grouped GEMM over EP and tokens per GPU (balanced routing): 'up' is "
                        "gate+up fused (n = 2 x intermediate), 'down' the down projection",
        "attention": "causal attention, one head layout; prefill: one sequence of seq_len tokens; decode: one "
                     "query token per sequence over kv_len cached tokens",
    }[family] + f" ({name})"


def build_table_directory(rows_by_file: dict[str, list[Row]], families: dict[str, str],
                          libraries: dict[str, set[str]], env: Environment, peaks: dict[str, float],
                          command: str, notes: Sequence[str], measured_on: str) -> TableDirectory:
    """Provenance plus tables, from what the harness measured (pure)."""
    tables = {name: tuple(rows) for name, rows in sorted(rows_by_file.items()) if rows}
    infos = {name: TableInfo(family=families[name], library="; ".join(sorted(libraries[name])),  # type: ignore[arg-type]
                             library_version=env.software.get("libraries", "see software"),
                             description=_table_description(name, families[name]))
             for name in tables}
    prov = Provenance(format_version=FORMAT_VERSION, device=env.device, peak_flops=dict(peaks), origin="measured",
                      measured_on=measured_on, written_on=measured_on, command=command,
                      software=dict(env.software), notes=tuple(notes), tables=infos)
    return TableDirectory(prov, tables)


def run_bench(cases: Sequence[BenchCase], backend: KernelBackend, timer: KernelTimer, out: Path,
              peaks: dict[str, float], command: str, progress: TextIO | None | Literal["stderr"] = "stderr",
              max_seconds: float = math.inf, checkpoint_seconds: float = 60.0,
              clock: Callable[[], float] = time.monotonic, measured_on: str | None = None) -> BenchResult:
    """Time every case, writing the table directory to `out` now and then and at the end.
    Progress goes to `progress` (standard error by default, None for silence)."""
    stream: TextIO | None = sys.stderr if progress == "stderr" else progress  # type: ignore[assignment]
    env = backend.environment()
    missing_peaks = sorted({case.dtype for case in cases} - set(peaks))
    if missing_peaks:
        raise InferSimError(f"no peak FLOP/s for {', '.join(missing_peaks)} on {env.device.name}: "
                            f"give --peak-{missing_peaks[0]} or --hardware")
    date = measured_on or _today()
    rows_by_file: dict[str, list[Row]] = {}
    families: dict[str, str] = {}
    libraries: dict[str, set[str]] = {}
    skipped: dict[str, int] = {}
    notes: list[str] = [f"timing: {getattr(timer, 'description', type(timer).__name__)}"]
    start = last_write = clock()
    measured = 0

    def write() -> None:
        all_notes = notes + [f"not measured ({count} cases): {reason}" for reason, count in sorted(skipped.items())]
        if any(rows_by_file.values()):
            write_table_dir(out, build_table_directory(rows_by_file, families, libraries, env, peaks, command,
                                                       all_notes, date))

    for index, case in enumerate(cases, start=1):
        now = clock()
        if now - last_write > checkpoint_seconds:
            write()
            last_write = now
        if now - start > max_seconds:
            reason = f"time budget of {max_seconds:g} s spent"
            skipped[reason] = skipped.get(reason, 0) + len(cases) - index + 1
            break
        prepared = backend.prepare(case)
        if isinstance(prepared, str):
            backend.release()
            skipped[prepared] = skipped.get(prepared, 0) + 1
            if stream:
                print(f"[{index}/{len(cases)}] {case.label()}: skipped ({prepared})", file=stream)
            continue
        launch, library = prepared
        try:
            seconds = timer.measure(case, launch)
        except Exception as exc:  # noqa: BLE001 - one failing kernel must not lose the others' measurements
            reason = f"{library} failed while timing ({type(exc).__name__})"
            skipped[reason] = skipped.get(reason, 0) + 1
            if stream:
                print(f"[{index}/{len(cases)}] {case.label()}: {reason}: {exc}", file=stream)
            continue
        finally:
            backend.release()
        row = case.row(round(seconds * 1e6, 4))
        name = table_file(case)
        rows_by_file.setdefault(name, []).append(row)
        families[name] = table_family(case)
        libraries.setdefault(name, set()).add(library)
        measured += 1
        if stream:
            eff = efficiency_of(row, peaks[case.dtype])
            print(f"[{index}/{len(cases)}] {case.label()}: {row.latency_us:.2f} us (efficiency {eff:.3f}) "
                  f"[{library}]", file=stream)
    write()
    if not measured:
        raise InferSimError("no kernel could be measured: " + "; ".join(sorted(skipped)) if skipped else
                            "no kernels to measure (check --kernels and the model cards)")
    return BenchResult(out, measured, skipped)


# ---------------------------------------------------------------------------------------------
# PyTorch implementation (imported lazily: torch is not a dependency of the simulator)


def _nvidia_smi(query: str) -> list[str]:
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    first = done.stdout.strip().splitlines()[:1]
    return [v.strip() for v in first[0].split(",")] if first else []


def _version_of(module: str) -> str | None:
    try:
        imported = __import__(module)
    except Exception:  # noqa: BLE001 - an optional library that fails to import is simply absent
        return None
    return str(getattr(imported, "__version__", "unknown"))


class TorchBackend:
    """Kernels through PyTorch: cuBLAS(Lt) GEMMs (torch.mm, torch._scaled_mm for fp8), grouped
    GEMMs (torch._grouped_mm / torch._scaled_grouped_mm where present, else one GEMM per expert),
    attention through flash-attn when importable, else torch SDPA; FlashMLA for MLA decode."""

    def __init__(self, torch: Any, device_index: int = 0) -> None:
        self.torch = torch
        self.device = torch.device("cuda", device_index)
        self.flash_attn = self._import_optional("flash_attn")
        self.flash_mla = self._import_optional("flash_mla")
        self._held: list[Any] = []
        major, minor = torch.cuda.get_device_capability(self.device)
        self.fp8 = (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")

    @staticmethod
    def _import_optional(name: str) -> Any:
        try:
            return __import__(name)
        except Exception:  # noqa: BLE001
            return None

    @classmethod
    def create(cls) -> "TorchBackend":
        try:
            import torch
        except ImportError:
            raise NoGpuError("mfu bench needs a CUDA GPU with PyTorch, and PyTorch is not installed here; "
                             "run it on the GPU machine whose kernels you want to measure") from None
        if not torch.cuda.is_available():
            raise NoGpuError(f"mfu bench needs a CUDA GPU, and PyTorch {torch.__version__} sees none on this "
                             f"machine; run it on the GPU machine whose kernels you want to measure")
        return cls(torch)

    # -- environment

    def environment(self) -> Environment:
        torch = self.torch
        props = torch.cuda.get_device_properties(self.device)
        clocks: dict[str, float] = {}
        smi = _nvidia_smi("clocks.max.sm,clocks.max.memory,clocks.sm,clocks.mem,driver_version")
        for name, value in zip(("sm_max_mhz", "memory_max_mhz", "sm_at_start_mhz", "memory_at_start_mhz"), smi[:4]):
            try:
                clocks[name] = float(value)
            except ValueError:
                pass
        software = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version()),
            "driver": smi[4] if len(smi) > 4 else "unknown",
            "capability": ".".join(map(str, torch.cuda.get_device_capability(self.device))),
        }
        libraries = [f"torch {torch.__version__}"]
        for module in ("flash_attn", "flash_mla", "triton"):
            version = _version_of(module)
            if version:
                software[module] = version
                libraries.append(f"{module} {version}")
        software["libraries"] = ", ".join(libraries)
        device = DeviceInfo(name=props.name, sm_count=int(props.multi_processor_count), clocks=clocks,
                            memory_bytes=float(props.total_memory),
                            l2_bytes=float(getattr(props, "L2_cache_size", 0)) or None)
        return Environment(device, software)

    def l2_bytes(self) -> int:
        props = self.torch.cuda.get_device_properties(self.device)
        return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)

    # -- inputs

    def _random(self, shape: Sequence[int], dtype: str) -> Any:
        torch = self.torch
        x = torch.randn(*shape, device=self.device, dtype=torch.bfloat16)
        if dtype == "fp8":
            x = x.to(torch.float8_e4m3fn)
        self._held.append(x)
        return x

    def release(self) -> None:
        self._held.clear()

    def _fits(self, nbytes: float) -> bool:
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return nbytes < 0.8 * free

    def prepare(self, case: BenchCase) -> tuple[Callable[[], None], str] | str:
        if case.dtype == "fp8" and not self.fp8:
            return "fp8 GEMMs need compute capability 8.9+ and torch._scaled_mm"
        torch = self.torch
        try:
            if isinstance(case, GemmCase):
                prepared = self._prepare_gemm(case)
            elif isinstance(case, GroupedGemmCase):
                prepared = self._prepare_grouped(case)
            else:
                prepared = self._prepare_attention(case)
            if isinstance(prepared, str):
                return prepared
            prepared[0]()  # one trial launch: a kernel that refuses these shapes is a skip, not a crash
            torch.cuda.synchronize(self.device)
            return prepared
        except torch.cuda.OutOfMemoryError:
            self.release()
            torch.cuda.empty_cache()
            return "out of device memory"
        except RuntimeError as exc:
            self.release()
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            return f"the kernel refused these shapes: {first_line}"

    def _prepare_gemm(self, case: GemmCase) -> tuple[Callable[[], None], str] | str:
        torch = self.torch
        nbytes = (case.m * case.k + case.k * case.n) * (1 if case.dtype == "fp8" else 2) + case.m * case.n * 2
        if not self._fits(nbytes):
            return "out of device memory"
        a = self._random((case.m, case.k), case.dtype)
        w = self._random((case.n, case.k), case.dtype)  # weights stored N x K, used transposed
        out = torch.empty(case.m, case.n, device=self.device, dtype=torch.bfloat16)
        self._held.append(out)
        if case.dtype == "bf16":
            wt = w.t()
            return (lambda: torch.mm(a, wt, out=out)), "torch.mm (cuBLAS) bf16"
        if case.m % 16 or case.k % 16 or case.n % 16:
            return "torch._scaled_mm needs M, K and N multiples of 16"
        one = torch.ones((), device=self.device, dtype=torch.float32)
        wt = w.t()
        return (lambda: torch._scaled_mm(a, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), \
            "torch._scaled_mm (cuBLASLt) fp8 e4m3, per-tensor scales"

    def _prepare_grouped(self, case: GroupedGemmCase) -> tuple[Callable[[], None], str] | str:
        torch = self.torch
        rows = case.rows_per_expert()
        total = sum(rows)
        elem = 1 if case.dtype == "fp8" else 2
        nbytes = case.local_experts * case.k * case.n * elem + total * (case.k * elem + case.n * 2)
        if not self._fits(nbytes):
            return "out of device memory"
        a = self._random((total, case.k), case.dtype)
        w = self._random((case.local_experts, case.n, case.k), case.dtype)  # per expert N x K
        grouped = getattr(torch, "_grouped_mm" if case.dtype == "bf16" else "_scaled_grouped_mm", None)
        if grouped is not None:
            offsets = torch.tensor([sum(rows[: i + 1]) for i in range(len(rows))], device=self.device,
                                   dtype=torch.int32)
            wt = w.transpose(-2, -1)
            self._held.append(offsets)
            if case.dtype == "bf16":
                def launch() -> None:
                    torch._grouped_mm(a, wt, offs=offsets, out_dtype=torch.bfloat16)
                name = "torch._grouped_mm bf16"
            else:
                scale_a = torch.ones(total, device=self.device, dtype=torch.float32)
                scale_b = torch.ones(case.local_experts, case.n, device=self.device, dtype=torch.float32)
                self._held += [scale_a, scale_b]

                def launch() -> None:
                    torch._scaled_grouped_mm(a, wt, scale_a, scale_b, offs=offsets, out_dtype=torch.bfloat16)
                name = "torch._scaled_grouped_mm fp8 e4m3, row-wise scales"
            try:
                launch()
                torch.cuda.synchronize(self.device)
                return launch, name
            except RuntimeError:
                pass  # this build's grouped GEMM refuses these shapes: fall back to one GEMM per expert
        return self._prepare_grouped_loop(case, a, w, rows)

    def _prepare_grouped_loop(self, case: GroupedGemmCase, a: Any, w: Any, rows: list[int]) \
            -> tuple[Callable[[], None], str] | str:
        torch = self.torch
        starts = [sum(rows[:i]) for i in range(len(rows))]
        if case.dtype == "bf16":
            pieces = [(a[s:s + r], w[e].t()) for e, (s, r) in enumerate(zip(starts, rows)) if r]

            def launch() -> None:
                for x, wt in pieces:
                    torch.mm(x, wt)
            return launch, "torch.mm per expert (torch's grouped GEMM missing or refusing these shapes) bf16"
        padded = [(r + 15) // 16 * 16 for r in rows]
        a_pad = self._random((sum(padded), case.k), "fp8")
        one = torch.ones((), device=self.device, dtype=torch.float32)
        pstarts = [sum(padded[:i]) for i in range(len(padded))]
        pieces = [(a_pad[s:s + r], w[e].t()) for e, (s, r) in enumerate(zip(pstarts, padded)) if r]

        def launch_fp8() -> None:
            for x, wt in pieces:
                torch._scaled_mm(x, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return launch_fp8, ("torch._scaled_mm per expert, rows padded to 16 (torch's grouped fp8 GEMM missing or "
                            "refusing these shapes)")

    def _prepare_attention(self, case: AttentionCase) -> tuple[Callable[[], None], str] | str:
        torch = self.torch
        if not self._fits(attention_input_bytes(case) * 1.2):
            return "out of device memory"
        if case.kind == "mla":
            return self._prepare_flash_mla(case)
        if case.kv_dtype != "bf16":
            return f"{case.kv_dtype} KV cache: no kernel for it in torch SDPA or flash-attn here"
        b, h, hk = case.batch, case.num_heads, case.num_kv_heads
        if self.flash_attn is not None and case.qk_head_dim == case.v_head_dim and case.qk_head_dim <= 256:
            fa = self.flash_attn
            q = self._random((b, case.q_len, h, case.qk_head_dim), "bf16")
            k = self._random((b, case.kv_len, hk, case.qk_head_dim), "bf16")
            v = self._random((b, case.kv_len, hk, case.v_head_dim), "bf16")
            version = getattr(fa, "__version__", "unknown")
            if case.stage == "decode":
                seqlens = torch.full((b,), case.kv_len, device=self.device, dtype=torch.int32)
                self._held.append(seqlens)
                return (lambda: fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True)), \
                    f"flash_attn.flash_attn_with_kvcache {version}"
            return (lambda: fa.flash_attn_func(q, k, v, causal=True)), f"flash_attn.flash_attn_func {version}"
        sdpa = torch.nn.functional.scaled_dot_product_attention
        q = self._random((b, h, case.q_len, case.qk_head_dim), "bf16")
        k = self._random((b, hk, case.kv_len, case.qk_head_dim), "bf16")
        v = self._random((b, hk, case.kv_len, case.v_head_dim), "bf16")
        gqa = hk != h
        causal = case.stage == "prefill"  # one query token attends to every cached token
        return (lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)), \
            f"torch.nn.functional.scaled_dot_product_attention (torch {torch.__version__} picks the backend)"

    def _prepare_flash_mla(self, case: AttentionCase) -> tuple[Callable[[], None], str] | str:
        if self.flash_mla is None:
            return "MLA decode: FlashMLA (flash_mla) is not installed"
        if case.kv_dtype != "bf16":
            return f"MLA decode with {case.kv_dtype} KV cache: not wired up"
        torch, fm = self.torch, self.flash_mla
        block = 64
        b, s_q = case.batch, case.q_len
        blocks_per_seq = -(-case.kv_len // block)
        q = self._random((b, s_q, case.num_heads, case.qk_head_dim), "bf16")
        cache = self._random((b * blocks_per_seq, block, 1, case.qk_head_dim), "bf16")
        table = torch.arange(b * blocks_per_seq, device=self.device, dtype=torch.int32).view(b, blocks_per_seq)
        seqlens = torch.full((b,), case.kv_len, device=self.device, dtype=torch.int32)
        metadata, splits = fm.get_mla_metadata(seqlens, s_q * case.num_heads // 1, 1)
        self._held += [table, seqlens, metadata, splits]
        dv = case.v_head_dim
        return (lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, dv, metadata, splits, causal=True)), \
            f"flash_mla.flash_mla_with_kvcache {getattr(fm, '__version__', 'unknown')}"


class CudaEventTimer:
    """Warm-up launches, then `repeats` runs each between two CUDA events; the median. Before each
    run of a memory-bound case a buffer twice the L2 size is written, so inputs come from HBM."""

    def __init__(self, torch: Any, l2_bytes: int, warmup: int = 5, repeats: int = 20,
                 min_warmup_seconds: float = 0.01) -> None:
        self.torch = torch
        self.warmup = warmup
        self.repeats = repeats
        self.min_warmup_seconds = min_warmup_seconds
        self._flush = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")
        self.description = (f"CUDA events around each run, median of {repeats} runs after >= {warmup} warm-up "
                            f"runs (and >= {min_warmup_seconds * 1e3:g} ms); a {2 * l2_bytes / 2**20:.0f} MiB "
                            f"buffer written before each run of memory-bound kernels (intensity < "
                            f"{MEMORY_BOUND_INTENSITY:g} FLOP/byte) to flush L2")

    def measure(self, case: BenchCase, launch: Callable[[], None]) -> float:
        torch = self.torch
        flush = is_memory_bound(case)
        began = time.perf_counter()
        runs = 0
        while runs < self.warmup or time.perf_counter() - began < self.min_warmup_seconds:
            launch()
            runs += 1
            if runs % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.repeats)]
        for start, end in events:
            if flush:
                self._flush.zero_()
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events) * 1e-3


# ---------------------------------------------------------------------------------------------
# Peak FLOP/s of the device (the `efficiency` column is relative to them)


def hardware_card_for(device_name: str) -> str | None:
    """The bundled hardware card matching a driver-reported device name, if any."""
    name = device_name.upper().replace(" ", "")
    for marker, card in (("H200", "h200"), ("H800", "h800"), ("H20", "h20"), ("H100", "h100-sxm")):
        if marker in name:
            if card == "h100-sxm" and "PCIE" in name:
                return None
            if card == "h20" and ("H200" in name):
                continue
            return card
    return None


def peaks_for(device_name: str, hardware: str | None, overrides: dict[str, float]) -> tuple[dict[str, float], str]:
    """Dense peak FLOP/s per dtype, and where they came from."""
    peaks: dict[str, float] = {}
    source = "command line"
    card_name = hardware or hardware_card_for(device_name)
    if card_name:
        from infersim.config import load_hardware_card

        card, card_source = load_hardware_card(card_name)
        peaks.update(card.peak.flops)
        source = f"hardware card {card_source}"
    peaks.update(overrides)
    if not peaks:
        raise InferSimError(f"no peak FLOP/s known for '{device_name}': give --hardware CARD or "
                            f"--peak-bf16/--peak-fp8 (dense FLOP/s)")
    if overrides and card_name:
        source += " with command-line overrides"
    return peaks, source


def cases_summary(cases: Iterable[BenchCase]) -> str:
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.family] = counts.get(case.family, 0) + 1
    return ", ".join(f"{n} {f}" for f, n in counts.items())
