"""A layout flag and a --set of a layout field it decides otherwise would leave the command line
naming a layout the run does not have (fit_layout builds the layout from the flags): refused
naming both; a --set that agrees with the flags' layout stands.
A --set the flags do not decide still has the last word; `serve` prices energy at the
--usd-per-kwh it is given; `mfu from-trace` refuses a --set of the workload its trace gives."""

from __future__ import annotations

import pytest
from test_hostile_cli import one_line_error, run
from test_trace_learn import run_config, trace

MODEL = ("--model", "qwen3-8b", "--hardware", "h100-sxm")


@pytest.mark.parametrize("flags, override, decided", [
    (("--tp", "2"), "deployment.attention.tp=4", "--tp 2"),
    (("--tp", "2"), "deployment.attention.dp=2", "the layout flags (--dp-attention)"),
    (("--tp", "2"), "deployment.ffn.tp=1", "--tp 2"),
    (("--pp", "2"), "deployment.pp=1", "--pp 2"),
    (("--tp", "2"), "deployment.attention={tp: 4}", "--tp 2"),
])
def test_a_layout_field_given_by_flag_and_set_is_refused(capsys, flags, override, decided) -> None:
    code, out, err = run(capsys, *MODEL, *flags, "--set", override)
    assert code == 2 and not out
    one_line_error(err, f"--set {override}", f"decided by {decided}", "not both")


def test_a_field_the_flags_leave_alone_or_agree_with_is_set(capsys) -> None:
    code, out, _err = run(capsys, *MODEL, "--tp", "2", "--set", "deployment.attention.tp=2")
    assert code == 0 and "attention TP2" in out
    code, out, _err = run(capsys, *MODEL, "--tp", "2", "--set", "deployment.pp=2")
    assert code == 0 and "attention TP2" in out and "PP2" in out and "4 GPU(s)" in out
    code, out, _err = run(capsys, *MODEL, "--set", "deployment.attention.tp=4", "--set", "deployment.num_gpus=4")
    assert code == 0 and "attention TP4" in out


def test_serve_prices_energy_at_the_price_given(capsys) -> None:
    line = []
    for extra in ((), ("--usd-per-kwh", "0.5")):
        code, out, _err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--rate", "2",
                              "--num-requests", "20", *extra)
        assert code == 0
        line.append(next(x for x in out.splitlines() if "/kWh" in x))
    assert "at $0.0804/kWh" in line[0] and "at $0.5/kWh" in line[1]
    code, _out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--rate", "2", "--num-requests",
                          "20", "--usd-per-kwh", "0.5", "--set", "energy.usd_per_kwh=0.2")
    assert code == 2
    one_line_error(err, "--usd-per-kwh 0.5 and --set energy.usd_per_kwh=0.2", "give one")


@pytest.mark.parametrize("override", ["workload.isl=100", "workload.decode_batch_per_gpu=4", "workload={isl: 5}"])
def test_from_trace_refuses_a_workload_the_trace_gives(capsys, tmp_path, override) -> None:
    code, out, err = run(capsys, "mfu", "from-trace", str(trace("llama-2-7b", "eager", "p1x128-d2")), "--config",
                         str(run_config("llama-2-7b", "p1x128-d2")), "--out", str(tmp_path / "t"), "--set", override)
    assert code == 2 and not out and not (tmp_path / "t").exists()
    one_line_error(err, f"--set {override}", "the trace's", "drop it")
