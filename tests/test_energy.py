"""Energy (docs/energy.md): a step's joules from its operations' times at the draw of their bound,
a run's J per token and per request, serving's idle energy under a light load, sweep and pareto
columns, power facts on every card, and the validate energy source."""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import REPO_ROOT
from infersim.base.errors import ConfigError
from infersim.cards.power import JOULES_PER_KWH, Electricity, Power, validate_power
from infersim.cli.main import main
from infersim.engine.energy import seconds_by_kind, stage_energy, step_energy, step_joules, step_joules_by_bound
from infersim.engine.stage import OperationResult, StageResult
from infersim.run.config import load_hardware_card
from infersim.run.energy import EnergyUnavailable, RunEnergy, run_energy
from infersim.shapes.kernels import Bound, Source

POWER = Power(board=700.0, idle=100.0, compute_bound=650.0, memory_bound=500.0, communication_bound=300.0)


def _op(seconds: float, bound: Bound) -> OperationResult:
    return OperationResult("op", "m", 1, seconds, seconds, 0.0, 0.0, bound, Source.CARD)


def _stage(ops: list[tuple[float, Bound]], step_s: float | None = None, saved: float = 0.0) -> StageResult:
    operations = tuple(_op(t, b) for t, b in ops)
    step = sum(t for t, _ in ops) - saved if step_s is None else step_s
    return StageResult("decode", step, 8, 1, 2 if saved else 1, saved, 1.0, operations)


def test_a_sequential_step_costs_each_operations_time_at_its_bounds_draw():
    # 2 ms compute at 650 W, 5 ms memory at 500 W, 1 ms all-reduce at 300 W, 0.5 ms host overhead at idle 100 W
    stage = _stage([(2e-3, Bound.COMPUTE), (5e-3, Bound.MEMORY), (1e-3, Bound.COMM), (0.5e-3, Bound.OVERHEAD)])
    energy = stage_energy(stage, POWER)
    assert energy.joules == pytest.approx(2e-3 * 650 + 5e-3 * 500 + 1e-3 * 300 + 0.5e-3 * 100)  # 4.15 J
    assert energy.joules == pytest.approx(4.15)
    assert energy.seconds == pytest.approx(8.5e-3)
    assert energy.watts == pytest.approx(4.15 / 8.5e-3)
    assert energy.seconds_by_kind == pytest.approx({"compute": 2e-3, "memory": 5e-3, "communication": 1e-3,
                                                    "idle": 0.5e-3})
    assert not energy.capped


@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.sampled_from(list(Bound))), max_size=8),
       st.floats(0.0, 2.0))
def test_joules_by_bound_are_the_joules_of_the_stages_kinds_to_the_last_bit(ops, step_s):
    """The sweep's and the serving step's joules (from seconds per bound) equal the main run's (from
    the operations' kinds): the same sums in the same order, so the same number exactly."""
    by_bound: dict[Bound, float] = {}
    for seconds, bound in ops:
        by_bound[bound] = by_bound.get(bound, 0.0) + seconds
    merged = _stage([(t, b) for b, t in by_bound.items()], step_s)
    assert step_joules_by_bound(by_bound, step_s, POWER) == step_joules(seconds_by_kind(merged), step_s, POWER)


def test_joules_by_bound_by_hand():
    by_bound = {Bound.MEMORY: 5e-3, Bound.COMPUTE: 2e-3, Bound.HOST_LINK: 1e-3}
    # idle 100 W over the 9 ms step, plus 400 W above idle for 5 ms and 550 W for 2 ms; the host link waits at idle
    assert step_joules_by_bound(by_bound, 9e-3, POWER) == (pytest.approx(0.9 + 2.0 + 1.1), False)
    assert step_joules_by_bound(by_bound, 9e-3, replace(POWER, board=200.0)) == (pytest.approx(1.8), True)


def test_overlapped_communication_adds_its_draw_above_idle_and_the_board_power_caps_the_mean():
    # 4 ms compute and 2 ms communication, the communication hidden under the compute: a 4 ms step
    stage = _stage([(4e-3, Bound.COMPUTE), (2e-3, Bound.COMM)], saved=2e-3)
    energy = stage_energy(stage, POWER)
    # idle x 4 ms + (650 - 100) x 4 ms + (300 - 100) x 2 ms = 0.4 + 2.2 + 0.4 = 3.0 J, under 700 W x 4 ms = 2.8 J
    assert energy.capped and energy.joules == pytest.approx(700 * 4e-3)
    lighter = replace(POWER, compute_bound=500.0)  # 0.4 + 1.6 + 0.4 = 2.4 J: below the cap
    assert stage_energy(stage, lighter).joules == pytest.approx(2.4) and not stage_energy(stage, lighter).capped


def test_a_step_longer_than_its_operations_waits_at_idle_draw():
    energy = step_energy({"memory": 1e-3}, 3e-3, POWER)
    assert energy.joules == pytest.approx(1e-3 * 500 + 2e-3 * 100)


def test_power_facts_lie_between_idle_and_the_board_power():
    validate_power(POWER, "card.yaml")
    with pytest.raises(ConfigError, match=r"power\.memory_bound.*between the idle draw"):
        validate_power(replace(POWER, memory_bound=800.0), "card.yaml")
    with pytest.raises(ConfigError, match=r"power\.idle.*below the board power"):
        validate_power(replace(POWER, idle=700.0), "card.yaml")


def test_every_bundled_card_has_power_facts_with_a_source_on_every_line():
    for path in sorted(glob.glob(str(REPO_ROOT / "hardware" / "*.yaml"))):
        hw, _ = load_hardware_card(path)
        assert hw.power is not None, path
        assert hw.power.idle < hw.power.memory_bound <= hw.power.compute_bound <= hw.power.board, path
        lines = Path(path).read_text().split("\npower:", 1)[1].splitlines()[1:6]
        assert all("#" in line and len(line.split("#", 1)[1].strip()) > 20 for line in lines), path


def _run_json(*argv: str, capsys) -> dict:
    assert main(["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--isl", "1000", "--osl", "200",
                 "--batch-per-gpu", "32", "--format", "json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_runs_energy_is_its_prefill_and_decode_steps_per_token(capsys):
    data = _run_json(capsys=capsys)
    energy, prefill, decode = data["energy"], data["prefill"], data["decode"]
    hw, _ = load_hardware_card("h100-sxm")
    draw = {"compute": hw.power.compute_bound, "memory": hw.power.memory_bound,
            "communication": hw.power.communication_bound, "overhead": hw.power.idle}
    # recompute each step from the report's operations: time x the draw of its bound (no overlap here)
    for stage, key in ((prefill, "prefill"), (decode, "decode")):
        joules = sum(op["time_us"] * 1e-6 * draw[op["bound"]] for op in stage["modules"])
        assert energy[key]["joules_per_gpu"] == pytest.approx(joules, rel=1e-9)
    per_prompt = energy["prefill"]["joules_per_gpu"] / prefill["tokens_per_gpu"]
    per_output = energy["decode"]["joules_per_gpu"] / decode["batch_per_gpu"]
    assert energy["joules_per_prompt_token"] == pytest.approx(per_prompt)
    assert energy["decode_joules_per_token"] == pytest.approx(per_output)
    assert energy["joules_per_request"] == pytest.approx(1000 * per_prompt + 199 * per_output)
    assert energy["joules_per_output_token"] == pytest.approx(energy["joules_per_request"] / 200)
    gpu_seconds = 1000 * prefill["ttft_ms"] / 1e3 / prefill["tokens_per_gpu"] + \
        199 * decode["step_time_ms"] / 1e3 / decode["batch_per_gpu"]
    assert energy["watts_per_gpu"] == pytest.approx(energy["joules_per_request"] / gpu_seconds)
    assert hw.power.idle < energy["watts_per_gpu"] < hw.power.board
    # cost: the energy at 0.0804 $/kWh (PUE 1), the GPU-hours at the card's 2.10 $/GPU-hour
    assert energy["energy_usd_per_mtok"] == pytest.approx(energy["joules_per_output_token"] * 1e6 / JOULES_PER_KWH
                                                          * 0.0804)
    assert energy["gpu_usd_per_mtok"] == pytest.approx(gpu_seconds / 200 * 1e6 / 3600 * 2.10)


def test_the_electricity_price_and_pue_scale_the_energys_cost_only(capsys):
    base = _run_json(capsys=capsys)["energy"]
    priced = _run_json("--usd-per-kwh", "0.2", "--pue", "1.5", capsys=capsys)["energy"]
    assert priced["joules_per_output_token"] == base["joules_per_output_token"]
    assert priced["energy_usd_per_mtok"] == pytest.approx(base["energy_usd_per_mtok"] * 0.2 / 0.0804 * 1.5)
    assert (priced["usd_per_kwh"], priced["pue"]) == (0.2, 1.5)
    assert Electricity(usd_per_kwh=0.1, pue=2.0).usd(JOULES_PER_KWH) == pytest.approx(0.2)


def test_a_card_without_power_facts_reports_energy_not_available(capsys):
    data = _run_json("--set", "hardware.power=null", capsys=capsys)
    assert data["energy"] == {"available": False, "reason": data["energy"]["reason"]}
    assert "not available: hardware card h100-sxm has no power facts" in data["energy"]["reason"]
    assert main(["--model", "llama-3.1-8b", "--hardware", "h100", "--set", "hardware.power=null"]) == 0
    assert "ENERGY  not available: hardware card h100-sxm has no power facts" in capsys.readouterr().out


def test_run_energy_types():
    from infersim.run.config import load_run_config
    from infersim.run.flags import RunFlags
    from infersim.run.simulate import simulate

    config = load_run_config(None, [], None, RunFlags(model="qwen3-0.6b", hardware="h100", isl=200, osl=50))
    assert isinstance(run_energy(simulate(config)), RunEnergy)
    bare = replace(config, hardware=replace(config.hardware, power=None))
    assert isinstance(run_energy(simulate(bare)), EnergyUnavailable)


def _serve(capsys, rate: str) -> dict:
    assert main(["serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--rate", rate,
                 "--num-requests", "40", "--isl", "300", "--osl", "60", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_serving_under_a_light_load_pays_idle_power_for_the_time_it_waits(capsys):
    light, heavy = _serve(capsys, "0.5"), _serve(capsys, "50")
    hw, _ = load_hardware_card("h100-sxm")
    for s in (light, heavy):
        energy, pool = s["energy"], s["energy"]["pools"][0]
        busy_s = s["pools"][0]["busy_fraction"] * s["duration"]  # one instance of one GPU
        assert energy["idle_joules"] == pytest.approx(hw.power.idle * (s["duration"] - busy_s), rel=1e-6)
        assert energy["joules"] == pytest.approx(energy["busy_joules"] + energy["idle_joules"])
        assert energy["joules_per_output_token"] == pytest.approx(energy["joules"] / s["total_output_tokens"])
        assert energy["watts_per_gpu"] == pytest.approx(energy["joules"] / s["duration"])
        assert pool["busy_fraction"] == pytest.approx(s["pools"][0]["busy_fraction"])
    assert light["energy"]["idle_share"] > 0.2 > heavy["energy"]["idle_share"]
    assert light["energy"]["joules_per_output_token"] > 2 * heavy["energy"]["joules_per_output_token"]
    assert light["energy"]["watts_per_gpu"] < heavy["energy"]["watts_per_gpu"]


def test_sweep_rows_and_the_energy_frontier_carry_joules_per_token(capsys, tmp_path):
    out = tmp_path / "front.json"
    assert main(["pareto", "--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--gpus", "1,2",
                 "--batch", "1,8,64,256", "--isl", "1000", "--osl", "200", "--workers", "1", "--objective", "energy",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "y = J per output token of the decode step" in text and "J/tok" in text and "W/GPU" in text
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["joules_per_token"] > 0 and r["watts_per_gpu"] > 0 for r in rows)
    speeds = [r["user_tokens_per_s"] for r in rows]
    joules = [r["joules_per_token"] for r in rows]
    assert speeds == sorted(speeds, reverse=True) and joules == sorted(joules, reverse=True)  # a frontier
    for r in rows:  # J per token = W per GPU / tokens per GPU per second
        assert r["joules_per_token"] == pytest.approx(r["watts_per_gpu"] / r["tgs"])
        assert r["cost_with_energy_per_mtok_usd"] == pytest.approx(r["cost_per_mtok_usd"] + r["energy_cost_per_mtok_usd"])
    assert main(["sweep", "--model", "llama-3.1-8b", "--hardware", "h100", "--grid",
                 "workload.decode_batch_per_gpu=8,64", "--workers", "1"]) == 0
    assert "J/tok" in capsys.readouterr().out


def test_pareto_on_energy_needs_power_facts(capsys):
    code = main(["pareto", "--model", "llama-3.1-8b", "--hardware", "h100", "--gpus", "1", "--batch", "8",
                 "--objective", "energy", "--set", "hardware.power=null"])
    assert code == 2 and "has no power facts" in capsys.readouterr().err


def test_the_energy_reference_points_load_and_are_compared_apart_from_the_times():
    from infersim.validate import DEFAULT_REFERENCES, POINTS_FILE
    from infersim.validate.evaluate import evaluate, load_reference
    from infersim.validate.mapping import load_mapping

    path = REPO_ROOT / "infersim" / "validate" / "public" / "energy.yaml"
    assert path in DEFAULT_REFERENCES
    reference = load_reference(path)
    mapping = load_mapping(POINTS_FILE)
    assert len(reference) == 14 and all(p.source == "MLENERGY_V3" for p in reference.values())
    assert all(mapping[pid].kind == "energy" for pid in reference)
    wanted = ["mlenergy-llama70b-h100x4-b64-jpt", "mlenergy-llama70b-h100x4-b64-w"]
    result = evaluate(reference, mapping, reference_path=str(path), only=wanted)
    assert [c.id for c in result.comparisons] == wanted and not result.not_expressed
    measured = {c.id: c.measured for c in result.comparisons}
    assert measured == {wanted[0]: 0.7972, wanted[1]: 500.4}
    for c in result.comparisons:
        assert c.family == "energy" and abs(c.error) < 0.5  # compared, never fitted: the error is what it is
    stats = result.stats()
    assert stats["overall"] is None and stats["energy"].n == 2
