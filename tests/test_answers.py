"""Questions answered as asked: comparisons that need no base card, pareto's answer in one line and
its cheapest point per GPU (GPUs without one say why), and work kept when a search is stopped."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import io
import json
from typing import Any

import pytest

from infersim.cli.main import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------
# The card a comparison varies needs no base flag


@pytest.mark.parametrize("argv, column, values", [
    (["sweep", "--model", "qwen3-8b", "--grid", "hardware=h100,h200"], "hardware", ["h100", "h200"]),
    (["sweep", "--model", "qwen3-8b", "--hardware", "h100,h200"], "hardware", ["h100", "h200"]),
    (["sweep", "--hardware", "h100", "--grid", "model=qwen3-8b,llama-3.1-8b"], "model", ["qwen3-8b", "llama-3.1-8b"]),
    (["sweep", "--grid", "model=qwen3-8b,llama-3.1-8b", "--grid", "hardware=h100,h200"], "model",
     ["qwen3-8b", "qwen3-8b", "llama-3.1-8b", "llama-3.1-8b"]),
])
def test_a_swept_card_needs_no_base_flag(tmp_path: Any, argv: list[str], column: str, values: list[str]) -> None:
    out = tmp_path / "rows.json"
    # vLLM: the engine whose H100 and H200 tables other tests index too (~6 CPU-s a table set)
    code, _stdout, err = run(*argv, "--engine", "vllm", "--out", str(out))
    assert code == 0, err
    rows = json.loads(out.read_text())["rows"]
    assert [r[column] for r in rows] == values
    assert all(r["status"] == "ok" for r in rows)


def test_a_card_list_and_a_grid_of_the_same_card_is_refused() -> None:
    code, _out, err = run("sweep", "--model", "qwen3-8b", "--hardware", "h100,h200", "--grid", "hardware=b200")
    assert code == 2 and "give the hardware list once" in err


# ---------------------------------------------------------------------------------------------
# pareto: the answer, the cheapest point per GPU, and the GPUs without one


@pytest.fixture(scope="module")
def pareto() -> tuple[str, dict[str, Any]]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as where:
        out = Path(where) / "front.json"
        code, stdout, err = run("pareto", "--model", "qwen3-30b-a3b", "--hardware", "h20,h200,b200,rtx-a6000",
                                "--gpus", "1..16", "--target-user-tps", "30", "--workers", "1", "--all",
                                "--out", str(out))
        assert code == 0, err
        return stdout, json.loads(out.read_text())


def test_pareto_ends_with_the_answer_in_one_line(pareto: tuple[str, dict[str, Any]]) -> None:
    stdout, data = pareto
    last = stdout.rstrip().splitlines()[-1]
    assert last.startswith("answer: cheapest meeting >= 30 tok/s/user: ")
    # the answer is the cheapest of every feasible point written with --all
    rows = [r for r in data["rows"] if r["user_tokens_per_s"] >= 30]
    best = min(rows, key=lambda r: (r["total_cost_per_mtok_usd"], -r["user_tokens_per_s"], r["num_gpus"]))
    assert f"{best['hardware']} x {best['num_gpus']}" in last
    assert f"batch {best['batch_per_gpu']}: ${best['total_cost_per_mtok_usd']:.3f}/M output tokens" in last
    assert f"{best['user_tokens_per_s']:,.1f} tok/s/user" in last


def test_pareto_lists_the_cheapest_point_of_each_gpu(pareto: tuple[str, dict[str, Any]]) -> None:
    stdout, data = pareto
    lines = stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("CHEAPEST POINT PER HARDWARE")))
    table = lines[head + 3:head + 7]
    costs = []
    for line in table:
        hardware, *_rest = line.split()
        mine = [r for r in data["rows"] if r["hardware"] == hardware]
        cheapest = min(r["total_cost_per_mtok_usd"] for r in mine)
        assert f"{cheapest:.3f}" in line.split()
        costs.append(cheapest)
    assert costs == sorted(costs)  # cheapest first
    assert {line.split()[0] for line in table} == {"h20", "h200", "b200", "rtx-a6000"}


def test_a_gpu_without_a_feasible_point_is_listed_with_why() -> None:
    # DeepSeek-V3 does not fit on up to 8 RTX A6000s (48 GB each), and two nodes need a NIC the card lacks
    code, stdout, err = run("pareto", "--model", "deepseek-v3", "--hardware", "h200,rtx-a6000", "--gpus", "8,16",
                            "--engine", "vllm", "--workers", "1")
    assert code == 0, err
    line = next(line for line in stdout.splitlines() if line.startswith("no feasible point: rtx-a6000: "))
    assert "has no NIC" in line
    assert "hardware=rtx-a6000" not in stdout  # no empty frontier section
    assert stdout.rstrip().splitlines()[-1].startswith("answer: cheapest of all (no speed target; ")
    assert "h200 x " in stdout.rstrip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# Stopped searches keep what finished


class _StopAfter(cf.Executor):
    """An executor that runs tasks in process and raises KeyboardInterrupt (Ctrl-C) at the k-th."""

    def __init__(self, k: int) -> None:
        self.k, self.submitted = k, 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        self.submitted += 1
        if self.submitted == self.k:
            future.set_exception(KeyboardInterrupt())
        else:
            future.set_result(fn(*args, **kwargs))
        return future


def test_an_interrupted_pareto_prints_its_partial_frontier(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from infersim.sweep import cli, runner

    real = runner.run_sweep
    monkeypatch.setattr(cli, "run_sweep", lambda spec, **kw: real(spec, executor=_StopAfter(3), chunk_units=2))
    out = tmp_path / "partial.csv"
    code, stdout, err = run("pareto", "--model", "qwen3-8b", "--hardware", "h100", "--gpus", "1..8", "--out", str(out))
    assert code == 130
    assert stdout.startswith("PARTIAL RESULT: interrupted after ")
    assert "answer: cheapest" in stdout
    assert f"partial results written to {out}" in err


def test_an_interrupted_rate_sweep_prints_the_rates_that_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    from infersim.serve import search

    real = search._serve_task
    calls = []

    def stop_at_third(payload: bytes, rate: float | None) -> dict[str, Any]:
        calls.append(rate)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(payload, rate)

    monkeypatch.setattr(search, "_serve_task", stop_at_third)
    code, stdout, err = run("serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--rate-sweep", "1,2,4,8",
                            "--num-requests", "100", "--workers", "1", "--format", "json")
    assert code == 130
    data = json.loads(stdout)
    assert data["interrupted"] == "SIGINT"
    assert [row["rate"] for row in data["rate_sweep"]] == [1.0, 2.0]
    assert "the runs that finished are printed above, marked partial" in err


def test_an_interrupted_slo_search_says_what_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    from infersim.serve import search

    real = search._serve_task
    calls = []

    def stop_at_fourth(payload: bytes, rate: float | None) -> dict[str, Any]:
        calls.append(rate)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(payload, rate)

    monkeypatch.setattr(search, "_serve_task", stop_at_fourth)
    code, stdout, _err = run("serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--max-rate-under-slo",
                             "--slo", "ttft=500ms,tpot=12ms", "--num-requests", "100", "--workers", "1")
    assert code == 130
    assert "PARTIAL: the search for the highest rate under the SLO was interrupted after 3 probes" in stdout


def test_request_records_with_a_rate_search_are_refused() -> None:
    for extra in (["--include-requests"], ["--requests-out", "r.jsonl"]):
        code, _out, err = run("serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--rate-sweep", "1,2", *extra)
        assert code == 2 and "per-request records are those of one run" in err
