"""serve writes a count of one in the singular ('1 request', '1 step', '1 client'), in its report, its
warnings and its notes (infersim.base.texttable.counted)."""

from __future__ import annotations

from infersim.base.texttable import counted
from infersim.cli.main import main


def test_a_count_takes_its_noun_in_the_singular_for_one_only():
    assert [counted(n, "request") for n in (0, 1, 2, 2048)] == ["0 requests", "1 request", "2 requests",
                                                               "2,048 requests"]
    assert [counted(n, "repeated prefix", "repeated prefixes") for n in (1, 3)] == ["1 repeated prefix",
                                                                                   "3 repeated prefixes"]


def test_a_workload_stage_of_one_client_is_said_in_the_singular():
    from infersim.serve.workload_spec import parse_stage

    assert parse_stage({"concurrency": 1, "num_requests": 1}, "stage").describe() == "1 request from 1 client"
    assert parse_stage({"concurrency": 2, "num_requests": 10}, "stage").describe() == "10 requests from 2 clients"


def test_one_client_sending_one_request_is_said_in_the_singular(capsys):
    assert main(["serve", "--config", "serve-llama-8b-h100.yaml", "--concurrency", "1", "--num-requests", "1",
                 "--isl", "100", "--osl", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("sglang 0.5.23; 1 concurrent client")
    assert lines[1] == "  load:        1 request, closed loop, 1 client; 100 input and 1 output tokens"
    engine = next(line for line in lines if line.startswith("ENGINE "))
    assert engine.endswith("; preemptions 0; 1 step simulated in 1 iteration")


def test_one_request_beyond_the_context_is_one_in_the_load_line_and_the_note(capsys):
    assert main(["serve", "--model", "qwen3-8b", "--hardware", "h100", "--engine", "vllm@0.15", "--rate", "2",
                 "--num-requests", "1", "--isl", "40000", "--osl", "2000"]) == 0
    out = capsys.readouterr().out
    assert "  load:        0 of 1 request completed (1 rejected as too long, 0 left waiting), Poisson 2 req/s" in out
    assert out.endswith("\nNOTES\n  - 1 request longer (prompt + output) than model qwen3-8b's context of 40,960 tokens "
                        "was rejected on arrival: max_model_len not given, vllm defaults it to the model's "
                        "max_position_embeddings\n")


def test_one_rejection_and_one_request_left_waiting_are_said_in_the_singular():
    from infersim.serve.overload import StageLoad, warning_text
    from infersim.serve.report import rejected_text

    assert rejected_text([{"rate": 1.0, "rejected": 1, "num_prompts": 1}, {"rate": 2.0, "rejected": 1,
                                                                          "num_prompts": 1}], None) == \
        "\n  1 of the 1 request was rejected on arrival, at every rate; the figures are of the others"
    one = StageLoad(-1, 0.0, 0.2, 10.0, 1.0, 0.0, 1.0, 1, True, None)
    assert warning_text(one, 1).startswith(
        "overloaded: the load offered 10.000 req/s; its engines could not keep up (saturated capacity not measured: "
        "no request was admitted over the second half of the arrivals, so no admission rate to take); over the "
        "second half of its arrivals 1 of the 1 request arriving was not admitted; 1 request found the queue full "
        "(max_waiting 1 per instance) and was left waiting, never admitted.")
