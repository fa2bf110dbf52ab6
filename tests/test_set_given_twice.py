"""`--set FIELD=VALUE` naming one field twice is refused naming the field and both values, on every
command that reads --set (the main run, sweep, pareto, serve, generate); a card named and then one
of its fields is two fields, and runs. A flag that stands for a --set field (--usd-per-kwh,
generate's --weights) given with a --set of that field is refused naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_cli import one_line_error, run

from infersim.base.errors import InferSimError
from infersim.run.config import parse_overrides

RUN = ("--config", "qwen3-30b.yaml")
TWICE = ("--set", "deployment.attention.tp=2", "--set", "deployment.attention.tp=4")
TWICE_PARTS = ("--set deployment.attention.tp=4", "field 'deployment.attention.tp'",
               "also set by --set deployment.attention.tp=2", "(2, then 4)", "give it once")


@pytest.mark.parametrize("command", [
    RUN,
    ("sweep", *RUN, "--grid", "workload.decode_batch_per_gpu=16,32", "--workers", "1"),
    ("pareto", *RUN, "--gpus", "4", "--workers", "1"),
    ("serve", "--config", "serve-llama-8b-h100.yaml", "--rate", "2", "--num-requests", "5"),
    ("generate", "--config", "benchmarks/offload/opt-30b.yaml", "--batch", "2", "--prompt-len", "8", "--gen-len", "2"),
])
def test_a_field_set_twice_is_refused_on_every_command(capsys, command) -> None:
    code, out, err = run(capsys, *command, *TWICE)
    assert code == 2 and not out
    one_line_error(err, *TWICE_PARTS)


def test_generate_fields_set_twice_are_refused(capsys) -> None:
    code, _out, err = run(capsys, "generate", "--config", "benchmarks/offload/opt-30b.yaml", "--prompt-len", "8",
                          "--gen-len", "2", "--set", "generate.batch=2", "--set", "generate.batch=4")
    assert code == 2
    one_line_error(err, "field 'generate.batch'", "(2, then 4)")


def test_identical_repeats_run_as_one(capsys) -> None:
    once = run(capsys, *RUN, "--set", "deployment.attention.tp=1", "--format", "json")
    twice = run(capsys, *RUN, "--set", "deployment.attention.tp=1", "--set", "deployment.attention.tp=1",
                "--format", "json")
    assert once[0] == twice[0] == 0
    assert json.loads(once[1])["decode"]["tpot_ms"] == json.loads(twice[1])["decode"]["tpot_ms"]


def test_the_same_number_spelt_otherwise_is_refused(capsys) -> None:
    code, _out, err = run(capsys, *RUN, "--set", "workload.isl=100", "--set", "workload.isl=100.0")
    assert code == 2
    one_line_error(err, "field 'workload.isl'", "(100, then 100.0)")


def test_a_field_inside_a_mapping_value_counts(capsys) -> None:
    code, _out, err = run(capsys, *RUN, "--set", "deployment.attention={tp: 2}", "--set", "deployment.attention.tp=4")
    assert code == 2
    one_line_error(err, "field 'deployment.attention.tp'", "also set by --set deployment.attention={tp: 2}",
                   "(2, then 4)")


def test_a_section_replaced_after_one_of_its_fields_is_refused(capsys) -> None:
    # the mapping replaces the whole section: the tp given before it would be dropped without a word
    code, _out, err = run(capsys, *RUN, "--set", "deployment.attention.tp=4", "--set", "deployment.attention={dp: 1}")
    assert code == 2
    one_line_error(err, "--set deployment.attention={dp: 1}", "replaces section 'deployment.attention'",
                   "drops field 'deployment.attention.tp'", "--set deployment.attention.tp=4")


def test_a_section_then_one_of_its_fields_runs(capsys) -> None:
    code, out, err = run(capsys, *RUN, "--set", "deployment.attention={dp: 1}", "--set", "deployment.attention.tp=4",
                         "--format", "json")
    assert code == 0, err
    assert json.loads(out)["deployment"]["attention"] == {"tp": 4, "dp": 1}


@pytest.mark.parametrize("order", [("model=qwen3-8b", "model.num_hidden_layers=4"),
                                   ("model.num_hidden_layers=4", "model=qwen3-8b")])
def test_a_card_and_one_of_its_fields_are_two_fields(capsys, order) -> None:
    code, out, err = run(capsys, *RUN, "--set", order[0], "--set", order[1], "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"] == "qwen3-8b"
    assert max(m["layers"] for m in data["decode"]["modules"]) == 4  # per-layer modules run on 4 layers


def test_two_cards_for_one_run_are_refused(capsys) -> None:
    code, _out, err = run(capsys, *RUN, "--set", "model=qwen3-8b", "--set", "model=llama-3.1-8b")
    assert code == 2
    one_line_error(err, "field 'model'", "('qwen3-8b', then 'llama-3.1-8b')")


def test_a_card_field_set_twice_is_refused(capsys) -> None:
    code, _out, err = run(capsys, *RUN, "--set", "hardware.peak.hbm_bandwidth=4e12",
                          "--set", "hardware.peak.hbm_bandwidth=5e12")
    assert code == 2
    one_line_error(err, "field 'hardware.peak.hbm_bandwidth'", "4e12", "5e12")


def test_an_alias_bomb_value_is_read_as_one_field() -> None:
    # each level doubles the leaves a walk would visit: 2^40 of them; the budget stops the walk
    levels = ["l0: &l0 {x: 1, y: 2}"] + [f"l{i}: &l{i} {{a: *l{i - 1}, b: *l{i - 1}}}" for i in range(1, 41)]
    bomb = "deployment.moe={" + ", ".join(levels) + "}"
    parsed = parse_overrides([bomb, bomb])
    assert len(parsed) == 2 and parsed[0][0] == ["deployment", "moe"]
    with pytest.raises(InferSimError, match="field 'deployment.moe' is also set by"):
        parse_overrides([bomb, "deployment.moe=none"])


# -- a flag and a --set of the field it stands for


def test_energy_flag_and_set_of_its_field_are_refused(capsys) -> None:
    code, _out, err = run(capsys, *RUN, "--usd-per-kwh", "0.1", "--set", "energy.usd_per_kwh=0.2")
    assert code == 2
    one_line_error(err, "--usd-per-kwh 0.1 and --set energy.usd_per_kwh=0.2", "both set energy.usd_per_kwh")


def test_sweep_prices_energy_at_the_flags_price(capsys, tmp_path: Path) -> None:
    """--usd-per-kwh reached sweep's parser and nothing else: every row priced at the default."""
    costs = {}
    for price in ("0.1", "1"):
        out = tmp_path / f"sweep-{price}.json"
        code, _out, err = run(capsys, "sweep", *RUN, "--grid", "deployment.ffn.ep=4", "--workers", "1",
                              "--usd-per-kwh", price, "--out", str(out))
        assert code == 0, err
        (row,) = json.loads(out.read_text())["rows"]
        costs[price] = row["energy_cost_per_mtok_usd"]
    assert costs["1"] == pytest.approx(10 * costs["0.1"])


def test_generate_weights_flag_and_set_of_its_field_are_refused(capsys) -> None:
    code, _out, err = run(capsys, "generate", "--config", "benchmarks/offload/opt-30b.yaml", "--batch", "2",
                          "--weights", "int4", "--set", "deployment.precision.weights=bf16")
    assert code == 2
    one_line_error(err, "--weights int4 and --set deployment.precision.weights=bf16", "give one")


def test_generate_refuses_an_energy_price_it_would_ignore(capsys) -> None:
    code, _out, err = run(capsys, "generate", "--config", "benchmarks/offload/opt-30b.yaml", "--batch", "2",
                          "--usd-per-kwh", "0.2")
    assert code == 2
    one_line_error(err, "--usd-per-kwh 0.2", "generate reports no energy or cost")
