"""`python -m infersim sweep` / `pareto` end to end: tables, CSV and JSON contents, clear errors."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infersim.cli.main import main
from infersim.run.config import load_run_config
from infersim.run.simulate import simulate

REPO = Path(__file__).resolve().parent.parent


def infersim(*args: str, check: int | None = 0, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m infersim ARGS` from `cwd`, run in this process: `python -m infersim` is
    `sys.exit(main())` (tests/test_core_cli.py runs the real process; Ctrl-C below does too)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as done:  # argparse's usage errors
                code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    finally:
        os.chdir(here)
    proc = subprocess.CompletedProcess(["python", "-m", "infersim", *args], code, out.getvalue(), err.getvalue())
    if check is not None:
        assert proc.returncode == check, proc.stderr + proc.stdout
    return proc


def test_sweep_csv_and_json_contents(tmp_path):
    out_csv, out_json = tmp_path / "r.csv", tmp_path / "r.json"
    args = ["sweep", "--config", "qwen3-30b.yaml", "--grid", "model.num_key_value_heads=2,4,3",
            "--grid", "deployment.ffn.ep=2,4", "--grid", "workload.decode_batch_per_gpu=16..64",
            "--target-tpot-ms", "30", "--workers", "1"]
    proc = infersim(*args, "--out", str(out_csv))
    infersim(*args, "--out", str(out_json))
    assert "best deployment per variant (targets: TPOT <= 30 ms)" in proc.stdout
    assert "rejected by the validator: 6 x num_key_value_heads: must divide num_attention_heads (32)" in proc.stdout
    assert "12 configurations simulated, 6 rejected by the validator" in proc.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 18
    assert list(rows[0])[:4] == ["model.num_key_value_heads", "deployment.ffn.ep", "workload.decode_batch_per_gpu",
                                 "status"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 12
    for r in ok[:4] + ok[-2:]:
        ref = simulate(load_run_config("qwen3-30b.yaml", [
            f"model.num_key_value_heads={r['model.num_key_value_heads']}", f"deployment.ffn.ep={r['deployment.ffn.ep']}",
            f"workload.decode_batch_per_gpu={r['workload.decode_batch_per_gpu']}"]))
        tpot_ms = ref.decode.step_time_s * 1e3
        assert float(r["tpot_ms"]) == pytest.approx(tpot_ms, rel=1e-9)
        assert float(r["tgs"]) == pytest.approx(ref.decode.tgs, rel=1e-9)
        assert float(r["cost_per_mtok_usd"]) == pytest.approx(1.18125 / (3600 * ref.decode.tgs) * 1e6, rel=1e-9)
        assert r["meets_targets"] == str(tpot_ms <= 30 and ref.memory.max_batch_per_gpu >= ref.decode.tokens_per_gpu)
        assert int(r["num_gpus"]) == 4 and int(r["attention_dp"]) == 4
    bad = [r for r in rows if r["status"] == "rejected"]
    assert {r["model.num_key_value_heads"] for r in bad} == {"3"} and all(r["tpot_ms"] == "" for r in bad)

    data = json.loads(out_json.read_text())
    assert data["grid"] == {"model.num_key_value_heads": [2, 4, 3], "deployment.ffn.ep": [2, 4],
                            "workload.decode_batch_per_gpu": [16, 32, 64]}
    assert data["targets"]["tpot_ms"] == 30 and data["simulated"] == 12 and data["rejected"] == 6
    assert not data["interrupted"] and data["finished_units"] == data["total_units"] == 18
    assert [float(r["tpot_ms"]) for r in ok] == pytest.approx([r["tpot_ms"] for r in data["rows"] if r["status"] == "ok"])
    best = {b["model.num_key_value_heads"]: b for b in data["best"]}
    feasible = [r for r in data["rows"] if r["meets_targets"] and r["model.num_key_value_heads"] == 2]
    assert best[2]["tgs"] == max(r["tgs"] for r in feasible)
    assert best[2]["binding"] in {"KV capacity", "latency target (TPOT)", "compute", "memory bandwidth",
                                  "communication", "overhead"}
    assert best[3]["binding"].startswith("rejected: num_key_value_heads")


def test_sweep_layout_search_and_targets_exit_status(tmp_path):
    proc = infersim("sweep", "--config", "qwen3-30b.yaml", "--gpus", "4,8", "--batch", "8..128",
                    "--target-tpot-ms", "1", "--max-pp", "1", check=1)
    assert "no configuration meets the targets (TPOT <= 1 ms)" in proc.stderr
    assert "none feasible:" in proc.stdout


def test_pareto_cli_json_and_frontier(tmp_path):
    out = tmp_path / "front.json"
    proc = infersim("pareto", "--config", "qwen3-30b.yaml", "--gpus", "1..16", "--batch", "1..256",
                    "--max-pp", "2", "--price-per-gpu-hour", "2", "--out", str(out), "--workers", "1")
    assert "Pareto frontier:" in proc.stdout and "tok/s/user" in proc.stdout
    data = json.loads(out.read_text())
    front = data["rows"]
    assert front and all(r["on_frontier"] for r in front)
    xs = [r["user_tokens_per_s"] for r in front]
    ys = [r["cost_per_mtok_usd"] for r in front]
    assert xs == sorted(xs, reverse=True) and ys == sorted(ys, reverse=True)
    for r in front:  # --price-per-gpu-hour 2 replaces the card's price
        assert r["price_per_gpu_hour"] == 2
        assert r["cost_per_mtok_usd"] == pytest.approx(2 * r["num_gpus"] / (3600 * r["total_tokens_per_s"]) * 1e6)
        assert r["user_tokens_per_s"] == pytest.approx(1000 / r["tpot_ms"])
    assert data["rejected"] > 0 and data["search"]["gpus"] == [1, 2, 4, 8, 16]


def test_pareto_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "f.png"
    infersim("pareto", "--config", "qwen3-30b.yaml", "--gpus", "4,8", "--batch", "4..64", "--max-pp", "1",
             "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["sweep", "--grid", "model.num_kv_heads=2"], "unknown field 'num_kv_heads' in 'model'; did you mean 'num_key_value_heads'?"),
    (["sweep", "--grid", "workload.decode_batch_per_gpu=64..16"], "ends (16) before it starts (64)"),
    (["sweep"], "nothing to sweep"),
    (["sweep", "--grid", "model.num_key_value_heads=3,5"], "no configuration could be simulated: 2 rejected by the validator"),
    (["sweep", "--grid", "deployment.ffn.ep=2", "--out", "r.xlsx"], "unknown format '.xlsx'"),
    (["sweep", "--grid", "deployment.ffn.ep=2", "--executor", "ray"], "expected processes, serial or dask://"),
    (["sweep", "--grid", "deployment.ffn.ep=2", "--batch", "1..8"], "--batch is for the layout search"),
    (["pareto", "--gpus", "4", "--grid", "deployment.ffn.ep=2,4"], "chosen by the layout search"),
    (["pareto", "--gpus", "0..4:2"], "--gpus 0..4:2: 0: must be at least 1"),
])
def test_clear_errors(args, message, tmp_path):
    proc = infersim(args[0], "--config", "qwen3-30b.yaml", *args[1:], check=2, cwd=tmp_path)
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("infersim: error:")


def test_empty_frontier_is_not_bad_input(tmp_path):
    """Nothing meets the targets: a valid question whose answer is 'nothing', exit status 1."""
    proc = infersim("pareto", "--config", "qwen3-30b.yaml", "--gpus", "4", "--target-tpot-ms", "0.5", "--max-pp", "1",
                    check=1, cwd=tmp_path)
    assert proc.stderr.strip().splitlines()[-1].startswith("infersim: empty Pareto frontier: no simulated")


def test_parquet_needs_pyarrow(tmp_path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        proc = infersim("sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=2",
                        "--out", str(tmp_path / "r.parquet"), check=2)
        assert "writing Parquet needs pyarrow" in proc.stderr
    else:
        infersim("sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=2",
                 "--out", str(tmp_path / "r.parquet"))
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "r.parquet").num_rows == 1


def test_dask_executor_cli(tmp_path):
    distributed = pytest.importorskip("distributed")
    out = tmp_path / "r.csv"
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None,
                                  protocol="tcp", host="127.0.0.1") as cluster:
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        proc = infersim("sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=1,2,4",
                        "--grid", "workload.decode_batch_per_gpu=1..64", "--executor", address, "--out", str(out))
    assert "on the given executor" in proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 21 and all(r["status"] == "ok" for r in rows)


def test_interrupt_writes_partial_results(tmp_path):
    """Ctrl-C (SIGINT) during a long sweep: exit 130, finished rows written, count reported."""
    import signal
    import time

    out = tmp_path / "partial.csv"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # a shell's background job inherits SIGINT ignored, and Python then never raises KeyboardInterrupt:
    # give the child the default disposition, as an interactive terminal would
    proc = subprocess.Popen(
        [sys.executable, "-m", "infersim", "sweep", "--config", "qwen3-30b.yaml", "--grid",
         "workload.decode_batch_per_gpu=1..100000:1", "--workers", "1", "--progress", "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # wait for the progress bar (drawn after half a second of work), then interrupt
        deadline = time.time() + 60
        seen = ""
        while time.time() < deadline and "units" not in seen:
            seen += os.read(proc.stderr.fileno(), 4096).decode()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = seen + stderr
    assert proc.returncode == 130, stderr
    assert "infersim: interrupted:" in stderr and "of 100,000 units finished" in stderr
    assert f"partial results written to {out}" in stderr
    rows = list(csv.DictReader(out.open()))
    assert 0 < len(rows) < 100_000
    assert [int(r["workload.decode_batch_per_gpu"]) for r in rows] == list(range(1, len(rows) + 1))


def test_sweep_of_a_speculative_config_matches_the_full_simulator():
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate
    from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep

    for rate in (0.5, 0.9):
        base = load_base("qwen3-8b-speculative.yaml", [f"speculative.acceptance_rate={rate}"])
        rows = run_sweep(SweepSpec(base, tuple(parse_grid(["workload.decode_batch_per_gpu=8,16"]))), workers=1).rows
        assert [r.batch for r in rows] == [8, 16] and all(r.ok for r in rows)
        for row in rows:
            ref = simulate(load_run_config("qwen3-8b-speculative.yaml", [f"workload.decode_batch_per_gpu={row.batch}",
                                                                         f"speculative.acceptance_rate={rate}"]))
            assert ref.speculative is not None
            assert row.tpot_s == pytest.approx(ref.decode.tpot_s, rel=1e-12)
            assert row.tgs == pytest.approx(ref.decode.tgs, rel=1e-12)
            assert row.max_batch == ref.memory.max_batch_per_gpu  # the drafter's weights and KV are counted


def test_speculative_fields_are_grid_axes_and_match_the_full_simulator():
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate
    from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep

    base = load_base("qwen3-8b-speculative.yaml")
    axes = parse_grid(["speculative.acceptance_rate=0.5,0.9", "speculative.lookahead=2,auto",
                       "speculative.draft_model=qwen3-0.6b,llama-3.1-8b"])
    rows = run_sweep(SweepSpec(base, tuple(axes)), workers=1).rows
    assert len(rows) == 8
    for row in rows:
        rate, lookahead, draft = SweepSpec(base, tuple(axes)).values(row.point)
        if draft == "llama-3.1-8b":  # another tokenizer: the variant is refused with the loader's message
            assert not row.ok and "vocabulary of 128256 tokens differs from the model's 151936" in row.status
            continue
        ref = simulate(load_run_config("qwen3-8b-speculative.yaml", [
            f"speculative.acceptance_rate={rate}", f"speculative.lookahead={lookahead}"]))
        assert row.ok and row.tpot_s == pytest.approx(ref.decode.tpot_s, rel=1e-12)
        assert row.max_batch == ref.memory.max_batch_per_gpu
    tpot = {SweepSpec(base, tuple(axes)).values(r.point)[:2]: r.tpot_s for r in rows if r.ok}
    assert tpot[(0.9, "auto")] < tpot[(0.9, 2)] and tpot[(0.9, "auto")] < tpot[(0.5, "auto")]


def test_speculative_axes_need_a_speculative_base():
    from infersim.base.errors import InferSimError
    from infersim.sweep import SweepSpec, load_base, parse_grid

    with pytest.raises(InferSimError, match="the base config has no speculative section to vary"):
        SweepSpec(load_base("qwen3-30b.yaml"), tuple(parse_grid(["speculative.acceptance_rate=0.5"])))
