"""What a serving run could leave unsaid: a run in which no request completed warns that its zeros
are not measurements and still writes its (empty) request records; --max-model-len beside a
workload's own max_model_len is refused; a trace's date-times read the same in every time zone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, TEST_CACHE_DIR
from test_hostile_cli import one_line_error, run

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")


def test_a_run_without_a_completed_request_says_so_and_writes_its_records(capsys, tmp_path) -> None:
    out_file = tmp_path / "none.csv"
    out_file.write_text("stale,rows\n1,2\n")
    code, out, err = run(capsys, *SERVE, "--rate", "8", "--num-requests", "20", "--max-model-len", "10",
                         "--requests-out", str(out_file))
    assert code == 0 and "0 of 20 requests completed (20 rejected as too long" in out
    assert "warning: no request completed (20 rejected as too long, 0 left waiting)" in err
    assert out_file.read_text().splitlines() == ["id,arrival_s,input_tokens,output_tokens,cached_tokens,instance,"
                                                 "scheduled_s,first_token_s,finish_s,queue_ms,ttft_ms,tpot_ms,e2el_ms,"
                                                 "preemptions"]


def test_max_model_len_given_twice_is_refused(capsys, tmp_path) -> None:
    workload = tmp_path / "m.yaml"
    workload.write_text("load: {stages: [{rate: 2, num_requests: 20}]}\ndata: {type: random, input: 100, output: 10}\n"
                        "max_model_len: 100000\n")
    code, out, err = run(capsys, *SERVE, "--workload", str(workload), "--max-model-len", "100")
    assert code == 2 and not out
    one_line_error(err, "max_model_len 100 (--max-model-len", "the workload's max_model_len 100,000", "give one")


def test_trace_date_times_read_the_same_in_every_time_zone(tmp_path) -> None:
    trace = tmp_path / "dst.csv"  # New York's clocks went back an hour at 02:00 on 2023-11-05
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-05 01:59:59.5,100,10\n"
                     "2023-11-05 02:00:00.5,100,10\n")
    spans = []
    for zone in ("UTC", "America/New_York"):
        done = subprocess.run([sys.executable, "-m", "infersim", *SERVE, "--trace", str(trace)], cwd=REPO_ROOT,
                              capture_output=True, text=True,
                              env={**os.environ, "TZ": zone, "INFERSIM_CACHE_DIR": TEST_CACHE_DIR}, check=True)
        spans.append(next(line for line in done.stdout.splitlines() if line.startswith("THROUGHPUT")))
    assert spans[0] == spans[1] == "THROUGHPUT  over 1.05 s on 1 GPU(s)"


def test_an_option_given_twice_under_its_two_names_is_refused(capsys) -> None:
    for first, second in ((("--rate", "4"), ("--request-rate", "6")), (("--num-requests", "50"), ("--num-prompts", "70")),
                          (("--random-input-len", "500"), ("--isl", "300"))):
        with pytest.raises(SystemExit) as stopped:  # argparse's own error exit
            run(capsys, *SERVE, *first, *second)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert f"{second[0]} " in err and f"and {first[0]} " in err and "one option given twice" in err
    code, out, _err = run(capsys, *SERVE, "--rate", "4", "--request-rate", "4", "--num-requests", "20")
    assert code == 0 and "Poisson 4 req/s" in out  # the same value twice: one option, once


def test_a_router_with_one_replica_is_refused(capsys) -> None:
    code, out, err = run(capsys, *SERVE, "--offline", "--num-requests", "20", "--router", "least-loaded")
    assert code == 2 and not out
    one_line_error(err, "--router least-loaded: chooses which of the --replicas instances", "there is one")
    code, out, _err = run(capsys, *SERVE, "--offline", "--num-requests", "20", "--router", "least-loaded",
                          "--replicas", "2")
    assert code == 0 and "2 x 1 GPU(s)" in out


def test_the_dataset_defaults_a_load_takes_are_said(capsys) -> None:
    code, out, _err = run(capsys, *SERVE, "--dataset-name", "prefix_repetition", "--request-rate", "4",
                          "--num-prompts", "20", "--prefix-repetition-num-prefixes", "2")
    assert code == 0
    assert ("not given, so vllm bench serve's defaults: --prefix-repetition-prefix-len 256, "
            "--prefix-repetition-suffix-len 256, --prefix-repetition-output-len 128") in out
    code, out, _err = run(capsys, *SERVE, "--dataset-name", "generated-shared-prefix", "--request-rate", "4",
                          "--gsp-num-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "64",
                          "--gsp-question-len", "16", "--gsp-output-len", "8")
    assert code == 0 and "not given, so" not in out  # every flag given: nothing taken from the tool


def test_a_trace_shorter_than_the_requests_asked_for_says_so(capsys) -> None:
    code, out, _err = run(capsys, *SERVE, "--trace", str(REPO_ROOT / "docs" / "examples" / "azure-style-trace.csv"),
                          "--num-requests", "100")
    assert code == 0 and "azure-style-trace.csv: 40 rows, fewer than num_requests 100: all 40 replayed" in out
