"""Hostile workload files, traces and flags for `infersim serve`, end to end: what the run does that was
not asked is said under NOTES, and what it cannot read as written is refused in one line naming the
file, key and value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_hostile_cli import one_line_error, run

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")


def workload_file(tmp_path: Path, data: dict, load: dict | None = None) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"load": load or {"stages": [{"rate": 50, "num_requests": 200}]}, "data": data}))
    return str(path)


def serve_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    code, out, err = run(capsys, *SERVE, *flags, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# -- lengths a workload file's distributions clip are said, as --isl/--osl ones are


def test_a_workload_files_clipped_lengths_are_said_with_their_count(capsys, tmp_path) -> None:
    path = workload_file(tmp_path, {"type": "random", "input": {"dist": "normal", "mean": 100, "std": 200},
                                    "output": {"dist": "normal", "mean": 20, "std": 40, "max": 25}})
    data = serve_json(capsys, "--workload", path, "--include-requests")
    records = data["requests"]
    assert len(records) == 200
    raised_inputs = sum(1 for r in records if r["input_tokens"] == 1)
    cut_outputs = sum(1 for r in records if r["output_tokens"] == 25)
    notes = {note.split(":")[0]: note for note in data["notes"]}
    raised = re.search(r"(\d+) of 200 draws fell below min 1 and were raised to it", notes["workload.data.input"])
    cut = re.search(r"(\d+) of 200 draws exceeded max 25 and were cut to it", notes["workload.data.output"])
    assert raised and cut
    # a length of 1 (25) is a draw raised (cut) to it, or one of the few that round to it (std 200: about
    # 200 x 0.002 expected in [0.5, 1.5); std 40: about 200 x 0.01 in (24.5, 25.5])
    assert raised_inputs - 3 <= int(raised.group(1)) <= raised_inputs and int(raised.group(1)) > 30
    assert cut_outputs - 6 <= int(cut.group(1)) <= cut_outputs and int(cut.group(1)) > 30
    realised = sum(r["input_tokens"] for r in records) / 200
    assert f"realised mean {realised:,.1f} tokens where the normal distribution's mean is 100" in \
        notes["workload.data.input"]


def test_a_workload_file_whose_lengths_are_not_clipped_says_nothing_of_them(capsys, tmp_path) -> None:
    path = workload_file(tmp_path, {"type": "random", "input": {"dist": "normal", "mean": 1000, "std": 10},
                                    "output": {"dist": "uniform", "min": 5, "max": 9}})
    data = serve_json(capsys, "--workload", path)
    assert not any("workload.data" in note for note in data.get("notes", []))


# -- a ramp sets its stage's rate; a rate of the stage's own is refused, not dropped

RAMP = {"strategy": "linear", "start_rps": 1, "end_rps": 4}
RANDOM = {"type": "random", "input": 100, "output": 10}


def test_a_ramps_stage_rate_is_refused_naming_the_file_key_and_value(capsys, tmp_path) -> None:
    path = workload_file(tmp_path, RANDOM, {"timer": "vllm", "ramp_up": RAMP,
                                            "stages": [{"rate": 50, "num_requests": 100}]})
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, f"--workload {path}: workload.load.stages[0].rate: 50 with load.ramp_up",
                   "the ramp sets the rate", "give the stage num_requests only")


def test_a_ramp_sends_at_the_rates_it_ramps_through(capsys, tmp_path) -> None:
    path = workload_file(tmp_path, RANDOM, {"timer": "vllm", "ramp_up": RAMP, "stages": [{"num_requests": 400}]})
    data = serve_json(capsys, "--workload", path, "--include-requests")
    last = max(r["arrival_s"] for r in data["requests"])
    # request i's gap is exponential at 1 + 3 i / 399 req/s: the sends span sum(1 / rate) (its sd ~ 1.5 s)
    expected = sum(1 / (1 + 3 * i / 399) for i in range(400))
    assert last == pytest.approx(expected, rel=0.06)
    stage = data["stages"][0]
    assert stage["rate"] is None and stage["ramp"] == {"strategy": "linear", "start_rps": 1.0, "end_rps": 4.0}


# -- the pause between stages: 0 or more seconds, within the serving clock


@pytest.mark.parametrize("value, parts", [
    (-1, ("workload.load.interval_s: -1", "at least 0")),
    (1e14, ("workload.load.interval_s: 100000000000000.0", "1 pause(s) of 1e+14 s", "beyond the 9.01e+09 s",
            "a pause at most 9.01e+09 s")),
    ("soon", ("workload.load.interval_s: 'soon'", "expected a number")),
])
def test_an_interval_out_of_range_is_refused(capsys, tmp_path, value, parts) -> None:
    path = workload_file(tmp_path, RANDOM, {"stages": [{"rate": 5, "num_requests": 5}] * 2, "interval_s": value})
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, f"--workload {path}: ", *parts)


def test_an_interval_pauses_between_stages(capsys, tmp_path) -> None:
    starts = []
    for interval in (0, 7.5):
        path = workload_file(tmp_path, RANDOM, {"stages": [{"rate": 5, "num_requests": 5}] * 2, "interval_s": interval})
        stages = serve_json(capsys, "--workload", path)["stages"]
        starts.append(stages[1]["start_s"] - stages[0]["end_s"])
    assert starts == pytest.approx([0.0, 7.5])


# -- a trace's cells the replay would not read: unknown columns said, cells it cannot place refused


def test_a_traces_unknown_columns_and_keys_are_named_under_notes(capsys, tmp_path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("arrival_s,input_tokens,output_tokens,user,prefixid\n0,100,10,a,x\n0.5,200,20,b,y\n")
    data = serve_json(capsys, "--trace", str(csv_path))
    assert (data["completed"], data["total_input_tokens"]) == (2, 300)
    assert any(note.startswith(f"trace {csv_path}: not read: columns 'user', 'prefixid' (") and
               "prefix_id: prefix_id" in note for note in data["notes"])
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"arrival_s": 0, "input_tokens": 100, "output_tokens": 10}\n'
                     '{"arrival_s": 0.5, "input_tokens": 200, "output_tokens": 20, "model": "m"}\n')
    data = serve_json(capsys, "--trace", str(jsonl))
    assert any(note.startswith(f"trace {jsonl}: not read: column 'model' (") for note in data["notes"])
    data = serve_json(capsys, "--rate", "2", "--num-requests", "3", "--lengths-from", str(csv_path))
    assert any(note.startswith(f"trace {csv_path}: not read: columns 'user', 'prefixid'") for note in data["notes"])


def test_a_trace_read_whole_has_no_such_note(capsys) -> None:
    data = serve_json(capsys, "--trace", "docs/examples/azure-style-trace.csv")
    assert not any("not read" in note for note in data.get("notes", []))


@pytest.mark.parametrize("name, body, parts", [
    ("t.csv", "arrival_s,input_tokens,output_tokens\n0,100,10\n0.1,100,10,7\n",
     ("row 2: 4 cells where the header names 3 columns (cell 4: '7')", "not guessed")),
    ("t.csv", "arrival_s,input_tokens,output_tokens,prefix_tokens\n0,100,10,50\n",
     ("column prefix_tokens (column 4) without a prefix_id column", "add prefix_id")),
    ("t.csv", "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,10,s,50\n0.1,100,10,,50\n",
     ("row 2, column prefix_tokens: '50' without a prefix_id", "give the row a prefix_id")),
    ("t.jsonl", '{"arrival_s": 0, "input_tokens": 100, "output_tokens": 10, "prefix_tokens": 50}\n',
     ("row 1, column prefix_tokens: 50 without a prefix_id",)),
])
def test_trace_cells_the_replay_cannot_place_are_refused(capsys, tmp_path, name, body, parts) -> None:
    path = tmp_path / name
    path.write_text(body)
    code, _out, err = run(capsys, *SERVE, "--trace", str(path))
    assert code == 2
    one_line_error(err, f"trace {path}: ", *parts)


def test_a_trailing_comma_and_a_zero_prefix_without_an_id_are_read(capsys, tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,10,,0,\n0.5,200,20,,\n")
    data = serve_json(capsys, "--trace", str(path))
    assert (data["completed"], data["total_input_tokens"], data["total_output_tokens"]) == (2, 300, 30)


# -- a distribution key the distribution does not read is refused, naming the key and the dist


@pytest.mark.parametrize("spec, parts", [
    ("{dist: uniform, min: 10, max: 20, std: 5}", ("isl: dist uniform reads min, max, not 'std'", "drop it")),
    ("{dist: uniform, mean: 15, min: 10, max: 20}", ("dist uniform reads min, max, not 'mean'",)),
    ("{dist: fixed, mean: 100, std: 10}", ("dist fixed reads mean, not 'std'", "a fixed length is its mean")),
    ("{mean: 100, min: 1, max: 50}", ("dist fixed reads mean, not 'min', 'max'", "drop them")),
    ("{dist: poisson, mean: 100, std: 3}", ("dist poisson reads mean, min, max, not 'std'", "its variance is its mean")),
])
def test_a_distribution_key_its_dist_does_not_read_is_refused(capsys, spec, parts) -> None:
    code, _out, err = run(capsys, *SERVE, "--rate", "2", "--num-requests", "5", "--isl", spec)
    assert code == 2
    one_line_error(err, *parts)


def test_a_workload_files_unread_distribution_key_names_the_file_and_key(capsys, tmp_path) -> None:
    path = workload_file(tmp_path, {"type": "random", "input": 100,
                                    "output": {"dist": "uniform", "min": 5, "max": 9, "std": 2}})
    code, _out, err = run(capsys, *SERVE, "--workload", path)
    assert code == 2
    one_line_error(err, f"--workload {path}: workload.data.output: dist uniform reads min, max, not 'std'")


def test_every_key_a_distribution_reads_is_taken(capsys) -> None:
    data = serve_json(capsys, "--rate", "2", "--num-requests", "40", "--isl", "{dist: poisson, mean: 100, min: 90, "
                      "max: 110}", "--osl", "{dist: skew_normal, mean: 20, std: 4, skew: 2, min: 10, max: 30}",
                      "--include-requests")
    assert all(90 <= r["input_tokens"] <= 110 and 10 <= r["output_tokens"] <= 30 for r in data["requests"])


# -- the overload line says what it measured


def test_an_overload_with_no_admission_to_time_says_its_capacity_was_not_measured(capsys) -> None:
    flags = ("--rate", "1000", "--num-requests", "30", "--isl", "100000", "--osl", "1000", "--max-waiting", "1")
    data = serve_json(capsys, *flags)
    load = data["load"]
    assert load["overloaded"] and load["saturated_capacity_rps"] is None
    assert load["saturated_capacity_unmeasured"] == ("no request was admitted over the second half of the arrivals, "
                                                     "so no admission rate to take")
    code, out, err = run(capsys, *SERVE, *flags)
    assert code == 0
    assert "saturated capacity 0.000" not in out and "served 0 req/s" not in err
    assert ("saturated capacity not measured (no request was admitted over the second half of the arrivals, so no "
            "admission rate to take); 2 requests admitted, 28 left waiting") in out
    assert "its engines could not keep up (saturated capacity not measured: no request was admitted" in err


def test_backlog_growth_rounding_is_zero(capsys) -> None:
    from infersim.serve.overload import Timeline, assess_stage

    # 37 requests admitted as they arrive: the second half's counts match to the last bin share
    data = serve_json(capsys, "--rate", "3", "--num-requests", "37", "--isl", "300", "--osl", "20")
    assert data["load"]["backlog_growth"] == 0.0 and data["load"]["arrived_second_half"] > 18
    timeline = Timeline()
    for i in range(1000):
        timeline.request(0.0137 * i, 0.0137 * i)
    load = assess_stage(timeline, 0, 0.0, 0.0137 * 999, 1000, 0)
    assert load.backlog_growth == 0.0 and not load.overloaded
    timeline.arrival(10.0)  # one request arrived in the second half and never admitted is one, not rounding
    assert assess_stage(timeline, 0, 0.0, 0.0137 * 999, 1001, 0).backlog_growth == pytest.approx(1.0)


# -- one rule for a request too long for the KV pool: on arrival and in the scheduler


@pytest.mark.parametrize("engine, longest", [
    ("trtllm", 992),  # reserve-full in pages of 32: 31 whole pages of a 1,000-token pool
    # on-demand in pages of 16: the pool is 62 whole pages (992 tokens); 985 - 1 tokens of context at the last
    # step + 7.5 mean page slack
    ("vllm", 985),
])  # SGLang cuts such a request to its pool itself (context_limit.kv_pool): tests/test_serve_kv_pool.py
def test_a_request_too_long_for_the_pool_is_treated_alike_on_arrival_and_in_the_scheduler(engine, longest) -> None:
    from infersim.base.errors import NotPossible
    from infersim.serve.api import simulate_serving
    from test_serve_workloads import config

    spec = config(engine)
    for total in (longest, longest + 1):
        fits = total == longest
        # a conversation whose turn holds `total` tokens: rejected on arrival where it cannot run alone
        form = {"load": {"stages": [{"rate": 1, "num_requests": 1}]},
                "data": {"type": "sessions", "system_prompt_len": 0, "turns": 1, "question_len": total - 10,
                         "output_len": 10}}
        staged = simulate_serving(spec, {"workload": form, "kv_capacity_tokens": 1000})
        assert (staged["completed"], staged.get("rejected", 0)) == ((1, 0) if fits else (0, 1))
        # the same request in a Poisson stream (no arrival check): the scheduler runs it, or refuses it by the rule
        stream = {"mode": "poisson", "rate": 1, "num_requests": 1, "isl": total - 10, "osl": 10,
                  "kv_capacity_tokens": 1000}
        if fits:
            assert simulate_serving(spec, stream)["completed"] == 1
        else:
            with pytest.raises(NotPossible, match=f"the longest request it runs holds {longest:,} tokens"):
                simulate_serving(spec, stream)
