"""Hostile input to `infersim serve`: workload sizes that would never finish, counts a dataset cannot
send, lengths taken from elsewhere than the config, and flags the chosen load would not read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from test_hostile_cli import one_line_error, run

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")
CHAT = "docs/examples/chat-sessions.yaml"
TRACE = "docs/examples/azure-style-trace.csv"


def workload(tmp_path: Path, data: dict, stages: list | None = None) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"load": {"stages": stages or [{"rate": 1, "num_requests": 5}]}, "data": data}))
    return str(path)


def serve_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    code, out, err = run(capsys, *SERVE, *flags, "--format", "json")
    assert code == 0, err
    return json.loads(out)


SHARED = {"type": "shared_prefix", "system_prompt_len": 10, "question_len": 10, "output_len": 10}
SESSIONS = {"type": "sessions", "system_prompt_len": 10, "question_len": 10, "output_len": 10}


# -- workload sizes that would hang or exhaust memory are refused at once


@pytest.mark.parametrize("data, stages, parts", [
    ({**SHARED, "num_groups": 10_000_000, "prompts_per_group": 1}, None,
     ("workload.data", "num_groups 10,000,000 x prompts_per_group 1", "at most 1,000,000")),
    ({**SHARED, "num_groups": 1, "prompts_per_group": 10**12}, None,
     ("prompts_per_group 1,000,000,000,000", "at most 1,000,000")),
    ({**SESSIONS, "turns": 1_000_000_000}, None,
     ("workload.data.turns: 1,000,000,000", "at most 10,000 turns")),
    ({**SESSIONS, "turns": {"dist": "uniform", "min": 1, "max": 20_000}}, None,
     ("workload.data.turns", "(max 20,000)", "at most 10,000 turns")),
    ({**SESSIONS, "turns": 5}, [{"rate": 1, "num_requests": 5_000_000}],
     ("workload.load.stages[0]: 5,000,000 sessions x 5 turns", "= 25,000,000 requests", "at most 10,000,000")),
    ({**SHARED, "num_groups": 1, "prompts_per_group": 1, "multi_turn": True}, [{"rate": 1, "num_requests": 100_000}],
     ("workload.load.stages[0]: 100,000 requests over 1 multi-turn user(s)", "100,000 rounds each",
      "at most 10,000")),
])
def test_unbounded_workload_sizes_are_refused_at_once(capsys, tmp_path, data, stages, parts) -> None:
    path = workload(tmp_path, data, stages)
    started = time.perf_counter()
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, f"--workload {path}: ", *parts)
    assert time.perf_counter() - started < 10


def test_sessions_draw_only_the_system_prompts_they_use() -> None:
    from infersim.serve.datasets import Traffic
    from infersim.serve.outcomes import Outcomes
    from infersim.serve.workload_spec import parse_workload

    spec = parse_workload({"load": {"stages": [{"rate": 1, "num_requests": 5}]},
                           "data": {**SESSIONS, "num_system_prompts": 10**12, "turns": 3,
                                    "system_prompt_len": {"dist": "uniform", "min": 10, "max": 20}}})
    traffic = Traffic(spec, 0, None, Outcomes())
    started = time.perf_counter()
    firsts = list(traffic.stage_requests(0, spec.stages[0], 0.0))
    assert time.perf_counter() - started < 5  # not 10^12 draws
    assert [req.segments[0][0] for req in firsts] == [("sys", 0, g) for g in range(5)]  # session j: prompt j


def test_a_session_drawing_more_turns_than_the_bound_is_refused(capsys, tmp_path) -> None:
    path = workload(tmp_path, {**SESSIONS, "turns": {"dist": "poisson", "mean": 10_000}},
                    [{"rate": 1, "num_requests": 20}])
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, "workload.data.turns poisson mean 10,000", "turns for a session", "at most 10,000",
                   "give the distribution a max")


def test_a_stage_rate_of_zero_names_the_file_and_the_key(capsys, tmp_path) -> None:
    path = workload(tmp_path, {"type": "random", "input": 10, "output": 10}, [{"rate": 0, "num_requests": 5}])
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, f"--workload {path}: workload.load.stages[0].rate", "positive number of requests per second",
                   "value: 0")


# -- prefix_repetition sends num_prefixes x (requests // num_prefixes), as vllm bench serve


def test_prefix_repetition_refuses_fewer_prompts_than_prefixes(capsys) -> None:
    code, _out, err = run(capsys, *SERVE, "--num-requests", "5", "--rate", "1", "--dataset-name", "prefix_repetition")
    assert code == 2
    one_line_error(err, "--num-prompts 5 with --prefix-repetition-num-prefixes 10 (its default)",
                   "give --num-prompts >= 10")


def test_prefix_repetition_reports_the_requests_it_sends(capsys) -> None:
    data = serve_json(capsys, "--num-requests", "15", "--rate", "1", "--dataset-name", "prefix_repetition")
    assert data["num_prompts"] == data["completed"] == 10
    assert "10 sent" in data["run"]["title"] and "15" not in data["run"]["title"]
    assert any("--num-prompts 15" in note and "10 requests sent" in note for note in data["notes"])


def test_a_prefix_repetition_stage_of_a_file_is_counted_as_sent(capsys, tmp_path) -> None:
    data = {"type": "prefix_repetition", "num_prefixes": 5, "prefix_len": 100, "suffix_len": 10, "output_len": 10}
    path = workload(tmp_path, data, [{"rate": 1, "num_requests": 12}, {"concurrency": 2, "num_requests": 5}])
    summary = serve_json(capsys, "--workload", path)
    assert [stage["num_prompts"] for stage in summary["stages"]] == [10, 5]
    assert any("stages[0]" in note and "10 of its 12 requests" in note for note in summary["notes"])
    path = workload(tmp_path, data, [{"rate": 1, "num_requests": 3}])
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, "workload.load.stages[0]: 3 requests with workload.data.num_prefixes 5", "at least 5")


# -- the random dataset keeps the config's lengths unless its flags give others


@pytest.mark.parametrize("flags", [("--random-prefix-len", "100"), ("--dataset-name", "random", "--random-prefix-len",
                                                                      "100")])
def test_dataset_flags_keep_the_configs_lengths(capsys, flags) -> None:
    data = serve_json(capsys, "--rate", "1", "--num-requests", "5", *flags)
    assert data["total_input_tokens"] == 5 * (100 + 2000) and data["total_output_tokens"] == 5 * 500
    assert any("input length 2,000 and output length 500 tokens, the config's workload.isl and workload.osl" in note
               and "1,024 and 128" in note for note in data["notes"])


def test_a_random_input_length_given_is_used_and_the_output_named(capsys) -> None:
    data = serve_json(capsys, "--rate", "1", "--num-requests", "5", "--dataset-name", "random",
                      "--random-input-len", "300")
    assert data["total_input_tokens"] == 5 * 300 and data["total_output_tokens"] == 5 * 500
    assert any(note.startswith("--random-output-len not given: output length 500 tokens, the config's workload.osl")
               for note in data["notes"])


# -- flags the load would not read are refused, each with its reason


@pytest.mark.parametrize("flags, parts", [
    (("--workload", CHAT, "--isl", "50"), ("--isl (--random-input-len) 50", f"--workload {CHAT} gives each request's "
                                                                              "lengths")),
    (("--workload", CHAT, "--num-requests", "5"), ("--num-requests 5 with --workload", "own request counts")),
    (("--workload", CHAT, "--burstiness", "2"), ("--burstiness 2 with --workload", "load.burstiness")),
    (("--workload", CHAT, "--disaggregate", "1P1D"), ("--disaggregate 1P1D with --workload", "colocated")),
    (("--workload", CHAT, "--prefix-hit-rate", "0.5"), ("--prefix-hit-rate 0.5 with --workload",)),
    (("--workload", CHAT, "--workers", "2"), ("--workers 2: runs the points of --rate-sweep",)),
    (("--trace", TRACE, "--osl", "50"), ("--osl (--random-output-len) 50", f"--trace {TRACE} gives")),
    (("--rate", "1", "--lengths-from", TRACE, "--isl", "50"), ("--isl (--random-input-len) 50",
                                                               f"--lengths-from {TRACE} draws")),
    (("--trace", TRACE, "--burstiness", "2"), ("--burstiness 2: shapes Poisson gaps", "rows give the arrival times")),
    (("--offline", "--burstiness", "2"), ("--burstiness 2", "--offline sends every request at t = 0")),
    (("--concurrency", "4", "--burstiness", "2"), ("--burstiness 2", "--concurrency 4 alone is a closed loop")),
    (("--offline", "--max-waiting", "5"), ("--max-waiting 5: bounds an open loop's queue", "--offline")),
    (("--concurrency", "4", "--rate", "2", "--max-waiting", "5"), ("--max-waiting 5", "--concurrency 4")),
    (("--rate", "1", "--dataset-path", TRACE), (f"--dataset-path {TRACE}: a flag of --dataset-name sharegpt",
                                                "the random dataset (no --dataset-name)")),
    (("--rate", "1", "--ramp-up-start-rps", "2"), ("--ramp-up-start-rps 2", "no --ramp-up-strategy is given")),
    (("--request-rate", "3", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"),
     ("--request-rate 3 with --ramp-up-strategy linear", "vllm bench serve refuses both too")),
    (("--rate", "1", "--dataset-name", "prefix_repetition", "--random-range-ratio", "0.3"),
     ("--random-range-ratio 0.3: a flag of --dataset-name random", "--dataset-name prefix_repetition")),
    (("--rate", "1", "--dataset-name", "prefix_repetition", "--random-input-len", "30"),
     ("--isl (--random-input-len) 30", "--prefix-repetition-prefix-len")),
    (("--rate", "1", "--dataset-name", "random", "--trace", TRACE), (f"--trace {TRACE} with --dataset-name random",
                                                                     "choose one load")),
    (("--max-concurrency", "3", "--dataset-name", "random", "--burstiness", "2"),
     ("--burstiness 2", "--max-concurrency 3 alone is a closed loop")),
    (("--rate", "1", "--dataset-name", "random", "--lengths-from", TRACE),
     (f"--lengths-from {TRACE}: --dataset-name random builds",)),
    (("--rate", "1", "--bench-tool", "sglang"), ("--bench-tool sglang", "give --dataset-name")),
    (("--rate", "1", "--router", "cache-aware", "--replicas", "2"), ("router cache-aware", "a poisson load's do not")),
    (("--rate", "1", "--include-requests"), ("--include-requests", "give --format json")),
    (("--rate", "1", "--requests-out", "x.txt"), ("--requests-out x.txt", ".jsonl", ".csv")),
    (("--rate", "1", "--requests-out", "x.json"), ("--requests-out x.json", "--include-requests --format json")),
    (("--rate", "1", "--slo", "ttft=2s", "--slo", "ttft=5s"), ("--slo 'ttft=5s': ttft is given twice",
                                                               "also in --slo 'ttft=2s'")),
    (("--rate", "1", "--slo", "ttft=2s,ttft=5s"), ("--slo 'ttft=2s,ttft=5s': ttft is given twice",)),
])
def test_a_flag_the_load_does_not_read_is_refused(capsys, flags, parts) -> None:
    code, _out, err = run(capsys, *SERVE, *flags)
    assert code == 2
    one_line_error(err, *parts)


def test_max_waiting_with_a_workload_of_closed_loops_only_is_refused(capsys, tmp_path) -> None:
    path = workload(tmp_path, {"type": "random", "input": 10, "output": 10}, [{"concurrency": 2, "num_requests": 4}])
    code, _out, err = run(capsys, *SERVE, "--workload", path, "--max-waiting", "3")
    assert code == 2
    one_line_error(err, "--max-waiting 3", f"every stage of --workload {path} is a closed loop")


def test_router_cache_aware_outside_a_workload_is_refused_by_the_api() -> None:
    from infersim.base.errors import InferSimError
    from infersim.run.config import load_run_config
    from infersim.serve.api import simulate_serving

    with pytest.raises(InferSimError, match="router cache-aware .* a trace load's do not"):
        simulate_serving(load_run_config("serve-llama-8b-h100.yaml"),
                         {"mode": "trace", "trace": TRACE, "router": "cache-aware", "replicas": 2})


# -- what the flags do read, they read whole


def test_repeated_slo_flags_are_merged(capsys) -> None:
    data = serve_json(capsys, "--rate", "1", "--num-requests", "5", "--slo", "ttft=2s", "--slo", "tpot=50ms")
    assert data["slo"] == {"ttft_ms": 2000.0, "tpot_ms": 50.0}


def test_slo_percentile_without_the_slo_search_is_refused(capsys, tmp_path) -> None:
    path = workload(tmp_path, {"type": "random", "input": 100, "output": 10})
    for load in (("--workload", path), ("--rate", "2", "--slo", "ttft=2s"), ("--rate-sweep", "2,4")):
        code, _out, err = run(capsys, *SERVE, *load, "--slo-percentile", "95")
        assert code == 2
        one_line_error(err, "--slo-percentile 95: the percentile of TTFT and TPOT that --max-rate-under-slo holds",
                       "drop it, or add --max-rate-under-slo")


def test_requests_out_writes_jsonl(capsys, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    code, _out, err = run(capsys, *SERVE, "--rate", "1", "--num-requests", "4", "--requests-out", str(out))
    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [0, 1, 2, 3]


def test_sharegpt_lengths_come_from_the_dataset_path(capsys) -> None:
    data = serve_json(capsys, "--rate", "1", "--num-requests", "5", "--dataset-name", "sharegpt",
                      "--dataset-path", TRACE)
    assert data["completed"] == 5 and data["total_input_tokens"] != 5 * 2000
