"""A sweep's and a frontier's cost and TTFT say what the main run says: $/Mtok is the decode step's
GPU-hours plus its energy at --usd-per-kwh x --pue (the GPU-hours alone, said so, on a card without
power facts), and the TTFT column and --target-ttft-ms read the single-request TTFT, not the
workload's prefill step when that packs several prompts (workload.prefill_tokens_per_gpu)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from infersim.cli.main import main
from infersim.run.simulate import simulate
from infersim.sweep.evaluate import SweepSpec, row_config
from infersim.sweep.grid import parse_grid
from infersim.sweep.runner import run_sweep
from infersim.sweep.variants import load_base

CONFIG = "qwen3-30b.yaml"  # four H20s; prefill_tokens_per_gpu 16384 packs four 4,096-token prompts per step
JOULES_PER_KWH = 3.6e6


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def main_run_json(*argv: str) -> dict:
    code, out, err = run("--config", CONFIG, "--format", "json", *argv)
    assert code == 0, err
    return json.loads(out)


def sweep_rows(tmp_path: Path, *argv: str, command: str = "sweep") -> tuple[str, list[dict]]:
    out = tmp_path / "rows.json"
    code, stdout, err = run(command, "--config", CONFIG, "--workers", "1", "--out", str(out), *argv)
    assert code == 0, err + stdout
    return stdout, json.loads(out.read_text())["rows"]


# ---------------------------------------------------------------------------------------------
# TTFT


def test_a_sweep_rows_ttft_is_the_main_runs_single_request_ttft(tmp_path: Path) -> None:
    main_run = main_run_json("--set", "workload.decode_batch_per_gpu=32")["prefill"]
    stdout, rows = sweep_rows(tmp_path, "--prefill", "--grid", "workload.decode_batch_per_gpu=32")
    (row,) = rows
    # one 4,096-token prompt alone (301 ms on TP1), not the step of four prompts together (1,083 ms)
    assert main_run["prompts_per_step"] == pytest.approx(4)
    assert row["ttft_ms"] == pytest.approx(main_run["single_request_ttft_ms"], rel=1e-9)
    assert row["prefill_step_ms"] == pytest.approx(main_run["step_time_ms"], rel=1e-9)
    assert row["prefill_tgs"] == pytest.approx(main_run["tgs"], rel=1e-9)
    assert row["prefill_step_ms"] > 3 * row["ttft_ms"]
    table = stdout.splitlines()
    ttft_column = table[0].split().index("TTFT")  # "TTFT ms" is two words in the header
    assert table[2].split()[ttft_column] == f"{main_run['single_request_ttft_ms']:,.1f}"


def test_a_ttft_target_tests_the_single_request_ttft(tmp_path: Path) -> None:
    # every layout's packed step (16,384 prompt tokens per GPU) takes about a second, one prompt alone
    # a few hundred ms: a 400 ms target is met by the single prompt and missed by the step
    _, rows = sweep_rows(tmp_path, "--gpus", "4", "--batch", "32", "--target-ttft-ms", "400", command="pareto")
    assert rows
    for row in rows:
        assert row["meets_targets"] and row["ttft_ms"] <= 400 < row["prefill_step_ms"]
    _, rows = sweep_rows(tmp_path, "--prefill", "--gpus", "4", "--batch", "32", "--target-ttft-ms", "400")
    simulated = [r for r in rows if r["status"] == "ok" and r["fits"]]
    assert simulated
    for row in simulated:
        assert row["meets_targets"] == (row["ttft_ms"] <= 400), row
        assert (row["why_not"] == "misses TTFT") == (row["ttft_ms"] > 400), row


def test_the_ttft_counts_the_api_server_time_as_the_main_run_does() -> None:
    base = load_base(CONFIG)
    engine = base.config.engine
    slow = dataclasses.replace(engine, overheads=dataclasses.replace(engine.overheads, api_server_latency=0.025))
    base = dataclasses.replace(base, config=dataclasses.replace(base.config, engine=slow))
    spec = SweepSpec(base, tuple(parse_grid(["workload.decode_batch_per_gpu=8,32", "deployment.ffn.ep=1,4"])),
                     prefill=True)
    rows = [r for r in run_sweep(spec, workers=1, progress=False).rows if r.ok]
    assert len(rows) == 4
    for row in rows:
        result = simulate(row_config(spec, row))
        assert result.config.engine.overheads.api_server_latency == 0.025
        assert row.ttft_s == pytest.approx(result.single_request_ttft_s, rel=1e-12)
        assert row.ttft_s == pytest.approx(result.single_prompt.step_time_s + 0.025, rel=1e-12)
        assert row.prefill_step_s == pytest.approx(result.prefill.step_time_s, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Cost


def test_the_cost_column_is_gpu_hours_plus_energy_with_a_legend(tmp_path: Path) -> None:
    stdout, rows = sweep_rows(tmp_path, "--grid", "workload.decode_batch_per_gpu=16,32", "--usd-per-kwh", "0.3",
                              "--pue", "1.5")
    assert "$/Mtok: USD per million output tokens of the decode step: GPU-hours at $1.18125/GPU-hour + energy " \
           "at $0.3/kWh x PUE 1.5" in stdout
    for row in rows:
        energy = row["joules_per_token"] * 1e6 / JOULES_PER_KWH * 0.3 * 1.5
        gpu_hours = 1.18125 / (3600 * row["tgs"]) * 1e6
        assert row["energy_cost_per_mtok_usd"] == pytest.approx(energy, rel=1e-9)
        assert row["cost_per_mtok_usd"] == pytest.approx(gpu_hours, rel=1e-9)
        assert row["cost_with_energy_per_mtok_usd"] == pytest.approx(gpu_hours + energy, rel=1e-9)
        assert row["total_cost_per_mtok_usd"] == pytest.approx(gpu_hours + energy, rel=1e-9)
        assert row["cost_includes_energy"] is True
        # the table's $/Mtok is the total, at three decimals
        line = next(s for s in stdout.splitlines() if s.split()[:1] == [str(row["batch_per_gpu"])])
        assert f"{gpu_hours + energy:.3f}" in line.split() and f"{gpu_hours:.3f}" not in line.split()


def test_the_decode_energy_is_the_main_runs(tmp_path: Path) -> None:
    energy = main_run_json("--set", "workload.decode_batch_per_gpu=32", "--usd-per-kwh", "0.2")["energy"]
    _, (row,) = sweep_rows(tmp_path, "--grid", "workload.decode_batch_per_gpu=32", "--usd-per-kwh", "0.2")
    assert row["joules_per_token"] == pytest.approx(energy["decode_joules_per_token"], rel=1e-9)
    assert row["energy_cost_per_mtok_usd"] == pytest.approx(
        energy["decode_joules_per_token"] * 1e6 / JOULES_PER_KWH * 0.2, rel=1e-9)


def test_a_card_without_power_facts_costs_gpu_hours_alone_said_so(tmp_path: Path) -> None:
    stdout, rows = sweep_rows(tmp_path, "--grid", "workload.decode_batch_per_gpu=16,32",
                              "--set", "hardware.power=null")
    assert "$/Mtok: USD per million output tokens of the decode step: GPU-hours at $1.18125/GPU-hour alone: " \
           "hardware card h20 has no power facts" in stdout
    for row in rows:
        assert row["cost_includes_energy"] is False and row["energy_cost_per_mtok_usd"] is None
        assert row["total_cost_per_mtok_usd"] == pytest.approx(row["cost_per_mtok_usd"], rel=1e-12)


@pytest.mark.parametrize("flag, low, high", [("--usd-per-kwh", "0.05", "0.5"), ("--pue", "1", "2")])
def test_the_electricity_price_moves_the_pareto_cost(tmp_path: Path, flag: str, low: str, high: str) -> None:
    costs = {}
    for value in (low, high):
        stdout, rows = sweep_rows(tmp_path, "--gpus", "4", "--batch", "8,64", flag, value, command="pareto")
        costs[value] = {(r["attention_tp"], r["ffn_ep"], r["batch_per_gpu"]): r for r in rows}
        answer = stdout.rstrip().splitlines()[-1]
        cheapest = min(rows, key=lambda r: r["total_cost_per_mtok_usd"])
        assert f"${cheapest['total_cost_per_mtok_usd']:.3f}/M output tokens" in answer
    assert costs[low].keys() == costs[high].keys() and costs[low]
    for key, cheap in costs[low].items():
        dear = costs[high][key]
        assert dear["cost_per_mtok_usd"] == pytest.approx(cheap["cost_per_mtok_usd"], rel=1e-12)  # GPU-hours
        # the energy scales with the price (or the PUE), and the total with it
        assert dear["energy_cost_per_mtok_usd"] == pytest.approx(
            cheap["energy_cost_per_mtok_usd"] * float(high) / float(low), rel=1e-9)
        assert dear["total_cost_per_mtok_usd"] - cheap["total_cost_per_mtok_usd"] == pytest.approx(
            dear["energy_cost_per_mtok_usd"] - cheap["energy_cost_per_mtok_usd"], rel=1e-9)
        assert dear["total_cost_per_mtok_usd"] > cheap["total_cost_per_mtok_usd"] + 1e-4


def test_sorting_by_cost_sorts_by_the_shown_cost(tmp_path: Path) -> None:
    out = tmp_path / "rows.csv"
    code, stdout, err = run("sweep", "--config", CONFIG, "--workers", "1", "--grid", "deployment.ffn.ep=1,4",
                            "--grid", "workload.decode_batch_per_gpu=8,16,32", "--sort", "cost", "--out", str(out))
    assert code == 0, err
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    shown = [line.split()[-4] for line in stdout.splitlines()[2:8]]  # $/Mtok, J/tok, bound, fits
    expected = sorted(float(r["total_cost_per_mtok_usd"]) for r in rows)
    assert [float(v) for v in shown] == [pytest.approx(round(v, 3)) for v in expected]
