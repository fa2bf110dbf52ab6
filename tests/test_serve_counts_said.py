"""serve writes a count of one in the singular ('1 request', '1 step', '1 client'), in its report, its
warnings and its notes (infersim.base.texttable.counted)."""

from __future__ import annotations

import json

from conftest import REPO_ROOT
from infersim.base.texttable import counted
from infersim.cli.main import main
from test_hostile_cli import one_line_error, run


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


def test_one_group_of_one_shared_prefix_prompt_is_said_in_the_singular():
    from infersim.serve.workload_spec import parse_workload

    def said(groups: int, per_group: int) -> str:
        data = {"type": "shared_prefix", "num_groups": groups, "prompts_per_group": per_group,
                "system_prompt_len": 100, "question_len": 20, "output_len": 10}
        return parse_workload({"data": data, "load": {"stages": [{"rate": 1, "num_requests": 2}]}}).describe()

    assert said(1, 1) == "1 x 1 shared-prefix prompt; poisson timer: 1/s, 2 sent"
    assert said(9, 5) == "9 x 5 shared-prefix prompts; poisson timer: 1/s, 2 sent"


def test_compare_says_the_one_request_the_simulated_server_rejected_in_the_singular(capsys, tmp_path):
    # one request of 6,000 + 200 tokens: longer than Llama-2-7B's 4,096-token context, which vLLM refuses
    data = json.loads((REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json").read_text())
    data.update(model_id="meta-llama/Llama-2-7b-hf", tokenizer_id="meta-llama/Llama-2-7b-hf", num_prompts=1,
                completed=1, total_input_tokens=6000, total_output_tokens=200)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    code, out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100-sxm",
                         "--model", "llama-2-7b")
    assert code == 1 and not out
    one_line_error(err, "the simulated server rejected the 1 request on arrival, where the benchmark completed 1: "
                        "1 request longer (prompt + output) than model llama-2-7b's context of 4,096 tokens")
