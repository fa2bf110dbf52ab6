"""Hostile input, round 4: one rule for every JSON and structured-flag reader (nesting and length),
and the classes of bad input each reader refuses with one line naming the file or flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.base.errors import InferSimError
from infersim.base.plaindata import MAX_NESTING, JsonError, loads_json, parse_flag_value, text_nesting, value_nesting
from test_hostile_cli import one_line_error, run

DEEP = "[" * 100_000 + "]" * 100_000


def deep_json_file(path: Path, top: dict) -> Path:
    path.write_text(json.dumps(top)[:-1] + ', "deep": ' + DEEP + "}")
    return path


# -- the rule itself

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3),
                           max_leaves=30)


@given(json_values)
@settings(max_examples=200, deadline=None)
def test_text_nesting_is_the_parsed_values_nesting(value) -> None:
    assert text_nesting(json.dumps(value)) == value_nesting(value)


@given(st.text(alphabet="[]{}\"'\\,:ab 0", max_size=200))
@settings(max_examples=300, deadline=None)
def test_a_flag_value_is_read_or_refused_in_one_message(raw: str) -> None:
    try:
        parse_flag_value(raw, "--set x=")
    except InferSimError as exc:
        assert str(exc).startswith("--set x= ")


@given(st.text(alphabet="[]{}\"\\,:1 ", max_size=200))
@settings(max_examples=300, deadline=None)
def test_json_text_is_read_or_refused_in_one_message(text: str) -> None:
    try:
        loads_json(text, "f.json")
    except JsonError as exc:
        assert str(exc).startswith("f.json: ")


def test_the_depth_limit_is_exact() -> None:
    ok = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert value_nesting(loads_json(ok, "f")) == MAX_NESTING
    with pytest.raises(JsonError, match=f"nested {MAX_NESTING + 1} levels deep; at most {MAX_NESTING}"):
        loads_json("[" + ok + "]", "f")
    assert text_nesting('["[[[", "\\"]]"]') == 1  # brackets inside strings do not count


# -- every reader, through the command line


def test_deep_hf_config_is_one_line_for_a_run_and_for_import(tmp_path, capsys) -> None:
    config = deep_json_file(tmp_path / "config.json", {"architectures": ["LlamaForCausalLM"], "hidden_size": 8})
    for argv in (["--model", str(config), "--hardware", "h100"], ["cards", "import-hf", str(config), "--out", "-"]):
        code, _out, err = run(capsys, *argv)
        assert code == 2
        one_line_error(err, str(config), "nested 100,001 levels deep")


def test_deep_bench_result_is_one_line(tmp_path, capsys) -> None:
    result = deep_json_file(tmp_path / "bench.json", {"backend": "vllm", "num_prompts": 1})
    code, _out, err = run(capsys, "compare", "--bench-result", str(result), "--config", "serve-llama-8b-h100.yaml")
    assert code == 2
    one_line_error(err, str(result), "nested")


def test_deep_trace_replay_row_is_one_line(tmp_path, capsys) -> None:
    trace = tmp_path / "requests.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}\n' + '{"x": ' + DEEP + "}\n")
    code, _out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--trace", str(trace))
    assert code == 2
    one_line_error(err, "row 2", "nested")


@pytest.mark.parametrize("argv", [
    ["--config", "qwen3-30b.yaml", "--set", "workload.isl=" + "[" * 50_000],
    ["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.isl=" + "[" * 1000],
    ["serve", "--config", "serve-llama-8b-h100.yaml", "--rate", "1", "--isl", "{a: " + "[" * 1000],
])
def test_deep_flag_values_are_one_line(capsys, argv) -> None:
    code, _out, err = run(capsys, *argv)
    assert code == 2
    one_line_error(err, "levels deep")


def test_an_over_long_flag_value_is_one_line(capsys) -> None:
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.isl=" + "1" * 200_000)
    assert code == 2
    one_line_error(err, "--set workload.isl=", "a value of 200,000 characters; at most 100,000")


# -- traces


def test_a_gzip_bomb_value_is_refused_after_reading_it_a_few_times(tmp_path, monkeypatch) -> None:
    """A 40 MB string compressed to ~40 KB: refused at the 16 MiB value limit, and the text after
    the value's start is scanned a handful of times (each read doubles it), not once per 1 MiB chunk."""
    import gzip

    from infersim.trace import reader

    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"traceEvents": [{"name": "' + "a" * (40 << 20) + '"}]}')
    scans = []

    def counting(text, pos):
        scans.append(len(text) - pos)
        return reader.json.JSONDecoder().scan_once(text, pos)

    monkeypatch.setattr(reader, "_SCANNER", counting)
    with pytest.raises(reader.TraceFormatError, match=r"traceEvents\[0\] at character 17 is larger than 16 MiB"):
        list(reader.ChromeTraceReader(path))
    assert len(scans) <= 8 and sum(scans) <= 4 * reader.MAX_VALUE_CHARS  # once per chunk: 16 scans, 136 MiB


def test_launches_sharing_one_correlation_id_cost_linear_memory(tmp_path, capsys) -> None:
    """4,500 launches and kernels all with correlation id 1 (a merged or rewritten trace): each
    kernel gets the latest launch before it, with memory linear in the events (a few MB; a
    candidate list per kernel is quadratic: 4 GB for 12,000, some 560 MB for these)."""
    import tracemalloc

    from tracegen.synthetic import TraceBuilder, dense_step, write_trace

    b = TraceBuilder()
    start = b.cpu_us
    for _ in range(150):
        b.eager(dense_step(2))
    b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
    events = b.drain()
    for event in events:
        if "correlation" in event.get("args", {}):
            event["args"]["correlation"] = 1
    assert sum(1 for e in events if e.get("cat") == "kernel") >= 4_500
    path = write_trace(tmp_path / "shared-corr.json.gz", events)
    tracemalloc.start()
    try:
        code, out, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code in (0, 1), err
    assert peak < 100e6, f"peak traced memory {peak / 1e6:.0f} MB"


def _dense_trace(tmp_path: Path, name: str, edit=None, repeat: bool = False) -> Path:
    from tracegen.synthetic import TraceBuilder, dense_step, write_trace

    b = TraceBuilder()
    start = b.cpu_us
    b.eager(dense_step(2))
    b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
    events = b.drain()
    if edit is not None:
        kernels = [e for e in events if e.get("cat") == "kernel"]
        edit(kernels)
    if repeat:
        events = events + [dict(e) for e in events if e.get("cat") == "kernel"]
    return write_trace(tmp_path / name, events)


def _measured(capsys, path: Path) -> tuple[str, str]:
    code, out, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml")
    assert code in (0, 1), err
    return out, err


def test_impossible_kernel_durations_are_dropped_and_counted(tmp_path, capsys) -> None:
    def edit(kernels):
        kernels[0]["dur"] = 1e300
        kernels[1]["dur"] = -5.0
        kernels[2]["dur"] = "NaN"
        kernels[3]["ts"] = float("inf")

    out, _err = _measured(capsys, _dense_trace(tmp_path, "bad.json", edit))
    assert "1 GPU event dropped: duration longer than an hour" in out
    assert "1 GPU event dropped: negative duration" in out
    assert "2 GPU events dropped: timestamp or duration not a finite number" in out
    activities = next(line for line in out.splitlines() if line.startswith("GPU activities:"))
    assert activities.startswith("GPU activities: 26 (") and float(activities.split("(")[1].split()[0]) < 1.0


def test_a_trace_with_every_kernel_twice_measures_as_once(tmp_path, capsys) -> None:
    once, _ = _measured(capsys, _dense_trace(tmp_path, "once.json"))
    twice, _ = _measured(capsys, _dense_trace(tmp_path, "twice.json", repeat=True))
    assert "GPU events dropped: exact repeats of another kernel" in twice
    same = [line for line in once.splitlines() if line.startswith(("GPU activities:", "step time", "attn_", "dense_ffn"))]
    assert len(same) >= 4 and all(line in twice.splitlines() for line in same)


def test_args_that_are_not_objects_and_unknown_step_regions_are_said(tmp_path, capsys) -> None:
    def edit(kernels):
        kernels[0]["args"] = [1, 2]
        kernels[1]["name"] = 12345

    path = _dense_trace(tmp_path, "odd.json", edit)
    out, _ = _measured(capsys, path)
    assert "1 events with `args` that is not an object" in out and "1 events with a name that is not text" in out
    code, out, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml",
                         "--step-regions", "nosuchregion")
    assert "no annotation named nosuchregion in the trace (--step-regions)" in out
