"""SGLang benchmark results: parsing both formats, the per-GPU workload, and the comparison."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT

from infersim.base.errors import InferSimError
from infersim.trace import cli as trace_cli
from infersim.trace.bench import (ONE_BATCH, SERVING, bench_workload, compare_bench_record, read_bench_results)

# as written by `python -m sglang.bench_one_batch --result-filename result.jsonl` (one line per run)
ONE_BATCH_LINES = [
    {"run_name": "before", "batch_size": 64, "input_len": 1024, "output_len": 16, "prefill_latency": 0.8,
     "prefill_throughput": 81920.0, "median_decode_latency": 0.025, "median_decode_throughput": 2560.0,
     "total_latency": 1.2, "overall_throughput": 55000.0},
    {"run_name": "small", "batch_size": 4, "input_len": 512, "output_len": 8, "prefill_latency": 0.05,
     "median_decode_latency": 0.01},
]
# as written by `python -m sglang.bench_serving --output-file serving.jsonl`
SERVING_LINE = {
    "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": 32,
    "sharegpt_output_len": None, "random_input_len": 2000, "random_output_len": 500, "random_range_ratio": 1.0,
    "duration": 100.0, "completed": 200, "total_input_tokens": 400000, "total_output_tokens": 100000,
    "total_output_tokens_retokenized": 99990, "request_throughput": 2.0, "input_throughput": 4000.0,
    "output_throughput": 1000.0, "mean_e2e_latency_ms": 15000.0, "median_e2e_latency_ms": 14800.0,
    "mean_ttft_ms": 350.0, "median_ttft_ms": 300.0, "p99_ttft_ms": 900.0, "mean_tpot_ms": 29.0,
    "median_tpot_ms": 28.0, "p99_tpot_ms": 40.0, "mean_itl_ms": 28.5, "concurrency": 30.1,
}


def _jsonl(path: Path, lines: list[dict]) -> Path:
    # bench_serving writes Infinity for an unlimited request rate: json.dumps does too
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_parse_bench_one_batch(tmp_path: Path) -> None:
    first, second = read_bench_results(_jsonl(tmp_path / "r.jsonl", ONE_BATCH_LINES))
    assert (first.kind, first.line, first.label) == (ONE_BATCH, 1, "before")
    assert (first.batch_size, first.input_len, first.output_len) == (64, 1024, 16)
    assert (first.ttft_s, first.tpot_s) == (0.8, 0.025)
    assert (first.prefill_throughput, first.decode_throughput) == (81920.0, 2560.0)
    # throughputs derived when the line lacks them: batch x input / latency, batch / decode latency
    assert second.prefill_throughput == pytest.approx(4 * 512 / 0.05)
    assert second.decode_throughput == pytest.approx(4 / 0.01)


def test_parse_bench_serving(tmp_path: Path) -> None:
    (record,) = read_bench_results(_jsonl(tmp_path / "s.jsonl", [SERVING_LINE]))
    assert record.kind == SERVING
    assert (record.input_len, record.output_len) == (2000, 500)  # tokens / completed requests
    assert record.batch_size == 32  # max_concurrency
    assert record.ttft_s == pytest.approx(0.350) and record.tpot_s == pytest.approx(0.028)
    assert record.decode_throughput == 1000.0


def test_single_pretty_printed_object(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(SERVING_LINE, indent=2))
    (record,) = read_bench_results(path)
    assert record.kind == SERVING


def test_workload_per_gpu(tmp_path: Path) -> None:
    first, small = read_bench_results(_jsonl(tmp_path / "r.jsonl", ONE_BATCH_LINES))
    wl = bench_workload(first, gpus_per_stage=8, attention_tp=8)
    assert (wl.isl, wl.osl, wl.prefill_tokens_per_gpu, wl.decode_batch_per_gpu) == (1024, 16, 8192, 8)
    assert wl.notes == ()
    wl = bench_workload(small, gpus_per_stage=8, attention_tp=8)
    assert wl.decode_batch_per_gpu == 1  # 4 requests over 8 GPUs: 0.5 per GPU, simulated as 1
    assert any("decode batch: 4 over 8 GPUs is 0.5 per GPU" in n for n in wl.notes)
    (serving,) = read_bench_results(_jsonl(tmp_path / "s.jsonl", [SERVING_LINE]))
    wl = bench_workload(serving, gpus_per_stage=8, attention_tp=2)
    assert (wl.prefill_tokens_per_gpu, wl.decode_batch_per_gpu) == (1000, 4)  # one 2000-token prompt on TP2
    assert any("queueing" in n for n in wl.notes)


def test_metrics_and_errors(tmp_path: Path) -> None:
    record = read_bench_results(_jsonl(tmp_path / "r.jsonl", ONE_BATCH_LINES))[0]
    wl = bench_workload(record, 8, 8)
    comp = compare_bench_record(record, wl, prefill_step_s=1.0, prefill_tgs=8192 / 1.0, decode_step_s=0.02,
                                decode_tgs=8 / 0.02, gpus_per_stage=8)
    metrics = {m.metric: m for m in comp.metrics}
    assert metrics["TTFT"].error == pytest.approx(1.0 / 0.8 - 1)
    assert metrics["TPOT"].error == pytest.approx(0.02 / 0.025 - 1)
    assert metrics["prefill throughput"].predicted == pytest.approx(65536.0)  # 8192 tok/GPU/s x 8 GPUs
    assert metrics["decode throughput"].predicted == pytest.approx(3200.0)
    assert metrics["decode throughput"].error == pytest.approx(3200 / 2560 - 1)


@pytest.mark.parametrize("text, message", [
    ("", "empty file"),
    ("{not json\n", "line 1: not JSON"),
    ('{"a": 1}\n', "not a sglang.bench_one_batch or sglang.bench_serving result"),
    ('{"prefill_latency": 1.0, "input_len": 5, "output_len": 1}\n', "field 'batch_size': required field is missing"),
    ('{"prefill_latency": "fast", "batch_size": 1, "input_len": 5, "output_len": 1}\n', "expected a number"),
    ('{"mean_ttft_ms": 1.0, "completed": 0, "total_input_tokens": 1, "total_output_tokens": 1}\n',
     "no completed requests"),
    ('{"mean_ttft_ms": 1.0, "completed": 2, "total_input_tokens": 1, "total_output_tokens": 1}\n',
     "requests in flight"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_results_fail_clearly(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InferSimError) as info:
        read_bench_results(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="file not found"):
        read_bench_results(tmp_path / "none.jsonl")


# ---------------------------------------------------------------------------------------------
# The command


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="infersim")
    trace_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", *argv])
    return args.handler(args), capsys.readouterr().out


@dataclass(frozen=True)
class _Workload:
    isl: int = 1
    osl: int = 1
    prefill_tokens_per_gpu: int = 0
    decode_batch_per_gpu: int = 1


@dataclass(frozen=True)
class _Config:
    deployment: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(
        num_gpus=8, pp=1, attention=SimpleNamespace(tp=8)))
    workload: _Workload = field(default_factory=_Workload)


def test_command_simulates_each_line_with_its_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import infersim.run.config
    import infersim.run.simulate

    seen = []

    def fake_simulate(config: _Config) -> SimpleNamespace:
        seen.append(config.workload)
        wl = config.workload
        prefill = SimpleNamespace(step_time_s=1e-4 * wl.prefill_tokens_per_gpu / 1024,
                                  tgs=1024 / 1e-4)
        decode = SimpleNamespace(step_time_s=0.02, tgs=wl.decode_batch_per_gpu / 0.02)
        return SimpleNamespace(prefill=prefill, decode=decode, warnings=("roofline only",))

    monkeypatch.setattr(infersim.run.config, "load_run_config", lambda path, overrides=(), tables=None, flags=None: _Config())
    monkeypatch.setattr(infersim.run.simulate, "simulate", fake_simulate)
    path = _jsonl(tmp_path / "r.jsonl", ONE_BATCH_LINES)
    code, out = _run(["--bench-result", str(path), "--config", "x.yaml", "--format", "json"], capsys)
    assert code == 0
    fields = lambda w: (w.isl, w.osl, w.prefill_tokens_per_gpu, w.decode_batch_per_gpu)  # noqa: E731
    assert [fields(w) for w in seen] == [fields(_Workload(1024, 16, 8192, 8)), fields(_Workload(512, 8, 256, 1))]
    first = json.loads(out)["results"][0]
    tpot = next(m for m in first["metrics"] if m["metric"] == "TPOT")
    assert tpot["predicted"] == pytest.approx(0.02) and tpot["error"] == pytest.approx(-0.2)
    assert "roofline only" in first["notes"]
    code, out = _run(["--bench-result", str(path), "--config", "x.yaml"], capsys)
    tpot_row = next(line for line in out.splitlines() if line.startswith("TPOT (ms)"))
    assert tpot_row.split()[2:] == ["25.000", "20.000", "-20.0%"]


def test_command_against_the_real_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO_ROOT / "configs" / "qwen3-30b.yaml"
    if not config.exists():
        pytest.skip("bundled example config not present")
    path = _jsonl(tmp_path / "s.jsonl", [SERVING_LINE, ONE_BATCH_LINES[0]])
    code, out = _run(["--bench-result", str(path), "--config", str(config), "--format", "json"], capsys)
    assert code == 0
    serving, one_batch = json.loads(out)["results"]
    assert serving["kind"] == "bench_serving" and one_batch["kind"] == "bench_one_batch"
    for result in (serving, one_batch):
        assert all(m["predicted"] > 0 and m["measured"] > 0 for m in result["metrics"])
    assert {m["metric"] for m in one_batch["metrics"]} == {"TTFT", "TPOT", "prefill throughput", "decode throughput"}
