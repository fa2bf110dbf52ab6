"""`infersim serve` on the command line: outputs, searches and one clear message per bad input."""

from __future__ import annotations

import json

import pytest

from infersim.cli.main import main
from infersim.base.errors import InferSimError
from infersim.serve.cli import parse_slo
from infersim.serve.search import parse_rate_range

CONFIG = "serve-llama-8b-h100.yaml"


def run(capsys, *argv):
    try:
        code = main(["serve", "--config", CONFIG, *argv])
    except SystemExit as exc:  # argparse refusing an argument
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_text_report(capsys):
    code, out, _err = run(capsys, "--rate", "4", "--num-requests", "100", "--slo", "ttft=2s,tpot=50ms")
    assert code == 0
    assert "TTFT" in out and "goodput" in out and "Little's law" in out and "sglang 0.5" in out


def test_json_and_requests_out(capsys, tmp_path):
    path = tmp_path / "req.jsonl"
    code, out, _err = run(capsys, "--concurrency", "8", "--num-requests", "40", "--format", "json",
                          "--requests-out", str(path), "--isl", "{dist: normal, mean: 800, std: 100}", "--osl", "50")
    assert code == 0
    data = json.loads(out)
    assert data["max_concurrency"] == 8 and data["completed"] == 40 and "requests" not in data
    lines = path.read_text().splitlines()
    assert len(lines) == 40 and json.loads(lines[0])["output_tokens"] == 50


def test_rate_sweep_json(capsys):
    code, out, _err = run(capsys, "--rate-sweep", "2:6:2", "--num-requests", "60", "--workers", "1",
                          "--format", "json", "--slo", "ttft=1s,tpot=40ms")
    assert code == 0
    data = json.loads(out)
    assert [row["rate"] for row in data["rate_sweep"]] == [2.0, 4.0, 6.0]
    assert all("p99_ttft_ms" in row and "output_throughput_per_gpu" in row for row in data["rate_sweep"])
    assert data["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 40.0}


def test_max_rate_under_slo(capsys):
    code, out, _err = run(capsys, "--max-rate-under-slo", "--slo", "ttft=200ms,tpot=20ms", "--num-requests", "300",
                          "--osl", "100", "--workers", "1", "--format", "json")
    assert code == 0
    found = json.loads(out)["max_rate_under_slo"]
    assert 0 < found["max_rate"] < found["capacity_rate"]
    met = [p["rate"] for p in found["probes"] if p["met"]]
    missed = [p["rate"] for p in found["probes"] if not p["met"]]
    assert max(met) == found["max_rate"] and min(missed) > found["max_rate"]


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "argument --rate/--request-rate: '0': must be greater than 0"),
    (["--rate", "2", "--isl", "-10"], "isl: a length must be a whole number of tokens >= 1"),
    (["--rate", "2", "--isl", ".inf"], "isl: a length must be a whole number of tokens >= 1 (value: inf: must be a finite"),
    (["--rate", "2", "--offline"], "choose one load"),
    ([], "give a load"),
    (["--rate", "2", "--slo", "ttft=fast"], "--slo 'ttft=fast'"),
    (["--rate-sweep", "5:1:1"], "start <= stop"),
])
def test_bad_input_exits_2_with_one_message(capsys, argv, message):
    code, _out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_no_rate_meeting_the_slo_is_cannot_run_exit_1(capsys):
    """Valid input whose answer is "cannot run" (README, Exit status): 1, not 2."""
    code, _out, err = run(capsys, "--max-rate-under-slo", "--slo", "ttft=1ms", "--num-requests", "40", "--workers", "1")
    assert code == 1
    assert "no request rate meets the SLO" in err and err.count("\n") == 1


def test_bad_trace_row_exits_2_naming_row_and_column(capsys, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,10\n0.5,100,ten\n")
    code, _out, err = run(capsys, "--trace", str(path))
    assert code == 2
    assert "row 2, column GeneratedTokens: 'ten'" in err


def test_parsers():
    assert parse_slo("ttft=2s,tpot=50ms") == {"ttft_s": 2.0, "tpot_s": 0.05}
    assert parse_slo("tpot=40ms") == {"tpot_s": 0.04} == parse_slo("TPOT = 40000us")
    with pytest.raises(InferSimError, match="tpot=40 needs a unit"):  # a bare number is not taken as ms
        parse_slo("tpot=40")
    assert parse_rate_range("1:4:1") == [1.0, 2.0, 3.0, 4.0]
    assert parse_rate_range("0.5,2") == [0.5, 2.0]
