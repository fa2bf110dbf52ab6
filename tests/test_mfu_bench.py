"""Measuring harness without a GPU or torch: the plan, a fake backend and timer writing real tables row
by row, the failures a real GPU run met (a str-subclass torch version, a kernel raising midway, a run
stopped before its end), the CUDA-event timing discipline and the PyTorch launches against fakes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from collections.abc import Callable
from unittest import mock

import pytest
import yaml
from conftest import REPO_ROOT

from infersim.cards.model import ModelCard
from infersim.base.errors import InferSimError
from infersim.shapes.kernels import GemmShape, GroupedGemmShape, elementwise_shape
from infersim.tabletools import bench as harness
from infersim.tabletools.bench import (
    AttentionCase,
    BenchOptions,
    CudaEventTimer,
    ElementwiseCase,
    Environment,
    GemmCase,
    GroupedGemmCase,
    HostCase,
    HostResult,
    NoGpuError,
    Prepared,
    TableWriter,
    TorchBackend,
    gemm_kn_from_card,
    plan_cases,
)
from infersim.tabletools.cli import bench_command, register
from infersim.tables.format import PROVENANCE_FILE, DeviceInfo, GemmRow
from infersim.tables.table_files import read_table_dir
from infersim.tables.lookup import load_tables

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


class TorchVersionLike(str):
    """As torch.torch_version.TorchVersion: a str subclass, which yaml.safe_dump refuses to represent.
    Its __str__ returns itself, so even str(x) keeps the subclass."""

    def __str__(self) -> str:
        return self


@pytest.fixture
def cards_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "tiny-dense.yaml").write_text(DENSE_CARD)
    (directory / "tiny-moe.yaml").write_text(MOE_CARD)
    return directory


class FakeBackend:
    """No device: launches do nothing. Its software versions are str subclasses, as torch's is."""

    def __init__(self, version: str = "2.11.0+cu130") -> None:
        self.prepared: list[object] = []
        self.released = 0
        self.version = TorchVersionLike(version)

    def environment(self) -> Environment:
        return Environment(DeviceInfo("Fake GPU 80GB", 100, {"sm_max_mhz": 1500.0}, 80e9, 50 * 2**20),
                           {"torch": self.version, "cuda": TorchVersionLike("13.0")})

    def prepare(self, case: harness.BenchCase) -> Prepared | str:
        if isinstance(case, ElementwiseCase) and case.op == "histc":
            return "no histc kernel here"
        self.prepared.append(case)
        return Prepared(lambda: None, f"fake {case.family} kernel", TorchVersionLike(f"torch {self.version}"))

    def release(self) -> None:
        self.released += 1

    def host_probe(self, case: HostCase) -> HostResult | str:
        if case.probe == "hf_decode_step":
            return HostResult({"hf_kernel": 12e-6, "hf_forward_step": 0.4e-3, "hf_generate_step": 1.1e-3},
                              [TorchVersionLike("fake HF probe")])
        return HostResult({case.probe: 4e-6})


class FakeTimer:
    """Deterministic latency: 5 us + FLOPs at 100 TFLOP/s + bytes at 1 TB/s."""

    description = "fake timer: 5 us + FLOPs / 1e14 FLOP/s + bytes / 1e12 B/s"

    def __init__(self) -> None:
        self.calls = 0

    def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
        launch()
        self.calls += 1
        shape = case.rows(1.0)[0].shape()
        return 5e-6 + shape.flops / 1e14 + shape.bytes / 1e12


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mfu", "bench", *argv])
    args.command_line = "infersim mfu bench " + " ".join(argv)
    return args


def card(text: str) -> ModelCard:
    return ModelCard(**yaml.safe_load(text))


# ---------------------------------------------------------------------------------------------
# Plan


def test_gemm_shapes_are_hf_projections_and_fused_ones() -> None:
    dense = card(DENSE_CARD)
    # q (32 x 128), k and v (8 x 128), fused QKV, o; gate and up (12288), fused gate+up, down; LM head
    assert gemm_kn_from_card(dense, 1) == [(4096, 4096), (4096, 1024), (4096, 6144), (4096, 4096), (4096, 12288),
                                           (4096, 24576), (12288, 4096), (4096, 151936)]
    # TP 8: 4 query heads, 1 KV head per rank; FFN width 1536; vocab split
    assert gemm_kn_from_card(dense, 8) == [(4096, 512), (4096, 128), (4096, 768), (512, 4096), (4096, 1536),
                                           (4096, 3072), (1536, 4096), (4096, 18992)]
    assert (2048, 128) in gemm_kn_from_card(card(MOE_CARD), 1)  # router gate


def test_plan_orders_a_coarse_pass_of_every_family_first(cards_dir: Path) -> None:
    cards = harness.load_cards(cards_dir)
    cases = plan_cases(cards, BenchOptions())
    families = ["host", "elementwise", "gemm", "attn_decode", "attn_prefill", "grouped_gemm"]

    def family(case: harness.BenchCase) -> str:
        return f"attn_{case.stage}" if isinstance(case, AttentionCase) else case.family

    first_of = {f: next(i for i, c in enumerate(cases) if family(c) == f) for f in families}
    # the families take turns from the start: a run cut after a few cases still covers each
    assert [f for f, _ in sorted(first_of.items(), key=lambda kv: kv[1])] == families
    assert max(first_of.values()) == len(families) - 1
    # the comparison grid (pass 2) comes last: the last case is an fp8 or bf16 grid GEMM
    assert isinstance(cases[-1], GemmCase) and cases[-1].k in harness.plan.GEMM_GRID
    # grouped GEMM: bf16, every token count, both projections, EP 1
    grouped = [c for c in cases if isinstance(c, GroupedGemmCase)]
    assert len(grouped) == 15 * 2 and {c.dtype for c in grouped} == {"bf16"}
    # attention in HF's layouts: the cards' 32-8-128 and 32-4-128, decode batch x kv grid; for decode also
    # 32-32-128, K and V repeated to every query head (the compiled static-cache path)
    decode = [c for c in cases if isinstance(c, AttentionCase) and c.stage == "decode"]
    assert {c.layout for c in decode} == {"32-8-128-128", "32-4-128-128", "32-32-128-128"}
    # less what cannot fit 24 GB: 32 repeated heads x 256 dims x 2 bytes at batch 256 x 8192 or 16384 tokens and
    # batch 128 x 16384 (34-69 GB of keys and values)
    assert len(decode) == 3 * 9 * 7 - 3
    prefill = [c for c in cases if isinstance(c, AttentionCase) and c.stage == "prefill"]
    assert {c.layout for c in prefill} == {"32-8-128-128", "32-4-128-128"}
    with pytest.raises(InferSimError, match="unknown kernel family 'softmax'"):
        plan_cases(cards, BenchOptions(kernels=("softmax",)))


def test_default_models_leave_out_the_held_out_ones() -> None:
    assert not {"llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b"} & set(harness.BENCH_MODELS)
    cards = harness.load_cards(REPO_ROOT / "models", harness.BENCH_MODELS)
    layouts = harness.attention_layouts(cards, (1,))
    # DeepSeek-V3 as HF runs it: MHA over decompressed keys (qk 192, v 128), no absorbed-latent kernel
    assert (128, 128, 192, 128) in layouts and (64, 8, 128, 128) in layouts and (32, 32, 128, 128) in layouts


# ---------------------------------------------------------------------------------------------
# Runs with a fake backend


def test_fake_run_writes_the_imported_layout_with_plain_values(cards_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fake-gpu"
    backend, timer = FakeBackend(), FakeTimer()
    args = bench_args("--out", str(out), "--models", str(cards_dir), "--quick", "--peak-bf16", "1e15",
                      "--peak-fp8", "2e15")
    assert bench_command(args, backend, timer) == 0
    text = (out / PROVENANCE_FILE).read_text()
    assert "2.11.0+cu130" in text and "!!python" not in text  # the str subclass went in as a plain string
    table_dir = read_table_dir(out)
    prov = table_dir.provenance
    assert prov.origin == "measured" and prov.device.name == "Fake GPU 80GB" and prov.complete
    assert type(prov.software["torch"]) is str and prov.software["torch"] == "2.11.0+cu130"
    assert sorted(table_dir.tables) == ["attention_decode.csv", "attention_prefill.csv", "elementwise.csv",
                                        "gemm_bf16.csv", "gemm_fp8.csv", "grouped_gemm_bf16.csv"]
    assert prov.tables["elementwise.csv"].family == "elementwise"
    assert prov.tables["gemm_fp8.csv"].library == "fake gemm kernel"
    assert prov.tables["gemm_fp8.csv"].library_version == "torch 2.11.0+cu130"
    # host costs: the HF probe's, which the simulator uses in place of the card's
    assert prov.launch_cpu == pytest.approx(12e-6) and prov.step_cpu == pytest.approx(1.5e-3)
    assert prov.host_probes["launch"] == pytest.approx(4e-6)
    assert "not measured (6 cases): no histc kernel here" in prov.notes
    # one grouped GEMM timing is a prefill and a decode row
    grouped = table_dir.tables["grouped_gemm_bf16.csv"]
    assert {r.stage for r in grouped} == {"prefill", "decode"} and len(grouped) % 2 == 0
    # the written latency is the fake timer's, and the lookup serves it back exactly
    row = next(r for r in table_dir.tables["gemm_bf16.csv"] if (r.m, r.k, r.n) == (1024, 4096, 6144))
    shape = GemmShape(1024, 4096, 6144, "bf16", "bf16")
    assert row.latency_us == pytest.approx((5e-6 + shape.flops / 1e14 + shape.bytes / 1e12) * 1e6, abs=1e-4)
    tables = load_tables(out)
    hit = tables.lookup(shape, 1e15)
    assert hit.method == "exact" and hit.seconds == pytest.approx(row.latency_us * 1e-6, rel=1e-12)
    grouped_hit = tables.lookup(GroupedGemmShape("decode", "up", 128, 1, 8, 2048, 768, 128.0, 128.0), 1e15)
    assert grouped_hit is not None and grouped_hit.method == "exact"
    # an elementwise kernel, by op, dtype and bytes
    cast = elementwise_shape("to_fp32", "bf16", 4 ** 6)
    assert tables.lookup(cast, 1.0).seconds == pytest.approx(5e-6 + cast.bytes / 1e12, abs=1e-10)  # us to 4 decimals
    progress = capsys.readouterr().err
    assert "infersim mfu bench: Fake GPU 80GB" in progress and "min on a Hopper GPU" in progress
    assert "skipped (no histc kernel here)" in progress


def test_torch_backend_environment_writes_a_str_subclass_version_as_a_plain_string(tmp_path: Path) -> None:
    """The failure that lost a real H100 run: torch.__version__ is a TorchVersion (a str subclass)."""
    fake_torch = types.SimpleNamespace(__version__=TorchVersionLike("2.11.0+cu130"),
                                       device=lambda name: types.SimpleNamespace(type=name))
    backend = TorchBackend(fake_torch, "cpu")
    env = backend.environment()
    writer = TableWriter(tmp_path, env.device, env.software, {"bf16": 1e12}, TorchVersionLike("cmd"), "2026-01-01",
                         [TorchVersionLike("a note")])
    writer.add("gemm_bf16.csv", "gemm", [GemmRow("bf16", 16, 64, 64, 3.0)], TorchVersionLike("F.linear"),
               fake_torch.__version__)
    writer.finish([TorchVersionLike("done")])
    data = yaml.safe_load((tmp_path / PROVENANCE_FILE).read_text())
    assert data["software"]["torch"] == "2.11.0+cu130" and data["tables"]["gemm_bf16.csv"]["library"] == "F.linear"
    assert read_table_dir(tmp_path).provenance.notes == ("a note", "done")


def test_a_kernel_raising_midway_is_noted_and_the_rest_kept(tmp_path: Path) -> None:
    class FlakyTimer(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            if getattr(case, "m", 0) == 32:
                raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")
            return super().measure(case, launch)

    cases = [GemmCase("bf16", m, 4096, 4096) for m in (16, 32, 64)]
    result = harness.run_bench(cases, FakeBackend(), FlakyTimer(), tmp_path, {"bf16": 1e15}, "cmd", progress=None)
    assert result.measured == 2
    assert result.failed == ["gemm bf16 m=32 k=4096 n=4096: RuntimeError: CUDA error: an illegal memory access was "
                             "encountered"]
    written = read_table_dir(tmp_path)
    assert [r.m for r in written.tables["gemm_bf16.csv"]] == [16, 64]
    assert ("kernel failed: gemm bf16 m=32 k=4096 n=4096: RuntimeError: CUDA error: an illegal memory access was "
            "encountered") in written.provenance.notes


def test_a_prepare_that_raises_is_noted_too(tmp_path: Path) -> None:
    class Raising(FakeBackend):
        def prepare(self, case: harness.BenchCase) -> Prepared | str:
            if getattr(case, "m", 0) == 16:
                raise MemoryError("host out of memory")
            return super().prepare(case)

    cases = [GemmCase("bf16", m, 64, 64) for m in (16, 32)]
    result = harness.run_bench(cases, Raising(), FakeTimer(), tmp_path, {"bf16": 1e15}, "cmd", progress=None)
    assert result.measured == 1 and result.failed[0].startswith("gemm bf16 m=16 k=64 n=64: MemoryError")


def test_rows_are_on_disk_as_they_are_measured(tmp_path: Path) -> None:
    """A run killed mid-way (SIGKILL: no `finally` runs) still leaves a loadable directory."""
    seen: list[int] = []

    class Watching(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            if case.m == 64:  # type: ignore[union-attr]
                # before the third kernel, the first two are already readable, the run marked unfinished
                partial = read_table_dir(tmp_path)
                seen.extend(r.m for r in partial.tables["gemm_bf16.csv"])
                assert not partial.provenance.complete
            return super().measure(case, launch)

    cases = [GemmCase("bf16", m, 4096, 4096) for m in (16, 32, 64)]
    harness.run_bench(cases, FakeBackend(), Watching(), tmp_path, {"bf16": 1e15}, "cmd", progress=None)
    assert seen == [16, 32]
    assert read_table_dir(tmp_path).provenance.complete


def test_an_interrupted_run_ends_writing_what_it_measured(tmp_path: Path) -> None:
    class Interrupted(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            if case.m == 64:  # type: ignore[union-attr]
                raise harness.runner.Stopped()  # what SIGTERM raises
            return super().measure(case, launch)

    cases = [GemmCase("bf16", m, 4096, 4096) for m in (16, 32, 64, 128)]
    result = harness.run_bench(cases, FakeBackend(), Interrupted(), tmp_path, {"bf16": 1e15}, "cmd", progress=None)
    assert result.stopped == "stopped by SIGTERM" and result.measured == 2
    written = read_table_dir(tmp_path)
    assert not written.provenance.complete
    assert "not measured (2 cases): not reached: stopped by SIGTERM" in written.provenance.notes


def test_the_time_budget_ends_the_run_with_every_family_covered(cards_dir: Path, tmp_path: Path) -> None:
    cards = harness.load_cards(cards_dir)
    cases = plan_cases(cards, BenchOptions())
    clock = [0.0]

    class Ticking(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            clock[0] += harness.estimated_seconds(case)
            return super().measure(case, launch)

    coarse = sum(harness.estimated_seconds(c) for c in cases[:len(cases) // 10])
    out = tmp_path / "tables"
    result = harness.run_bench(cases, FakeBackend(), Ticking(), out, {"bf16": 1e15, "fp8": 2e15}, "cmd",
                               progress=None, budget_seconds=coarse + 10.0, clock=lambda: clock[0])
    assert result.stopped.startswith("time budget of") and 0 < result.measured < len(cases)
    written = read_table_dir(out)
    assert written.provenance.complete  # a budget is a clean end
    assert {info.family for info in written.provenance.tables.values()} == {
        "gemm", "attention", "grouped_gemm", "elementwise"}
    assert {r.stage for r in written.tables["attention_prefill.csv"] + written.tables["attention_decode.csv"]} == {
        "prefill", "decode"}


def test_family_budgets_run_the_families_in_order_each_until_its_deadline(cards_dir: Path, tmp_path: Path) -> None:
    cards = harness.load_cards(cards_dir)
    order = ["gemm_bf16", "attn_decode", "host"]
    cases = plan_cases(cards, BenchOptions().smoke(), group_order=order)
    assert [harness.cases.budget_group(c) for c in cases] == sorted(
        (harness.cases.budget_group(c) for c in cases), key=order.index)
    clock = [0.0]

    class OneSecondEach(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            clock[0] += 1.0
            return super().measure(case, launch)

    # deadlines: 106 - 102.5 = 3.5 s, 106 - 100 = 6 s, 106 s; each case's estimate is well under half a second
    assert max(harness.estimated_seconds(c) for c in cases if not isinstance(c, HostCase)) < 0.5
    summary_path = tmp_path / "summary.json"
    result = harness.run_bench(cases, FakeBackend(), OneSecondEach(), tmp_path / "t", {"bf16": 1e15}, "cmd",
                               progress=None, clock=lambda: clock[0], summary_path=summary_path,
                               group_budgets=[("gemm_bf16", 3.5), ("attn_decode", 2.5), ("host", 100.0)])
    written = read_table_dir(tmp_path / "t")
    assert len(written.tables["gemm_bf16.csv"]) == 4  # started at 0, 1, 2 and 3 s: the fifth would end after 3.5
    assert len(written.tables["attention_decode.csv"]) == 2  # at 4 and 5 s
    assert written.provenance.host_probes and written.provenance.complete
    summary = json.loads(summary_path.read_text())
    parts = {p["name"]: p for p in summary["parts"]}
    assert [p["name"] for p in summary["parts"]] == order
    assert [(p["status"], p["done"], p["deadline_s"]) for p in summary["parts"]] == [
        ("cut", 4, 3.5), ("cut", 2, 6.0), ("complete", 6, 106.0)]
    gemm = parts["gemm_bf16"]
    assert gemm["not_done"] == [f"{gemm['planned'] - 4} cases: not reached: the gemm_bf16 budget ended 4 s after "
                                f"the start"]
    assert result.measured == 6 and not result.stopped


def test_missing_peak_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="no peak FLOP/s for fp8 on Fake GPU 80GB: give --peak-fp8"):
        harness.run_bench([GemmCase("fp8", 16, 64, 64)], FakeBackend(), FakeTimer(), tmp_path, {"bf16": 1e15}, "c",
                          progress=None)
    with pytest.raises(InferSimError, match="no peak FLOP/s known for 'Fake GPU 80GB'"):
        harness.peaks_for("Fake GPU 80GB", None, {})


def test_peaks_come_from_the_matching_hardware_card() -> None:
    peaks, source = harness.peaks_for("NVIDIA H100 80GB HBM3", None, {})
    assert peaks["bf16"] == 989.4e12 and peaks["fp8"] == 1978.9e12 and "h100-sxm" in source
    assert harness.hardware_card_for("NVIDIA H200") == "h200"
    assert harness.hardware_card_for("NVIDIA H20") == "h20"
    # the names the drivers report, as the cards list them
    assert harness.hardware_card_for("NVIDIA H100 PCIe") == "h100-pcie"
    assert harness.hardware_card_for("NVIDIA H100 NVL") == "h100-nvl"
    assert harness.hardware_card_for("NVIDIA GeForce RTX 4090") == "rtx-4090"
    assert harness.hardware_card_for("NVIDIA L4") == "l4"
    assert harness.hardware_card_for("AMD Instinct MI300X") == "mi300x"
    assert harness.hardware_card_for("Fake GPU 80GB") is None


def test_a_stray_csv_in_the_output_is_refused_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "mine.csv").write_text("a,b\n")

    class Untouchable(FakeTimer):
        def measure(self, case: harness.BenchCase, launch: Callable[[], None]) -> float:
            raise AssertionError("measured before the output was checked")

    with pytest.raises(InferSimError, match="is not empty and is not a kernel-table directory"):
        harness.run_bench([GemmCase("bf16", 16, 64, 64)], FakeBackend(), Untouchable(), tmp_path, {"bf16": 1e15}, "c",
                          progress=None)
    with pytest.raises(InferSimError, match="'mine.csv', a CSV InferSim did not write"):
        harness.run_bench([GemmCase("bf16", 16, 64, 64)], FakeBackend(), Untouchable(), tmp_path, {"bf16": 1e15}, "c",
                          progress=None, force=True)
    assert (tmp_path / "mine.csv").read_text() == "a,b\n"


def test_a_rerun_replaces_its_own_tables_only_with_force(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    harness.run_bench([GemmCase("bf16", 16, 64, 64)], FakeBackend(), FakeTimer(), out, {"bf16": 1e15}, "c",
                      progress=None)
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(InferSimError, match="already holds kernel tables.*--force"):
        harness.run_bench([GemmCase("bf16", 32, 64, 64)], FakeBackend(), FakeTimer(), out, {"bf16": 1e15}, "c",
                          progress=None)
    harness.run_bench([GemmCase("bf16", 32, 64, 64)], FakeBackend(), FakeTimer(), out, {"bf16": 1e15}, "c",
                      progress=None, force=True)
    assert [r.m for r in read_table_dir(out).tables["gemm_bf16.csv"]] == [32]
    assert (out / "notes.txt").read_text() == "mine\n"


# ---------------------------------------------------------------------------------------------
# Timing discipline, against a fake torch


class FakeEvent:
    def __init__(self, clock: list[float], enable_timing: bool = False) -> None:
        self.clock = clock
        self.at = 0.0

    def record(self) -> None:
        self.at = self.clock[0]

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch


def fake_torch(durations: list[float], log: list[str]) -> types.SimpleNamespace:
    clock = [0.0]
    flush = types.SimpleNamespace(zero_=lambda: log.append("flush"))
    cuda = types.SimpleNamespace(synchronize=lambda *a: log.append("sync"),
                                 Event=lambda enable_timing=False: FakeEvent(clock, enable_timing))
    torch = types.SimpleNamespace(cuda=cuda, int32="int32", empty=lambda *a, **k: flush)
    queue = iter(durations)

    def launch() -> None:
        log.append("launch")
        clock[0] += next(queue)

    torch.launch = launch
    return torch


def test_cuda_event_timer_flushes_memory_bound_kernels_and_takes_the_median() -> None:
    log: list[str] = []
    durations = [1.0] * 3 + [5e-6, 7e-6, 6e-6, 100e-6, 6.5e-6]  # 3 warm-up runs, then 5 timed (one outlier)
    torch = fake_torch(durations, log)
    timer = CudaEventTimer(torch, l2_bytes=50 * 2**20, warmup=3, repeats=5, min_warmup_seconds=0.0)
    decode_gemm = GemmCase("bf16", 16, 4096, 4096)  # intensity ~ 16 FLOP/byte: memory-bound
    assert harness.is_memory_bound(decode_gemm)
    assert timer.measure(decode_gemm, torch.launch) == pytest.approx(6.5e-6)
    assert log[:4] == ["launch", "launch", "launch", "sync"]
    assert log[4:] == ["flush", "launch"] * 5 + ["sync"]
    log.clear()
    # compute-bound: no flush; elementwise: memory-bound but L2 kept warm (an eager chain's input)
    for case in (GemmCase("bf16", 8192, 8192, 8192), ElementwiseCase("add", "bf16", 4 ** 10)):
        torch = fake_torch([1.0] * 3 + [1e-3] * 5, log)
        timer = CudaEventTimer(torch, l2_bytes=50 * 2**20, warmup=3, repeats=5, min_warmup_seconds=0.0)
        assert timer.measure(case, torch.launch) == pytest.approx(1e-3)
    assert "flush" not in log


# ---------------------------------------------------------------------------------------------
# The PyTorch backend's launches, against a mock torch (no GPU here: this checks the calls made)


def mock_torch() -> mock.MagicMock:
    torch = mock.MagicMock()
    torch.__version__ = TorchVersionLike("2.11.0")
    torch.cuda.get_device_capability.return_value = (9, 0)
    torch.cuda.mem_get_info.return_value = (80e9, 80e9)
    torch.cuda.OutOfMemoryError = type("OutOfMemoryError", (Exception,), {})
    torch.device.side_effect = lambda name: types.SimpleNamespace(type=name.split(":")[0])
    torch._fused_sdp_choice.return_value = 3

    class Backend(int):
        @property
        def name(self) -> str:
            return {1: "FLASH_ATTENTION", 2: "EFFICIENT_ATTENTION", 3: "CUDNN_ATTENTION"}[int(self)]

    torch.nn.attention.SDPBackend.__members__ = {n: Backend(i) for i, n in ((1, "FLASH_ATTENTION"),
                                                                             (2, "EFFICIENT_ATTENTION"),
                                                                             (3, "CUDNN_ATTENTION"))}
    return torch


def test_torch_backend_launches_what_hf_launches() -> None:
    torch = mock_torch()
    backend = TorchBackend(torch, "cuda")
    linear = torch.nn.functional.linear

    prepared = backend.prepare(GemmCase("bf16", 16, 4096, 1024))
    assert prepared.library == "F.linear (cuBLAS/cuBLASLt, as nn.Linear) bf16" and linear.call_count == 1
    prepared = backend.prepare(GemmCase("fp8", 16, 4096, 1024))
    assert "per-tensor" in prepared.library and torch._scaled_mm.call_count == 1  # the trial launch
    prepared.launch()
    assert torch._scaled_mm.call_count == 2
    assert backend.prepare(GemmCase("fp8", 8, 4096, 1024)) == "torch._scaled_mm needs M, K and N multiples of 16"

    case = GroupedGemmCase("bf16", "up", 128, 8, 8, 2048, 768, True, 20)
    assert case.rows_per_expert() == [10] * 16  # 20 tokens x top-8 over 16 local experts
    assert backend.prepare(case).library == "torch.nn.functional.grouped_mm bf16"
    del torch.nn.functional.grouped_mm
    torch._grouped_mm = None
    assert backend.prepare(case).startswith("torch 2.11.0 has no grouped GEMM")  # no per-expert loop instead

    prepared = backend.prepare(AttentionCase("mha", "prefill", "bf16", "bf16", 32, 8, 128, 128, 1, 1024, 1024))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert prepared.library.startswith("torch SDPA CUDNN_ATTENTION backend: cuDNN attention (picked by "
                                       "torch._fused_sdp_choice")
    assert sdpa.call_args.kwargs == {"is_causal": True, "enable_gqa": True}
    torch.nn.attention.sdpa_kernel.assert_called_with(torch.nn.attention.SDPBackend.__members__["CUDNN_ATTENTION"])
    backend.release()
    torch.nn.attention.sdpa_kernel.return_value.__exit__.assert_called()  # the pinned backend is undone
    backend.prepare(AttentionCase("mha", "decode", "bf16", "bf16", 32, 32, 128, 128, 4, 1, 1024))
    assert sdpa.call_args.kwargs == {"is_causal": False}  # one query sees every key; MHA: no enable_gqa
    sdpa.side_effect = RuntimeError("No available kernel. Aborting execution.")
    assert backend.prepare(AttentionCase("mha", "prefill", "bf16", "bf16", 16, 16, 192, 128, 1, 1024, 1024)) == \
        "the kernel refused these shapes: No available kernel. Aborting execution."

    prepared = backend.prepare(ElementwiseCase("cat", "bf16", 4 ** 8))
    assert prepared.library == "eager PyTorch ATen kernels" and torch.cat.call_count == 1


def test_every_elementwise_op_of_the_plan_has_a_launch() -> None:
    backend = TorchBackend(mock_torch(), "cuda")
    for op, dtype in harness.plan.ELEMENTWISE_KERNELS:
        assert isinstance(backend.prepare(ElementwiseCase(op, dtype, 4 ** 6)), Prepared), op


# ---------------------------------------------------------------------------------------------
# Without a GPU


def test_no_torch_or_no_cuda_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(NoGpuError, match="PyTorch, which is not installed here"):
        TorchBackend.create()
    no_cuda = types.SimpleNamespace(__version__="2.11.0+cpu", cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_cuda)
    with pytest.raises(NoGpuError, match="PyTorch 2.11.0\\+cpu sees none on this machine"):
        TorchBackend.create()


def test_bench_command_without_gpu_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "infersim.tabletools.cli", "bench", "--out", str(tmp_path / "x")],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infersim: error: mfu bench needs")
    assert not (tmp_path / "x").exists()


def test_host_costs_prefer_the_hf_probe() -> None:
    assert harness.host_costs({"launch": 4e-6})[:2] == (4e-6, None)
    launch, step, how = harness.host_costs({"launch": 4e-6, "hf_kernel": 11e-6, "hf_generate_step": 1e-3,
                                            "hf_forward_step": 2e-4})
    assert (launch, step) == (11e-6, pytest.approx(1.2e-3)) and "hf_kernel" in how
    assert harness.host_costs({}) == (None, None, "")
    # a probe spoiled by noise (a negative difference) is not a cost: the provenance must still load
    assert harness.host_costs({"launch": 4e-6, "hf_kernel": -1e-6})[:2] == (4e-6, None)
    assert harness.host_costs({"hf_kernel": 11e-6, "hf_generate_step": -1e-3})[:2] == (11e-6, None)



def test_a_measured_set_is_compared_with_aiconfigurator_in_every_family(tmp_path: Path) -> None:
    """Our files and columns are the imported tables': `mfu compare` pairs GEMM, attention and grouped
    GEMM rows of identical shape (grouped GEMM across file names: our balanced routing against their
    power-law one, which the comparison names)."""
    from infersim.tabletools.compare import compare_tables

    # shapes the thinned bundled tables keep (thinning drops rows interpolation reproduces)
    cases = [GemmCase("bf16", 16, 4096, 4096), GemmCase("fp8", 4096, 8192, 8192),
             AttentionCase("mha", "prefill", "bf16", "bf16", 32, 8, 128, 128, 1, 16384, 16384),
             AttentionCase("mha", "decode", "bf16", "bf16", 32, 8, 128, 128, 16, 1, 4096),
             GroupedGemmCase("bf16", "up", 8, 1, 2, 4096, 14336, True, 4),
             GroupedGemmCase("bf16", "down", 8, 1, 2, 4096, 14336, True, 4),
             ElementwiseCase("add", "bf16", 4 ** 8)]
    ours = tmp_path / "measured"
    harness.run_bench(cases, FakeBackend(), FakeTimer(), ours, {"bf16": 989.4e12, "fp8": 1978.9e12}, "cmd",
                      progress=None)
    theirs = REPO_ROOT / "mfu_tables" / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20"
    comparison = compare_tables(ours, theirs)
    matched = {f.name: f.matched_rows for f in comparison.files if f.matched_rows}
    assert matched == {"attention_decode.csv": 1, "attention_prefill.csv": 1, "gemm_bf16.csv": 1,
                       "gemm_fp8.csv": 1, "grouped_gemm_bf16.csv ~ grouped_gemm_bf16_power_law_1.2.csv": 4}
    grouped = next(f for f in comparison.files if f.family == "grouped_gemm")
    assert grouped.note.startswith("routing differs: A balanced, B power_law_1.2")
    assert "elementwise.csv" in comparison.only_in_a
