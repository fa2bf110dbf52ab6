"""Hostile input, end to end through `infersim.cli.main.main`: every hostile case gives one clear
message (or a correct number) and the documented exit status: 0 ok, 1 does not fit / nothing to
compare, 2 bad input, never 3 (internal error) and never a traceback."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from infersim.cli.main import main
from tracegen.synthetic import TraceBuilder, dense_step, write_trace

H20 = REPO_ROOT / "hardware" / "h20.yaml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def one_line_error(err: str, *parts: str) -> str:
    """Exactly one line on stderr, naming every part; that line."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


SPEED = re.compile(r"(TTFT|TPOT) [\d,.]+ ms|[\d,]+ tokens/GPU/s")


def no_speed(out: str) -> bool:
    """No TTFT, TPOT or throughput number in a text report."""
    return not SPEED.search(out)


def card_with(tmp_path: Path, source: Path, name: str, section: str, key: str, value: str) -> Path:
    """A copy of a bundled card with one value replaced textually (so YAML spellings like .inf stay)."""
    text = source.read_text()
    lines = [f"  {key}: {value}" if line.startswith(f"  {key}:") and section else line for line in text.splitlines()]
    assert lines != text.splitlines(), key
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- numbers: one rule everywhere ------------------------------------------------------------


@pytest.mark.parametrize("key, value", [("hbm_bytes", ".inf"), ("hbm_bandwidth", ".inf"), ("hbm_bandwidth", ".nan"),
                                        ("hbm_bandwidth", "-.inf")])
def test_non_finite_card_values_are_refused(tmp_path, capsys, key, value):
    card = card_with(tmp_path, H20, "bad.yaml", "peak", key, value)
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"hardware={card}")
    assert code == 2 and out == ""
    one_line_error(err, str(card), f"field 'peak.{key}'", "must be a finite number")


@pytest.mark.parametrize("text", ["inf", "nan", "-inf", ".inf", "Infinity"])
def test_set_uses_the_same_rule_and_message(capsys, text):
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"hardware.peak.hbm_bandwidth={text}")
    assert code == 2
    one_line_error(err, "field 'peak.hbm_bandwidth'", "must be a finite number")


def test_counts_are_whole_and_bounded(capsys):
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.decode_batch_per_gpu=1e30")
    assert code == 2
    one_line_error(err, "field 'workload.decode_batch_per_gpu'", "too large")
    for batch in ("-1", "0"):  # a batch below one request was simulated into negative throughput
        code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"workload.decode_batch_per_gpu={batch}")
        assert code == 2
        one_line_error(err, "field 'workload.decode_batch_per_gpu'", "must be greater than 0")
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.isl=4096.5")
    assert code == 2
    one_line_error(err, "field 'workload.isl'", "expected a whole number")
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "model.num_hidden_layers=1e9")
    assert code == 2
    one_line_error(err, "field 'num_hidden_layers'", "must be at most")


def test_yaml_float_for_a_count_in_a_file(tmp_path, capsys):
    config = yaml.safe_load((REPO_ROOT / "configs" / "qwen3-30b.yaml").read_text())
    config["workload"]["decode_batch_per_gpu"] = 1e30
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = run(capsys, "--config", str(path))
    assert code == 2 and no_speed(out)
    one_line_error(err, "workload.decode_batch_per_gpu", "too large")


def test_tiny_gemm_tile_padding_is_never_zero(capsys):
    """A GEMM tile taller than the batch is one tile: gemm_tile_m 1e15 must not make decode faster."""
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--format", "json")
    base = json.loads(out)["decode"]["tpot_ms"]
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--format", "json",
                       "--set", "hardware.derates.gemm_tile_m=1000000000000000")
    assert code == 0 and json.loads(out)["decode"]["tpot_ms"] > base


# ---- does not fit ------------------------------------------------------------------------------


def test_model_that_does_not_fit_prints_no_throughput(capsys):
    args = ("--config", "qwen3-30b.yaml", "--set", "model=llama-3.1-70b", "--set", "deployment.ffn.ep=1")
    code, out, err = run(capsys, *args)
    assert code == 1
    # four DP replicas (FFN EP1): each holds the whole 2.10 GB LM head (128,256 x 8,192 bf16), not a quarter of it
    assert "DOES NOT FIT" in out and "weights need 141.11 GB per GPU" in out and "over by 51.77 GB" in out
    assert "KV cache space -" not in out and "no KV cache space (weights exceed what is left by 51.77 GB)" in out
    assert no_speed(out)
    one_line_error(err, "does not fit", "weights need")
    code, out, _ = run(capsys, *args, "--show-unfit")
    assert code == 1
    assert "[DOES NOT FIT: not achievable] PREFILL  step" in out and "[DOES NOT FIT: not achievable] DECODE" in out
    code, out, _ = run(capsys, *args, "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["fits"] is False and "weights need" in data["unfit_reasons"][0]
    assert data["decode"]["tpot_ms"] > 0  # JSON keeps the numbers, marked by fits: false


def test_batch_beyond_memory_says_which_limit_and_by_how_much(capsys):
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.decode_batch_per_gpu=1000000000000")
    assert code == 1 and no_speed(out)
    assert "decode batch 1,000,000,000,000 per GPU needs" in out and "at most 119 requests per GPU fit" in out
    one_line_error(err, "does not fit", "decode batch")


def test_prompt_longer_than_memory_does_not_fit(capsys):
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.isl=1000000000000")
    assert code == 1 and "one request of 1,000,000,002,048 tokens needs" in out


def test_bundled_examples_fit(capsys):
    for config in sorted((REPO_ROOT / "configs").glob("*.yaml")):
        code, out, err = run(capsys, "--config", str(config))
        assert code == 0, (config, err)


# ---- compare --bench-result ----------------------------------------------------------------------


def bench_file(tmp_path: Path, **fields: object) -> Path:
    line = {"batch_size": 64, "input_len": 1024, "output_len": 16, "prefill_latency": 0.8,
            "median_decode_latency": 0.025, **fields}
    path = tmp_path / "result.jsonl"
    path.write_text(json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize("field, value, problem", [
    ("batch_size", 1e300, "too large"),
    ("input_len", 1e300, "too large"),
    ("batch_size", 0, "must be greater than 0"),
    ("input_len", -5, "must be greater than 0"),
    ("prefill_latency", -0.1, "must be greater than 0"),
    ("median_decode_latency", 1e300, "out of range"),
    ("batch_size", 2.5, "expected a whole number"),
    ("output_len", "many", "expected a whole number"),
    ("prefill_latency", float("inf"), "must be a finite number"),
    ("prefill_latency", float("nan"), "must be a finite number"),
])
def test_bench_results_go_through_the_same_rule(tmp_path, capsys, field, value, problem):
    path = bench_file(tmp_path, **{field: value})
    code, out, err = run(capsys, "compare", "--bench-result", str(path), "--config", "qwen3-30b.yaml")
    assert code == 2 and out == ""
    one_line_error(err, f"{path}: line 1", f"field '{field}'", problem)


def test_bench_workload_too_large_per_gpu_is_refused(tmp_path, capsys):
    path = bench_file(tmp_path, batch_size=10**15, input_len=10**15)
    code, _, err = run(capsys, "compare", "--bench-result", str(path), "--config", "qwen3-30b.yaml")
    assert code == 2
    one_line_error(err, "prefill_tokens_per_gpu", "too large")


def test_bench_with_nothing_to_compare_exits_1(tmp_path, capsys):
    path = bench_file(tmp_path, prefill_latency=None, median_decode_latency=None)
    code, out, err = run(capsys, "compare", "--bench-result", str(path), "--config", "qwen3-30b.yaml")
    assert code == 1 and out == ""
    one_line_error(err, "nothing to compare")


# ---- HF configs ------------------------------------------------------------------------------------

HF = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336}


@pytest.mark.parametrize("field, value, problem", [
    ("num_attention_heads", 0, "must be greater than 0"),
    ("hidden_size", "4096x", "expected a whole number"),
    ("hidden_size", [4096], "expected a whole number"),
    ("num_hidden_layers", -3, "must be greater than 0"),
    ("vocab_size", 1e300, "too large"),
])
def test_hf_import_validates_before_arithmetic(tmp_path, capsys, field, value, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, field: value}))
    code, _, err = run(capsys, "cards", "import-hf", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    one_line_error(err, str(path), f"field '{field}'", problem)
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"model={path}")
    assert code == 2
    one_line_error(err, f"field '{field}'", problem)


def test_hf_infinity_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "hidden_size": float("inf")}))  # json writes Infinity
    code, _, err = run(capsys, "cards", "import-hf", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    one_line_error(err, "field 'hidden_size'", "must be a finite number")


def test_hf_numeric_text_is_the_number(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "hidden_size": "4096"}))
    code, _, _ = run(capsys, "cards", "import-hf", str(path), "--out", str(tmp_path / "out"))
    assert code == 0
    (written,) = (tmp_path / "out").glob("*.yaml")
    card = yaml.safe_load(written.read_text())
    assert card["hidden_size"] == 4096 and card["head_dim"] == 128


# ---- traces from pipes and stdin --------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = TraceBuilder()
    start = b.cpu_us
    b.eager(dense_step(2))
    b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
    return write_trace(tmp_path_factory.mktemp("pipe") / "run-TP-0.trace.json.gz", b.drain())


def _feed(data: bytes) -> int:
    """A pipe whose write end a thread fills with `data`: the read end's fd."""
    read_fd, write_fd = os.pipe()

    def writer() -> None:
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)

    threading.Thread(target=writer, daemon=True).start()
    return read_fd


def test_trace_from_a_pipe_streams(trace_file, capsys):
    code, expected, _ = run(capsys, "compare", "--trace", str(trace_file))
    assert code == 0
    fd = _feed(trace_file.read_bytes())
    try:
        code, out, err = run(capsys, "compare", "--trace", f"/dev/fd/{fd}")
    finally:
        os.close(fd)
    assert code == 0, err
    assert out.splitlines()[1:] == expected.splitlines()[1:]  # same analysis; only the name differs


def test_trace_from_stdin(trace_file, capsys, monkeypatch):
    import gzip

    fd = _feed(gzip.decompress(trace_file.read_bytes()))  # plain JSON on stdin
    monkeypatch.setattr(sys, "stdin", os.fdopen(fd, "r"))
    code, out, err = run(capsys, "compare", "--trace", "-")
    assert code == 0, err
    assert out.startswith("Trace - ") and "prefill" in out.lower()


def test_trace_with_nothing_to_compare_exits_1(tmp_path, capsys):
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    code, _, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml")
    assert code == 1
    one_line_error(err, "nothing to compare", str(path))


# ---- kernel tables ----------------------------------------------------------------------------------


def scaled_tables(tmp_path: Path, name: str, divide: float) -> Path:
    """A copy of the bundled H20 tables with one CSV's latencies divided by `divide` (and its
    efficiency column kept consistent, as a table with a unit slip would be)."""
    import shutil

    target = tmp_path / "h20"
    shutil.copytree(REPO_ROOT / "mfu_tables" / "imported" / "h20", target)
    for path in target.iterdir():
        path.chmod(0o644)
    table = target / name
    rows = list(csv.reader(table.open()))
    lat, eff = rows[0].index("latency_us"), rows[0].index("efficiency")
    for row in rows[1:]:
        row[lat] = f"{float(row[lat]) / divide:.10g}"
        row[eff] = f"{float(row[eff]) * divide:.6g}"
    with table.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)
    return target


def test_table_latency_off_by_1000_is_refused(tmp_path, capsys):
    tables = scaled_tables(tmp_path, "attention_decode_mha_32-4-128.csv", 1000)
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--mfu-tables", str(tables))
    assert code == 2 and out == ""
    one_line_error(err, "attention_decode_mha_32-4-128.csv:2", "field 'latency_us'", "implies efficiency")


def test_table_faster_than_hbm_is_refused_naming_the_row(tmp_path, capsys):
    tables = scaled_tables(tmp_path, "attention_decode_mha_32-4-128.csv", 1.5)
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--mfu-tables", str(tables))
    assert code == 2 and out == ""
    one_line_error(err, "attention_decode_mha_32-4-128.csv:", "HBM peak of hardware card h20")


def test_tables_of_a_faster_gpu_never_beat_this_cards_hbm(capsys):
    """H20 tables scaled to an H800 card by FLOP/s would stream faster than H800 HBM: floored."""
    code, out, _ = run(capsys, "--config", "qwen3-30b.yaml", "--format", "json", "--set", "hardware=h800",
                       "--set", "workload.decode_batch_per_gpu=64",
                       "--mfu-tables", str(REPO_ROOT / "mfu_tables" / "imported" / "h20"))
    assert code == 0
    data = json.loads(out)
    bandwidth = yaml.safe_load((REPO_ROOT / "hardware" / "h800.yaml").read_text())["peak"]["hbm_bandwidth"]
    attention = [op for op in data["decode"]["modules"] if op["module"] == "attn_core"]
    assert attention and all(op["time_us"] * 1e-6 >= op["bytes"] / float(bandwidth) * (1 - 1e-9) for op in attention)
    assert any("raised to the HBM bound" in op["detail"] for op in attention)


def test_table_cell_inf_is_refused(tmp_path, capsys):
    tables = scaled_tables(tmp_path, "attention_decode_mha_32-4-128.csv", 1)
    table = tables / "attention_decode_mha_32-4-128.csv"
    rows = list(csv.reader(table.open()))
    rows[1][rows[0].index("kv_len")] = "inf"
    with table.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--mfu-tables", str(tables))
    assert code == 2
    one_line_error(err, "attention_decode_mha_32-4-128.csv:2", "field 'kv_len'", "must be a finite number")


# ---- sweeps --------------------------------------------------------------------------------------------


def test_a_bad_card_the_grid_names_is_refused_before_the_run(tmp_path, capsys):
    """A card file is the command line's input, as a bad --grid value is: one message, not a row."""
    card = card_with(tmp_path, H20, "inf.yaml", "peak", "hbm_bytes", ".inf")
    code, out, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--grid", f"hardware=h20,{card}")
    assert code == 2 and not out
    one_line_error(err, f"--grid hardware={card}", "peak.hbm_bytes", "must be a finite number")


def test_inf_in_a_grid_is_one_message(capsys):
    code, _, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--grid", "hardware.peak.hbm_bytes=96e9,.inf")
    assert code == 2
    one_line_error(err, "hardware.peak.hbm_bytes", "must be a finite number")


def test_internal_error_in_a_row_does_not_end_the_sweep(monkeypatch):
    from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep
    from infersim.sweep import evaluate

    real = evaluate.Evaluator._point

    def flaky(self, point, values, out):  # a bug that only one row's values hit
        if values[0] == 2048:
            raise ValueError("cannot convert float NaN to integer")
        return real(self, point, values, out)

    monkeypatch.setattr(evaluate.Evaluator, "_point", flaky)
    spec = SweepSpec(load_base("qwen3-30b.yaml"), tuple(parse_grid(["workload.isl=1024,2048,4096"])))
    result = run_sweep(spec, workers=1, progress=False)
    assert [r.ok for r in result.rows] == [True, False, True]
    assert "internal error (ValueError: cannot convert float NaN to integer)" in result.rows[1].status


def test_sweep_where_nothing_fits_says_why_without_empty_parentheses(capsys):
    code, _, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--set", "model=llama-3.1-70b",
                       "--set", "deployment.ffn.ep=1", "--gpus", "1", "--batch", "1..4", "--max-tp", "1", "--max-pp", "1")
    assert code == 1
    assert "()" not in err and "KV cache does not fit" in err.splitlines()[-1]


@pytest.mark.parametrize("args, problem", [
    (["--target-tpot-ms", "nan"], "must be a finite number"),
    (["--price-per-gpu-hour", "inf"], "must be a finite number"),
    (["--gpus", "4", "--max-tp", "0"], "must be greater than 0"),
])
def test_sweep_options_use_the_rule(capsys, args, problem):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.isl=1024", *args])
    assert exc.value.code == 2
    assert problem in capsys.readouterr().err


def test_gpu_search_of_a_billion_gpus_is_a_message(capsys):
    code, _, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--gpus", "1e9")
    assert code == 2
    one_line_error(err, "--gpus", "must be at most")


def test_progress_lines_when_stderr_is_not_a_terminal():
    from infersim.sweep.runner import Progress

    stream = io.StringIO()
    bar = Progress(1000, stream, None, interval_s=0.0)
    bar.update(10, 10)
    time.sleep(0.01)
    bar.update(500, 500)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()
    assert lines[1].startswith("infersim: sweep progress: 50.0%, 500 of 1,000 units")
    quiet = io.StringIO()
    Progress(1000, quiet, False, interval_s=0.0).update(500, 500)
    assert quiet.getvalue() == ""


def test_size_estimate_before_a_large_sweep(monkeypatch):
    from infersim.sweep import SweepSpec, load_base, parse_grid, run_sweep, runner

    monkeypatch.setattr(runner, "LARGE_SWEEP", 5)
    spec = SweepSpec(load_base("qwen3-30b.yaml"), tuple(parse_grid(["workload.decode_batch_per_gpu=1..64:1"])))
    stream = io.StringIO()
    result = run_sweep(spec, workers=1, progress=False, stream=stream)
    assert result.simulated == 64
    assert stream.getvalue().startswith("infersim: large sweep: 64 units, about 64 configurations; estimated")


def test_sigterm_keeps_what_is_done(tmp_path):
    out = tmp_path / "partial.csv"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "infersim", "sweep", "--config", "qwen3-30b.yaml", "--grid",
         "workload.decode_batch_per_gpu=1..100000:1", "--workers", "1", "--progress", "--out", str(out)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        seen = ""
        while time.time() < deadline and "units" not in seen:
            seen += os.read(proc.stderr.fileno(), 4096).decode()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = seen + stderr
    assert proc.returncode == 143, stderr
    assert "infersim: interrupted by SIGTERM:" in stderr and f"partial results written to {out}" in stderr
    rows = list(csv.DictReader(out.open()))
    assert 0 < len(rows) < 100_000


# ---- messages ---------------------------------------------------------------------------------------------


def test_echoed_values_are_cut(tmp_path, capsys):
    """A YAML anchor can expand a value to megabytes; the message stays short and says how long it was."""
    text = "big: &big [" + ", ".join(["123456789"] * 5000) + "]\n"
    config = yaml.safe_load((REPO_ROOT / "configs" / "qwen3-30b.yaml").read_text())
    path = tmp_path / "run.yaml"
    path.write_text(text + yaml.safe_dump(config).replace("isl: 4096", "isl: *big"))
    code, _, err = run(capsys, "--config", str(path))
    assert code == 2 and len(err) < 1000
    one_line_error(err, "field 'big'", "...")


def test_a_yaml_alias_bomb_is_never_expanded_into_a_message(tmp_path, capsys):
    levels = ["a0: &a0 [123456789, 123456789, 123456789, 123456789, 123456789, 123456789, 123456789, 123456789]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]  # 8 x 9^9 numbers
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\n")
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"hardware={path}")
    assert code == 2 and len(err) < 1000  # expanded, the message would be 8 x 9^9 numbers long
    one_line_error(err, "field 'a0'", "unknown key")


def test_a_long_text_value_is_cut_with_its_length(capsys):
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "model.hidden_size=" + "x" * 100_000)
    assert code == 2 and len(err) < 1000
    one_line_error(err, "field 'hidden_size'", "(100,002 chars)")


@pytest.mark.parametrize("argv", [
    ["--config", "{dir}"],
    ["--config", "qwen3-30b.yaml", "--set", "hardware={dir}"],
    ["--config", "qwen3-30b.yaml", "--set", "model={dir}"],
    ["compare", "--bench-result", "{dir}", "--config", "qwen3-30b.yaml"],
    ["compare", "--trace", "{trace}", "--rules", "{dir}"],
    ["cards", "import-hf", "{dir}"],
])
def test_a_directory_given_as_a_file_is_called_a_directory(tmp_path, capsys, trace_file, argv):
    code, _, err = run(capsys, *[a.format(dir=tmp_path, trace=trace_file) for a in argv])
    assert code == 2
    one_line_error(err, "is a directory")


@pytest.mark.parametrize("argv", [
    ["--config", "/dev/null"],
    ["--config", "qwen3-30b.yaml", "--set", "hardware=/dev/zero"],
    ["run", "--model", "/dev/null", "--hardware", "h100"],
])
def test_a_device_given_as_a_card_is_called_so(capsys, argv):
    """A path that exists but is no regular file is named so, not reported missing (and not read:
    /dev/zero never ends)."""
    code, _, err = run(capsys, *argv)
    assert code == 2
    one_line_error(err, "is not a regular file (a device, pipe or socket)")


def test_a_list_where_a_mapping_belongs_is_called_so(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("[1, 2]\n")
    code, _, err = run(capsys, "--config", str(path))
    assert code == 2
    one_line_error(err, "expected a mapping")
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", f"hardware={path}")
    assert code == 2
    one_line_error(err, "expected a mapping of HardwareCard fields")


def test_a_layout_over_links_the_card_lacks_is_refused(capsys):
    """Found by the property test: nvlink_bandwidth 0 with 4 GPUs in a node divided by zero. Without
    NVLink the GPUs talk over PCIe, which this card (an HGX part) states nothing about."""
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "hardware.peak.nvlink_bandwidth=0")
    assert code == 2
    one_line_error(err, "field 'derates.pcie_collective'", "peak.nvlink_bandwidth is 0")


def test_trace_events_with_nan_times_or_object_pids_are_skipped(trace_file, tmp_path, capsys):
    import gzip

    events = json.loads(gzip.decompress(trace_file.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernels[0]["ts"] = float("nan")
    kernels[1]["dur"] = float("inf")
    kernels[2]["pid"] = {"device": 0}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"traceEvents": events}))  # json writes NaN and Infinity
    code, out, err = run(capsys, "compare", "--trace", str(path), "--format", "json")
    assert code == 0, err
    assert "NaN" not in out and "Infinity" not in out


@pytest.mark.parametrize("text, problem", [("[]\n", "the list holds no rules"), ("42\n", "not a mapping"),
                                           ("- text\n", "expected a mapping"), ("", "empty rules file")])
def test_rules_files_of_the_wrong_shape_are_named_so(trace_file, tmp_path, capsys, text, problem):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "compare", "--trace", str(trace_file), "--rules", str(path))
    assert code == 2
    one_line_error(err, str(path), problem)


@pytest.mark.parametrize("cell, problem", [("-1", "must be greater than 0"), ("nan", "must be a finite number"),
                                           ("fast", "expected a number")])
def test_published_tables_with_a_bad_cell_are_one_message(tmp_path, capsys, cell, problem):
    import shutil

    from conftest import shared_reference

    source = tmp_path / "published"
    shutil.copytree(shared_reference("infersim_bench_data"), source)
    table = source / "gemm" / "h20" / "data.csv"
    table.chmod(0o644)
    lines = table.read_text().splitlines()
    cells = lines[2].split(",")
    cells[3] = cell  # latency_us
    lines[2] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "mfu", "import-infersim", str(source), "--out", str(tmp_path / "out"))
    assert code == 2
    one_line_error(err, f"{table}:3", "field 'latency_us'", problem)


def test_a_binary_table_file_is_one_message(tmp_path, capsys):
    tables = scaled_tables(tmp_path, "attention_decode_mha_32-4-128.csv", 1)
    (tables / "attention_decode_mha_32-4-128.csv").write_bytes(b"\xff\xfe\x00\x9c binary")
    code, _, err = run(capsys, "--config", "qwen3-30b.yaml", "--mfu-tables", str(tables))
    assert code == 2
    one_line_error(err, "attention_decode_mha_32-4-128.csv", "not a text CSV file")


@pytest.mark.parametrize("name", ["../escape", "a/b", "x" * 300, ""])
def test_card_names_cannot_escape_the_output_directory(tmp_path, capsys, name):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF))
    code, _, err = run(capsys, "cards", "import-hf", str(path), "--name", name, "--out", str(tmp_path / "out"))
    assert code == 2 and not (tmp_path / "escape.yaml").exists()
    one_line_error(err, "--name", "a card name is")


LONG = "9" * 5000  # beyond Python's 4,300-digit limit on reading integers from text


def test_integers_of_thousands_of_digits_are_one_message(tmp_path, capsys, trace_file):
    cases = []
    (tmp_path / "big.yaml").write_text(f"x: {LONG}\n")
    cases.append((["--config", str(tmp_path / "big.yaml")], "too long to read"))
    cases.append((["--config", "qwen3-30b.yaml", "--set", f"workload.isl={LONG}"], "too large"))
    cases.append((["sweep", "--config", "qwen3-30b.yaml", "--grid", f"workload.isl={LONG}"], "too large"))
    (tmp_path / "b.jsonl").write_text(f'{{"batch_size": {LONG}, "input_len": 1, "output_len": 1, "prefill_latency": 1}}\n')
    cases.append((["compare", "--bench-result", str(tmp_path / "b.jsonl"), "--config", "qwen3-30b.yaml"], "too long to read"))
    (tmp_path / "hf.json").write_text(f'{{"hidden_size": {LONG}}}')
    cases.append((["cards", "import-hf", str(tmp_path / "hf.json")], "too long to read"))
    (tmp_path / "t.json").write_text(f'{{"traceEvents": [{{"ph": "X", "cat": "kernel", "name": "a", "ts": {LONG}}}]}}')
    cases.append((["compare", "--trace", str(tmp_path / "t.json")], "too long to read"))
    for argv, problem in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        one_line_error(err, problem)
        assert len(err) < 1000
