"""The one-command GPU run (benchmarks/gpu/run_all.py) without a GPU: its budgets and deadlines, its plan
against the held-out models, the orchestration over stand-in tools (fake_tools.py: no torch needed) with a
stage cut, skipped and killed, the files it leaves in $OUT, install_results.py on them, and the same
pipeline on the CPU with the real tools where torch and transformers are installed."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from infersim.tabletools.bench.budget import PartRecord, fit_budgets, part_deadlines, part_status
from infersim.tabletools.bench.plan import BENCH_MODELS
from infersim.tables.table_files import read_table_dir
from infersim.validate.measured import load_measured

GPU = REPO_ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import gpu_plan  # noqa: E402
import record_traces  # noqa: E402
import run_all  # noqa: E402

#: the device tool returns at most 8 files from $OUT
MAX_FILES = 8


def run_pipeline(out: Path, *options: str, timeout: float = 240) -> dict:
    done = subprocess.run([sys.executable, str(GPU / "run_all.py"), "all", "--out", str(out / "out"), "--work",
                           str(out / "work"), *options], capture_output=True, text=True, timeout=timeout)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads((out / "out" / "manifest.json").read_text())


def stage(manifest: dict, name: str) -> dict:
    return next(s for s in manifest["stages"] if s["name"] == name)


def members(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return set(tar.getnames())


# ---------------------------------------------------------------------------------------------
# Budgets


def test_budgets_that_do_not_fit_shorten_the_last_parts_first() -> None:
    wanted = [("a", 10.0), ("b", 20.0), ("c", 30.0)]
    assert fit_budgets(wanted, 50.0) == [("a", 10.0), ("b", 20.0), ("c", 20.0)]
    assert fit_budgets(wanted, 25.0) == [("a", 10.0), ("b", 15.0), ("c", 0.0)]
    # each part ends when every later part still has its whole (fitted) budget
    assert part_deadlines(wanted, 50.0) == {"a": 10.0, "b": 30.0, "c": 50.0}
    assert part_deadlines(wanted, 25.0) == {"a": 10.0, "b": 25.0, "c": 25.0}
    # time beyond the budgets goes to the first part (the most valuable); the last still ends at the total
    assert part_deadlines(wanted, 100.0) == {"a": 50.0, "b": 70.0, "c": 100.0}


def test_a_part_says_what_became_of_it() -> None:
    def part(done: int, *not_done: str) -> PartRecord:
        return PartRecord("p", 3, 1.0, done=done, not_done=list(not_done))

    assert part_status(part(3)) == "complete"
    assert part_status(part(2, "x: skipped: estimated 9 s, 1 s left")) == "cut"
    assert part_status(part(0, "x: skipped: no time", "y: skipped: no time")) == "skipped"
    assert part_status(part(2, "x: failed: OutOfMemoryError")) == "partial"
    assert part_status(part(0, "x: failed: OutOfMemoryError")) == "failed"


def test_the_default_run_fits_eight_minutes_by_its_own_estimates() -> None:
    plans = run_all.plan_stages(run_all.STAGES, run_all.DEFAULT_BUDGET, smoke=False)
    assert [p.name for p in plans] == list(run_all.STAGES)
    assert run_all.DEFAULT_BUDGET + run_all.TERM_BEFORE < 8 * 60
    assert plans[-1].deadline_s == run_all.DEFAULT_BUDGET
    assert [p.deadline_s for p in plans] == sorted(p.deadline_s for p in plans)
    for plan in plans:  # every stage's and every part's budget covers its estimate: nothing is skipped by plan
        assert plan.budget_s >= plan.estimate_s, plan
        estimates = dict(plan.parts)
        assert all(seconds >= estimates[part] for part, seconds in run_all.part_budgets(plan)), plan
    tables = plans[0]
    assert [family for family, _seconds in tables.parts] == list(run_all.BUDGET_GROUPS)
    shares = dict(part.split("=") for part in run_all.family_budgets(tables, 100.0).split(","))
    assert sum(float(v) for v in shares.values()) == pytest.approx(100.0, abs=0.5)


def test_the_bench_reserve_is_the_one_run_bench_keeps() -> None:
    import inspect

    from infersim.tabletools.bench.runner import run_bench

    assert inspect.signature(run_bench).parameters["reserve_seconds"].default == run_all.BENCH_RESERVE


def test_a_point_estimate_is_the_larger_of_host_and_gpu_time() -> None:
    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "intermediate_size": 11008, "vocab_size": 32000, "num_hidden_layers": 2}
    # host: (2 layers x 42 + 22) kernels x 24 us + 1 ms of generate(); the GPU needs 0.43 ms (1.07 GB of weights)
    host = (2 * 42 + 22) * 24e-6 + 1e-3
    assert gpu_plan.point_seconds(config, "eager", "ttft_ms", 1, 128) == pytest.approx(4 * host)
    # 8 x 4096 tokens: 2 x 32768 x 404.8 M FLOP of weights + 2 x 32768 x 2048 x 8192 of attention, at 5e14
    params = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    flops = 2 * 32768 * params + 2 * 32768 * 2048 * 2 * 32 * 128 * 2 + 2 * 8 * 4096 * 32000
    assert gpu_plan.point_seconds(config, "eager", "ttft_ms", 8, 4096) == pytest.approx(4 * flops / 5e14)


def test_nothing_measured_end_to_end_is_a_held_out_model() -> None:
    held_out = set(gpu_plan.HELD_OUT_MODELS)
    measured = {p.name for p in gpu_plan.FULL_PLAN + gpu_plan.ONE_RUN_PLAN} | set(record_traces.MODELS) | {
        run_all.TRACE_MODEL} | set(BENCH_MODELS) | {p.stem for p in gpu_plan.CONFIGS.glob("*.json")}
    assert measured and not measured & held_out
    assert {"llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b"} == held_out


# ---------------------------------------------------------------------------------------------
# The pipeline over stand-in tools (no torch)


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    where = tmp_path_factory.mktemp("fake-run")
    return where, run_pipeline(where, "--fake")


def test_a_fake_run_writes_five_files_with_every_stage(fake_run: tuple[Path, dict]) -> None:
    where, manifest = fake_run
    files = sorted(p.name for p in (where / "out").iterdir())
    assert files == ["e2e-fake.tar.gz", "manifest.json", "run.log", "tables-fake.tar.gz", "traces-fake.tar.gz"]
    assert len(files) <= MAX_FILES
    assert manifest["format"] == run_all.MANIFEST_FORMAT and manifest["fake"] and manifest["card"] == "fake"
    assert [(s["name"], s["status"]) for s in manifest["stages"]] == [
        ("tables", "complete"), ("e2e-eager", "complete"), ("e2e-compiled", "complete"), ("traces", "complete")]
    tables = stage(manifest, "tables")
    assert [p["name"] for p in tables["parts"]] == [f for f, _s in run_all.table_parts(smoke=True)]
    assert all(p["done"] == p["planned"] > 0 for p in tables["parts"])
    eager = stage(manifest, "e2e-eager")
    assert [p["name"] for p in eager["parts"]] == [p.name for p in gpu_plan.ONE_RUN_PLAN]
    assert all(s["estimate_s"] > 0 and s["budget_s"] > 0 and s["seconds"] >= 0 for s in manifest["stages"])
    assert {"fake/provenance.yaml", "fake/gemm_bf16.csv", "bench.log", "summary.json"} <= members(
        where / "out" / "tables-fake.tar.gz")
    assert {"e2e-fake-eager.yaml", "e2e-fake-compiled.yaml", "summary-eager.json", "summary-compiled.json",
            "e2e-eager.log"} <= members(where / "out" / "e2e-fake.tar.gz")
    assert {"llama-2-7b-2l-eager-fake-p1x128-d2.json.gz", "llama-2-7b-2l-compiled-fake-p1x128-d2.json.gz",
            "llama-2-7b-2l-p1x128-d2.run.yaml", "llama-2-7b-2l.config.json", "recorded.json"} <= members(
        where / "out" / "traces-fake.tar.gz")
    log = (where / "out" / "run.log").read_text()
    assert "stage / part" in log and "e2e-compiled" in log


def test_a_stage_past_its_deadline_is_stopped_and_the_later_ones_skipped_in_order(tmp_path: Path) -> None:
    manifest = run_pipeline(tmp_path, "--fake", "--budget", "9", "--stages", "e2e-eager,e2e-compiled,traces",
                            "--stage-budgets", "e2e-eager=9,e2e-compiled=3,traces=3", "--fake-options", "--hang e2e")
    eager, compiled, traces = (stage(manifest, name) for name in ("e2e-eager", "e2e-compiled", "traces"))
    assert eager["status"] == "killed" and eager["signals"][0].startswith("SIGTERM")
    assert compiled["status"] == traces["status"] == "skipped"
    assert compiled["why"].startswith("not started:") and "after the earlier stages': 0 s" in compiled["why"]
    assert [p["status"] for p in eager["parts"]] == ["complete"] + ["not started"] * 4
    # the points measured before the deadline are kept, each written as it was measured
    with tarfile.open(tmp_path / "out" / "e2e-fake.tar.gz") as tar:
        tar.extractall(tmp_path / "e2e", filter="data")
    kept = load_measured([tmp_path / "e2e" / "e2e-fake-eager.yaml"])
    assert [n.id for n in kept.not_expressed] == [
        f"fake-llama-3.1-70b-eager-{metric}-b{b}-p{p}" for metric, b, p in
        gpu_plan.smoke_plan(gpu_plan.ONE_RUN_PLAN[0]).points("eager")]
    assert not (tmp_path / "out" / "traces-fake.tar.gz").exists()


def test_a_tool_that_ignores_sigterm_is_killed_and_its_first_trace_kept(tmp_path: Path) -> None:
    manifest = run_pipeline(tmp_path, "--fake", "--budget", "8", "--stages", "traces",
                            "--fake-options", "--hang traces --ignore-term")
    traces = stage(manifest, "traces")
    assert traces["status"] == "killed"
    assert [s.split()[0] for s in traces["signals"]] == ["SIGTERM", "SIGKILL"]
    assert [(p["name"], p["status"]) for p in traces["parts"]] == [
        ("llama-2-7b eager main", "complete"), ("llama-2-7b compiled main", "not started")]
    assert "llama-2-7b-2l-eager-fake-p1x128-d2.json.gz" in members(tmp_path / "out" / "traces-fake.tar.gz")


# ---------------------------------------------------------------------------------------------
# Installing what a run wrote


def install(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GPU / "install_results.py"), *argv], capture_output=True, text=True,
                          timeout=120)


def test_install_places_tables_points_traces_and_the_record(fake_run: tuple[Path, dict], tmp_path: Path) -> None:
    out = fake_run[0] / "out"
    refused = install(str(out), "--root", str(tmp_path))
    assert refused.returncode != 0 and "a smoke or fake run, not a measurement" in refused.stderr
    assert not (tmp_path / "mfu_tables").exists()

    done = install(str(out), "--root", str(tmp_path), "--allow-smoke")
    assert done.returncode == 0, done.stderr
    tables = read_table_dir(tmp_path / "mfu_tables" / "measured" / "fake" / "torch-0")
    assert tables.provenance.device.name == "fake GPU (orchestration test: nothing is measured)"
    assert tables.provenance.complete and "gemm_bf16.csv" in tables.tables
    points = load_measured(sorted((tmp_path / "infersim" / "validate" / "measured").glob("*.yaml")))
    assert [Path(f).name for f in points.files] == ["e2e-fake-compiled.yaml", "e2e-fake-eager.yaml"]
    assert not points.reference and len(points.not_expressed) == sum(  # the stand-in writes the smoke plan's
        len(gpu_plan.smoke_plan(p).points(mode)) for p in gpu_plan.ONE_RUN_PLAN for mode in ("eager", "compiled"))
    assert {n.reason for n in points.not_expressed} == {
        "smoke run on a CPU: proves benchmarks/gpu/measure_e2e.py, measures no GPU"}
    traces = sorted(p.name for p in (tmp_path / "tests" / "data" / "traces" / "fake").iterdir())
    assert traces == ["llama-2-7b-2l-compiled-fake-p1x128-d2.json.gz", "llama-2-7b-2l-eager-fake-p1x128-d2.json.gz",
                      "llama-2-7b-2l-p1x128-d2.run.yaml", "llama-2-7b-2l.config.json"]
    record = tmp_path / "benchmarks" / "gpu" / "results" / "fake"
    assert (record / "manifest.json").is_file() and (record / "tables-fake" / "bench.log").is_file()
    assert "python -m infersim validate --measured infersim/validate/measured/e2e-fake-eager.yaml" in done.stdout
    assert ("python -m infersim compare --trace tests/data/traces/fake/llama-2-7b-2l-compiled-fake-p1x128-d2.json.gz "
            "--config tests/data/traces/fake/llama-2-7b-2l-p1x128-d2.run.yaml --set engine=huggingface-compiled"
            in done.stdout)

    again = install(str(out), "--root", str(tmp_path), "--allow-smoke")
    assert again.returncode != 0 and "exists: pass --force" in again.stderr
    assert install(str(out), "--root", str(tmp_path), "--allow-smoke", "--force").returncode == 0


# ---------------------------------------------------------------------------------------------
# The real tools on the CPU


def test_the_smoke_run_goes_through_the_real_tools_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the smoke run needs PyTorch (not a dependency of InferSim: CI has none)")
    pytest.importorskip("transformers", reason="the smoke run needs transformers (not a dependency of InferSim)")
    manifest = run_pipeline(tmp_path, "--smoke", timeout=600)
    assert manifest["smoke"] and manifest["card"] == "cpu-smoke"
    assert [s["name"] for s in manifest["stages"]] == list(run_all.STAGES)
    for record in manifest["stages"]:  # a loaded CPU may cut any of them; each says what it did
        assert record["status"] in ("complete", "cut", "partial", "killed", "skipped"), record
        assert record["status"] in ("skipped", "killed", "failed") or record["parts"], record
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"manifest.json", "run.log", "tables-cpu-smoke.tar.gz"} <= files and len(files) <= MAX_FILES
    done = install(str(tmp_path / "out"), "--root", str(tmp_path / "repo"), "--allow-smoke")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "repo" / "mfu_tables" / "measured" / "cpu-smoke").is_dir()
