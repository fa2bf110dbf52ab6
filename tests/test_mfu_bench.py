"""Measuring harness on CPU: plan from model cards, a fake backend and timer writing real tables and
provenance, the CUDA-event timing discipline against a fake torch, and the no-GPU message."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
from conftest import REPO_ROOT

from infersim.cards.model import ModelCard
from infersim.kernels import GemmShape, GroupedGemmShape
from infersim.mfu import bench as harness
from infersim.mfu.bench import (
    AttentionCase,
    BenchOptions,
    CudaEventTimer,
    Environment,
    GemmCase,
    GroupedGemmCase,
    NoGpuError,
    TorchBackend,
    gemm_kn_from_card,
    plan_cases,
)
from infersim.mfu.cli import bench_command, register
from infersim.mfu.format import DeviceInfo, read_table_dir
from infersim.mfu.lookup import load_tables

DENSE_CARD = """\
name: tiny-dense
hidden_size: 4096
num_hidden_layers: 2
num_attention_heads: 32
num_key_value_heads: 8
head_dim: 128
vocab_size: 151936
intermediate_size: 12288
"""

MOE_CARD = """\
name: tiny-moe
hidden_size: 2048
num_hidden_layers: 2
num_attention_heads: 32
num_key_value_heads: 4
head_dim: 128
vocab_size: 151936
num_experts: 128
num_experts_per_tok: 8
moe_intermediate_size: 768
"""


@pytest.fixture
def cards_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "tiny-dense.yaml").write_text(DENSE_CARD)
    (directory / "tiny-moe.yaml").write_text(MOE_CARD)
    return directory


class FakeBackend:
    """No device: launches do nothing; fp8 KV caches are 'unsupported', as on a torch-only machine."""

    def __init__(self) -> None:
        self.prepared: list[object] = []
        self.released = 0

    def environment(self) -> Environment:
        return Environment(DeviceInfo("Fake GPU 80GB", 100, {"sm_max_mhz": 1500.0}, 80e9, 50 * 2**20),
                           {"torch": "0.0-fake", "cuda": "none", "libraries": "fake 1.0"})

    def prepare(self, case: harness.BenchCase) -> tuple[Callable[[], None], str] | str:
        if isinstance(case, AttentionCase) and case.kv_dtype == "fp8":
            return "fp8 KV cache: no kernel for it here"
        self.prepared.append(case)
        return (lambda: None), f"fake {case.family} kernel"

    def release(self) -> None:
        self.released += 1


class FakeTimer:
    """Deterministic latency: 5 us launch + FLOPs at 100 TFLOP/s."""

    description = "fake timer: 5 us + FLOPs / 1e14 FLOP/s"

    def __init__(self) -> None:
        self.calls = 0

    def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
        launch()
        self.calls += 1
        return 5e-6 + case.row(1.0).shape().flops / 1e14


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mfu", "bench", *argv])
    args.command_line = "infersim mfu bench " + " ".join(argv)
    return args


def card(text: str) -> ModelCard:
    import yaml

    return ModelCard(**yaml.safe_load(text))


def test_gemm_shapes_follow_the_cards_at_each_tp() -> None:
    dense = card(DENSE_CARD)
    assert gemm_kn_from_card(dense, 1) == [(4096, 6144, False), (4096, 4096, False), (4096, 24576, False),
                                           (12288, 4096, False), (4096, 151936, True)]
    # TP 8: 4 query heads, 1 KV head per rank; FFN width 1536; vocab split
    assert gemm_kn_from_card(dense, 8) == [(4096, 768, False), (512, 4096, False), (4096, 3072, False),
                                           (1536, 4096, False), (4096, 18992, True)]
    moe = card(MOE_CARD)
    assert (2048, 128, True) in gemm_kn_from_card(moe, 1)  # router gate stays bf16


def test_plan_covers_every_family_and_drops_what_cannot_fit(cards_dir: Path) -> None:
    cards = harness.load_cards(cards_dir)
    options = BenchOptions(tp_sizes=(1,), m_values=(16, 256), ep_sizes=(1, 8), prefill_tokens_per_gpu=(1024,),
                           decode_tokens_per_gpu=(16,), prefill_seq_lens=(1024, 32768), decode_batches=(1, 512),
                           decode_kv_lens=(4096, 131072))
    cases = plan_cases(cards, options)
    gemm = [c for c in cases if isinstance(c, GemmCase)]
    # (K, N): dense 5 + moe (qkv, o, router, lm head) 4 = 9 pairs; bf16-only (router, 2 LM heads) skip fp8
    assert len(gemm) == (9 * 2 - 3) * 2
    grouped = [c for c in cases if isinstance(c, GroupedGemmCase)]
    assert len(grouped) == 2 * 2 * 2 * 2  # dtypes x ep x stages x projections
    assert GroupedGemmCase("fp8", "decode", "up", 128, 8, 8, 2048, 768, True, 16) in grouped
    decode = [c for c in cases if isinstance(c, AttentionCase) and c.stage == "decode"]
    # batch 512 x 131072 tokens of 8 KV heads (2 x 128 dims) is 275 GB of KV: not planned
    assert AttentionCase("mha", "decode", "bf16", "bf16", 32, 8, 128, 128, 512, 1, 131072) not in decode
    assert AttentionCase("mha", "decode", "bf16", "bf16", 32, 8, 128, 128, 512, 1, 4096) in decode
    with pytest.raises(harness.InferSimError, match="unknown kernel family 'softmax'"):
        plan_cases(cards, BenchOptions(kernels=("softmax",)))


def test_bundled_cards_give_deepseek_mla_layouts() -> None:
    cards = harness.load_cards(REPO_ROOT / "models", ["deepseek-v3"])
    layouts = harness.attention_layouts(cards, (1, 8))
    assert ("mla", "decode", 128, 1, 576, 512) in layouts
    assert ("mha", "prefill", 16, 16, 192, 128) in layouts


def test_fake_run_writes_tables_and_provenance(cards_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fake-gpu"
    backend, timer = FakeBackend(), FakeTimer()
    args = bench_args("--out", str(out), "--models", str(cards_dir), "--quick", "--tp", "1",
                      "--peak-bf16", "1e15", "--peak-fp8", "2e15")
    assert bench_command(args, backend, timer) == 0
    table_dir = read_table_dir(out)
    prov = table_dir.provenance
    assert prov.origin == "measured" and prov.device.name == "Fake GPU 80GB" and prov.device.sm_count == 100
    assert prov.peak_flops == {"bf16": 1e15, "fp8": 2e15}
    assert prov.command == f"infersim mfu bench --out {out} --models {cards_dir} --quick --tp 1 --peak-bf16 1e15 " \
                           f"--peak-fp8 2e15"
    assert prov.software["torch"] == "0.0-fake"
    assert "timing: fake timer: 5 us + FLOPs / 1e14 FLOP/s" in prov.notes
    fp8_kv_skipped = [n for n in prov.notes if "fp8 KV cache: no kernel for it here" in n]
    # 2 layouts x 4 batches x 3 KV lengths, less batch 512 x 65536 tokens (34-69 GB of KV: not planned)
    assert fp8_kv_skipped == ["not measured (22 cases): fp8 KV cache: no kernel for it here"]
    assert sorted(table_dir.tables) == [
        "attention_decode_mha_32-4-128-128.csv", "attention_decode_mha_32-8-128-128.csv",
        "attention_prefill_mha_32-4-128-128.csv", "attention_prefill_mha_32-8-128-128.csv",
        "gemm_bf16.csv", "gemm_fp8.csv", "grouped_gemm_decode_bf16.csv", "grouped_gemm_decode_fp8.csv",
        "grouped_gemm_prefill_bf16.csv", "grouped_gemm_prefill_fp8.csv"]
    assert prov.tables["gemm_fp8.csv"].library == "fake gemm kernel"
    assert timer.calls == sum(len(rows) for rows in table_dir.tables.values()) == 216
    assert backend.released == 238  # every prepared case is released, the skipped ones too
    # the written latency is the fake timer's: 5 us + 2*m*k*n / 1e14
    row = next(r for r in table_dir.tables["gemm_bf16.csv"] if (r.m, r.k, r.n) == (1024, 4096, 6144))
    assert row.latency_us == pytest.approx(5 + 2 * 1024 * 4096 * 6144 / 1e14 * 1e6, abs=1e-4)
    # and the lookup serves it back exactly
    tables = load_tables(out)
    hit = tables.lookup(GemmShape(1024, 4096, 6144, "bf16", "bf16"), 1e15)
    assert hit.method == "exact" and hit.seconds == pytest.approx(row.latency_us * 1e-6, rel=1e-12)
    grouped = tables.lookup(GroupedGemmShape("decode", "up", 128, 8, 8, 2048, 768, 128.0, 16.0,
                                             dtype="fp8", weight_dtype="fp8"), 2e15)
    assert grouped.seconds == pytest.approx(5e-6 + 2 * 128 * 8 * 2048 * 1536 / 1e14, rel=1e-6)
    progress = capsys.readouterr().err
    assert "infersim mfu bench: Fake GPU 80GB" in progress
    assert "] gemm bf16 m=1 k=2048 n=128: 5.01 us (efficiency 0.000) [fake gemm kernel]" in progress
    assert "skipped (fp8 KV cache: no kernel for it here)" in progress


def test_time_budget_stops_and_keeps_what_was_measured(tmp_path: Path) -> None:
    cases = [GemmCase("bf16", m, 4096, 4096) for m in (16, 32, 64, 128)]
    ticks = iter(range(100))
    result = harness.run_bench(cases, FakeBackend(), FakeTimer(), tmp_path / "t", {"bf16": 1e15}, "cmd",
                               progress=None, max_seconds=2.5, clock=lambda: float(next(ticks)))
    assert result.measured == 2
    assert result.skipped == {"time budget of 2.5 s spent": 2}
    written = read_table_dir(tmp_path / "t")
    assert [r.m for r in written.tables["gemm_bf16.csv"]] == [16, 32]
    assert "not measured (2 cases): time budget of 2.5 s spent" in written.provenance.notes


def test_a_kernel_failing_while_timed_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    class FlakyTimer(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            if case.m == 32:  # type: ignore[union-attr]
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().measure(case, launch)

    cases = [GemmCase("bf16", m, 4096, 4096) for m in (16, 32, 64)]
    result = harness.run_bench(cases, FakeBackend(), FlakyTimer(), tmp_path, {"bf16": 1e15}, "cmd", progress=None)
    assert result.measured == 2
    assert result.skipped == {"fake gemm kernel failed while timing (RuntimeError)": 1}
    assert [r.m for r in read_table_dir(tmp_path).tables["gemm_bf16.csv"]] == [16, 64]


def test_missing_peak_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(harness.InferSimError, match="no peak FLOP/s for fp8 on Fake GPU 80GB: give --peak-fp8"):
        harness.run_bench([GemmCase("fp8", 16, 64, 64)], FakeBackend(), FakeTimer(), tmp_path, {"bf16": 1e15}, "c",
                          progress=None)
    with pytest.raises(harness.InferSimError, match="no peak FLOP/s known for 'Fake GPU 80GB'"):
        harness.peaks_for("Fake GPU 80GB", None, {})


def test_peaks_come_from_the_matching_hardware_card() -> None:
    peaks, source = harness.peaks_for("NVIDIA H100 80GB HBM3", None, {})
    assert peaks["bf16"] == 989.4e12 and peaks["fp8"] == 1978.9e12 and "h100-sxm" in source
    assert harness.hardware_card_for("NVIDIA H200") == "h200"
    assert harness.hardware_card_for("NVIDIA H20") == "h20"
    assert harness.hardware_card_for("NVIDIA H100 PCIe") is None


# ---------------------------------------------------------------------------------------------
# Timing discipline, against a fake torch


class FakeEvent:
    def __init__(self, clock: list[float], enable_timing: bool = False) -> None:
        self.clock = clock
        self.at = 0.0

    def record(self) -> None:
        self.at = self.clock[0]

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch


def fake_torch(durations: list[float], log: list[str]) -> types.SimpleNamespace:
    clock = [0.0]
    flush = types.SimpleNamespace(zero_=lambda: log.append("flush"))
    cuda = types.SimpleNamespace(
        synchronize=lambda *a: log.append("sync"),
        Event=lambda enable_timing=False: FakeEvent(clock, enable_timing),
    )
    torch = types.SimpleNamespace(cuda=cuda, int32="int32", empty=lambda *a, **k: flush)
    queue = iter(durations)

    def launch() -> None:
        log.append("launch")
        clock[0] += next(queue)

    torch.launch = launch
    return torch


def test_cuda_event_timer_warms_up_flushes_memory_bound_kernels_and_takes_the_median() -> None:
    log: list[str] = []
    durations = [1.0] * 3 + [5e-6, 7e-6, 6e-6, 100e-6, 6.5e-6]  # 3 warm-up runs, then 5 timed (one outlier)
    torch = fake_torch(durations, log)
    timer = CudaEventTimer(torch, l2_bytes=50 * 2**20, warmup=3, repeats=5, min_warmup_seconds=0.0)
    decode_gemm = GemmCase("bf16", 16, 4096, 4096)  # intensity ~ 16 FLOP/byte: memory-bound
    assert harness.is_memory_bound(decode_gemm)
    seconds = timer.measure(decode_gemm, torch.launch)
    assert seconds == pytest.approx(6.5e-6)
    assert log[:4] == ["launch", "launch", "launch", "sync"]
    assert log[4:] == ["flush", "launch"] * 5 + ["sync"]
    log.clear()
    torch = fake_torch([1.0] * 3 + [1e-3] * 5, log)
    timer = CudaEventTimer(torch, l2_bytes=50 * 2**20, warmup=3, repeats=5, min_warmup_seconds=0.0)
    big = GemmCase("bf16", 8192, 8192, 8192)
    assert not harness.is_memory_bound(big)
    assert timer.measure(big, torch.launch) == pytest.approx(1e-3)
    assert "flush" not in log


# ---------------------------------------------------------------------------------------------
# The PyTorch backend's launches, against a mock torch (no GPU here: this checks the calls made)


def mock_torch() -> mock.MagicMock:
    torch = mock.MagicMock()
    torch.__version__ = "2.11.0"
    torch.cuda.get_device_capability.return_value = (9, 0)
    torch.cuda.mem_get_info.return_value = (80e9, 80e9)
    torch.cuda.OutOfMemoryError = type("OutOfMemoryError", (Exception,), {})
    props = torch.cuda.get_device_properties.return_value
    props.name, props.multi_processor_count, props.total_memory, props.L2_cache_size = "NVIDIA H100", 132, 85e9, 52428800
    return torch


def test_torch_backend_launches_the_intended_kernels() -> None:
    torch = mock_torch()
    backend = TorchBackend(torch)
    backend.flash_attn = backend.flash_mla = None
    assert backend.environment().device == DeviceInfo("NVIDIA H100", 132, {}, 85e9, 52428800.0)

    launch, library = backend.prepare(GemmCase("bf16", 16, 4096, 1024))
    assert library == "torch.mm (cuBLAS) bf16" and torch.mm.call_args.kwargs["out"] is not None
    launch, library = backend.prepare(GemmCase("fp8", 16, 4096, 1024))
    assert library.startswith("torch._scaled_mm") and torch._scaled_mm.call_count == 1  # the trial launch
    launch()
    assert torch._scaled_mm.call_count == 2
    assert backend.prepare(GemmCase("fp8", 8, 4096, 1024)) == "torch._scaled_mm needs M, K and N multiples of 16"

    case = GroupedGemmCase("bf16", "decode", "up", 128, 8, 8, 2048, 768, True, 20)
    assert case.rows_per_expert() == [10] * 16  # 20 tokens x top-8 over 16 local experts
    assert backend.prepare(case)[1] == "torch._grouped_mm bf16"
    torch._grouped_mm.side_effect = RuntimeError("offsets must be multiples of 16")
    launch, library = backend.prepare(case)
    assert library.startswith("torch.mm per expert")

    _, library = backend.prepare(AttentionCase("mha", "prefill", "bf16", "bf16", 32, 8, 128, 128, 1, 1024, 1024))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert library.startswith("torch.nn.functional.scaled_dot_product_attention")
    assert sdpa.call_args.kwargs == {"is_causal": True, "enable_gqa": True}
    backend.prepare(AttentionCase("mha", "decode", "bf16", "bf16", 32, 32, 128, 128, 4, 1, 1024))
    assert sdpa.call_args.kwargs == {"is_causal": False, "enable_gqa": False}  # one query sees every key
    assert backend.prepare(AttentionCase("mha", "decode", "bf16", "fp8", 32, 8, 128, 128, 4, 1, 1024)).startswith(
        "fp8 KV cache")
    assert backend.prepare(AttentionCase("mla", "decode", "bf16", "bf16", 128, 1, 576, 512, 4, 1, 1024)) == \
        "MLA decode: FlashMLA (flash_mla) is not installed"

    sdpa.side_effect = RuntimeError("No available kernel. Aborting execution.")
    assert backend.prepare(AttentionCase("mha", "prefill", "bf16", "bf16", 16, 16, 192, 128, 1, 1024, 1024)) == \
        "the kernel refused these shapes: No available kernel. Aborting execution."


# ---------------------------------------------------------------------------------------------
# Without a GPU


def test_no_torch_or_no_cuda_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(NoGpuError, match="PyTorch is not installed here"):
        TorchBackend.create()
    no_cuda = types.SimpleNamespace(__version__="2.11.0+cpu", cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_cuda)
    with pytest.raises(NoGpuError, match="PyTorch 2.11.0\\+cpu sees none on this machine"):
        TorchBackend.create()


def test_bench_command_without_gpu_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    # the mfu subcommands' own entry point (the core CLI `python -m infersim mfu bench` registers the same)
    done = subprocess.run([sys.executable, "-m", "infersim.mfu.cli", "bench", "--out", str(tmp_path / "x")],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infersim: error: mfu bench needs a CUDA GPU")
    assert not (tmp_path / "x").exists()
