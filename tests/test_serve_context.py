"""infersim serve and the model's context length (max_position_embeddings): a max_model_len above it,
requests served past it, rate searches whose requests the context refuses; ramps that decrease; trace
rows resolved without a word; the overload warning's wording."""

from __future__ import annotations

from typing import Any

import pytest

from infersim.run.config import config_from_mapping
from infersim.serve.api import simulate_serving

ONE_GPU = {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1}}


def _config(engine: str, model: str = "llama-2-7b") -> Any:
    return config_from_mapping({"model": model, "hardware": "h100", "engine": engine, "deployment": ONE_GPU,
                                "workload": {"isl": 1000, "osl": 100}}, "test", mfu_tables="none")


# llama-2-7b's context is 4,096 tokens; 3,000 + 100 fit it, 5,000 + 100 do not
MIXED = {"mode": "poisson", "rate": 2, "num_requests": 6, "osl": 100,
         "isl": {"dist": "uniform", "min": 3000, "max": 5000}}


@pytest.mark.parametrize("engine, override", [("vllm", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"),
                                              ("sglang", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")])
def test_a_max_model_len_above_the_context_is_said_with_the_engines_override(engine, override):
    summary = simulate_serving(_config(engine), {**MIXED, "max_model_len": 8000, "requests": True})
    longer = sum(r["input_tokens"] + r["output_tokens"] > 4096 for r in summary["requests"])
    assert 0 < longer < 6 and summary["completed"] == 6
    note = [n for n in summary["notes"] if n.startswith("max_model_len 8,000")]
    assert note == [f"max_model_len 8,000 is above model llama-2-7b's context of 4,096 tokens "
                    f"(max_position_embeddings): {engine} starts with it only when {override} is set, and the "
                    f"model's output quality past its trained context is not assured; {longer:,} requests longer "
                    "than that (prompt + output) were served"]


def test_a_max_model_len_within_the_context_says_nothing_of_it():
    summary = simulate_serving(_config("vllm"), {**MIXED, "max_model_len": 4000})
    assert not any("max_position_embeddings" in n for n in summary.get("notes", []))


def test_a_workload_files_max_model_len_above_the_context_is_said_too():
    workload = {"data": {"type": "random", "input": 3000, "output": 100}, "max_model_len": 6000,
                "load": {"stages": [{"rate": 2, "num_requests": 4}]}}
    summary = simulate_serving(_config("vllm"), {"workload": workload})
    assert any(n.startswith("max_model_len 6,000 is above model llama-2-7b's context of 4,096 tokens")
               and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in n for n in summary["notes"])


def test_an_engine_that_runs_beyond_the_context_says_how_many_requests_did():
    summary = simulate_serving(_config("huggingface"), {**MIXED, "requests": True})
    longer = sum(r["input_tokens"] + r["output_tokens"] > 4096 for r in summary["requests"])
    assert 0 < longer < 6 and summary["completed"] == 6 and not summary.get("rejected")
    assert f"{longer:,} requests longer (prompt + output) than model llama-2-7b's context of 4,096 tokens " \
           "(max_position_embeddings) were served: huggingface runs them, but the model was not trained on " \
           "positions that far" in summary["notes"]
    within = simulate_serving(_config("huggingface"), {**MIXED, "isl": 2000})
    assert not any("max_position_embeddings" in n for n in within.get("notes", []))


def _search(options: dict[str, Any], sweep: list[float] | None = None) -> Any:
    from infersim.serve.search import RateRunner, max_rate_under_slo, rate_sweep

    config = _config("vllm")
    with RateRunner(config, options, workers=1, progress=False) as runner:
        if sweep is not None:
            return rate_sweep(runner, sweep)
        offline = simulate_serving(config, {**options, "mode": "offline"})
        return max_rate_under_slo(runner, offline, 2.0, None)


ALL_TOO_LONG = {"num_requests": 8, "isl": 5000, "osl": 100}


@pytest.mark.parametrize("sweep, search", [(None, "--max-rate-under-slo"), ([1.0, 2.0], "--rate-sweep")])
def test_a_rate_search_whose_every_request_is_rejected_says_why(sweep, search):
    from infersim.base.errors import NotPossible

    with pytest.raises(NotPossible) as caught:
        _search(ALL_TOO_LONG, sweep)
    assert str(caught.value) == (
        f"{search}: at any rate, every one of the 8 requests is rejected on arrival as longer (prompt + output) than "
        "model llama-2-7b's context of 4,096 tokens (max_position_embeddings), the max_model_len vllm defaults to: "
        "no rate serves a request; give shorter requests (--isl/--osl) or a longer --max-model-len")


def test_a_rate_search_says_how_many_requests_were_rejected_at_each_rate():
    from infersim.serve.report import slo_search_text, sweep_text

    options = {"num_requests": 8, "osl": 100, "isl": {"dist": "uniform", "min": 3000, "max": 5000},
               "slo": {"ttft_s": 2.0}}
    offline = simulate_serving(_config("vllm"), {**options, "mode": "offline"})
    too_long = offline["rejected"]
    assert 0 < too_long < 8 and offline["completed"] == 8 - too_long
    line = (f"  {too_long} of the 8 requests were rejected on arrival as longer (prompt + output) than model "
            "llama-2-7b's context of 4,096 tokens (max_position_embeddings), the max_model_len vllm defaults to, at "
            "every rate; the figures are of the others")
    found = _search(options)
    assert [p["rejected"] for p in found["probes"]] == [too_long] * len(found["probes"])
    assert slo_search_text(found).endswith("\n" + line)
    rows = _search(options, [1.0, 2.0])
    assert [r["rejected"] for r in rows] == [too_long, too_long] and sweep_text(rows).endswith("\n" + line)
    assert "rejected" not in sweep_text(_search({**options, "isl": 2000}, [1.0]))


RISES = "a ramp-up rises from its start to its end, and vllm bench serve refuses a start above the end"


def test_a_decreasing_ramp_is_refused_naming_its_rates(capsys, tmp_path):
    import yaml

    from infersim.base.errors import InferSimError
    from infersim.cli.main import main

    workload = {"data": {"type": "random", "input": 500, "output": 50},
                "load": {"timer": "vllm", "ramp_up": {"strategy": "linear", "start_rps": 20, "end_rps": 1},
                         "stages": [{"num_requests": 10}]}}
    keys = f"workload.load.ramp_up: start_rps 20 is above end_rps 1 (--ramp-up-start-rps / --ramp-up-end-rps): {RISES}"
    with pytest.raises(InferSimError) as refused:
        simulate_serving(_config("vllm"), {"workload": workload})
    assert str(refused.value) == keys
    rising = {**workload, "load": {**workload["load"], "ramp_up": {"strategy": "linear", "start_rps": 1, "end_rps": 1}}}
    assert simulate_serving(_config("vllm"), {"workload": rising})["completed"] == 10  # vllm takes start == end
    path = tmp_path / "ramp.yaml"
    path.write_text(yaml.safe_dump(workload))
    assert main(["serve", "--config", "serve-llama-8b-h100.yaml", "--workload", str(path)]) == 2
    assert capsys.readouterr().err == f"infersim: error: --workload {path}: {keys}\n"
    # the flags are named as given, not as the workload keys they become
    flags = f"infersim: error: --ramp-up-start-rps 10 > --ramp-up-end-rps 1: {RISES}\n"
    for load in (["--isl", "500", "--osl", "50"], ["--dataset-name", "random"]):
        assert main(["serve", "--config", "serve-llama-8b-h100.yaml", "--num-requests", "20", *load,
                     "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "10", "--ramp-up-end-rps", "1"]) == 2
        assert capsys.readouterr().err == flags


def _trace(tmp_path: Any, text: str) -> str:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


def test_a_prefix_id_given_two_prefix_token_counts_is_refused_naming_both_rows(tmp_path):
    from infersim.base.errors import InferSimError
    from infersim.serve.trace_replay import read_trace

    path = _trace(tmp_path, "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n"
                            "0,100,10,a,50\n1,120,10,b,20\n2,100,10,a,80\n3,100,10,b,20\n")
    with pytest.raises(InferSimError) as caught:
        read_trace(path)
    assert str(caught.value) == (f"trace {path}: prefix_id 'a' has prefix_tokens 50 in row 1 and 80 in row 3: rows "
                                 "naming a prefix_id share its first prefix_tokens tokens, one count; give them one "
                                 "value, or different prefix_ids")
    agreeing = _trace(tmp_path, "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n"
                                "0,100,10,a,50\n1,120,10,b,20\n2,100,10,a,50\n")
    assert list(read_trace(agreeing).prefix_tokens) == [50, 20, 50]


def test_a_trace_reordered_or_shifted_says_so(tmp_path):
    from infersim.serve.trace_replay import trace_replay

    path = _trace(tmp_path, "arrival_s,input_tokens,output_tokens\n-2,100,10\n1,120,10\n-1.5,100,10\n3,100,10\n")
    replay = trace_replay(path)
    assert [r.arrival_s for r in replay] == [0.0, 0.5, 3.0, 5.0]
    assert replay.notes() == [
        f"trace {path}: arrival times are not in file order: replayed by arrival time, 2 of 4 rows moved from their "
        "place in the file",
        f"trace {path}: arrivals from -2 s, before 0: replayed relative to the first, every arrival shifted by +2 s"]
    in_order = _trace(tmp_path, "arrival_s,input_tokens,output_tokens\n5,100,10\n6,120,10\n")
    assert trace_replay(in_order).notes() == []


def test_the_overload_warning_writes_rates_as_the_overloaded_line_and_says_what_a_bounded_queue_did():
    from infersim.serve.overload import StageLoad, warning_text

    bounded = StageLoad(-1, 0.0, 0.2, 1000.0, 110.0, 17.0, 93.0, 131, True, 163.955)
    text = warning_text(bounded, 20)
    assert text.startswith("overloaded: the load offered 1,000.000 req/s; its engines served 163.955 req/s at "
                           "saturation; over the second half of its arrivals 93 of the 110 requests arriving were not "
                           "admitted; 131 requests found the queue full (max_waiting 20 per instance)")
    unbounded = StageLoad(-1, 0.0, 0.2, 1000.0, 110.0, 17.0, 93.0, 0, True, 163.955)
    assert "the queue grew by 93 of 110 requests. Latencies" in warning_text(unbounded, 0)


def test_a_one_row_trace_is_one_request(tmp_path, capsys):
    from infersim.cli.main import main

    path = _trace(tmp_path, "arrival_s,input_tokens,output_tokens\n0,100,10\n")
    assert main(["serve", "--config", "serve-llama-8b-h100.yaml", "--trace", path]) == 0
    assert "  load:        1 request, trace replay; 100 input and 10 output tokens" in capsys.readouterr().out


def test_a_max_model_len_below_two_tokens_is_refused_by_the_api_as_by_the_flag() -> None:
    from infersim.base.errors import InferSimError
    from infersim.serve.options import parse_options

    with pytest.raises(InferSimError, match="max_model_len must be a whole number >= 2"):
        parse_options({"max_model_len": 1, "rate": 1})
    assert parse_options({"max_model_len": 2, "rate": 1}).max_model_len == 2


def test_one_admitted_request_is_one_request_on_the_overloaded_line() -> None:
    from infersim.serve.report import summary_text

    summary = simulate_serving(_config("vllm"), {"rate": 1, "num_requests": 2, "isl": 100, "osl": 10})
    for admitted, words in ((1, "; 1 request admitted, 3 left waiting"), (2, "; 2 requests admitted, 3 left waiting")):
        summary["load"] = {"overloaded": True, "offered_rps": 5.0, "saturated_capacity_rps": 0.5,
                           "admitted": admitted, "left_waiting": 3}
        assert words in summary_text(summary)
