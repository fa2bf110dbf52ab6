"""Hostile input, round 4 (second part): a Dask executor aimed at the wrong thing, unbounded sweeps,
malformed measured validation files, impossible trace shapes, models guessed from HF configs, advice
computed from the need, dropped bench data and messages that name what the user wrote."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_cli import one_line_error, run

# -- a Dask executor aimed at the wrong thing


@contextmanager
def local_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that hands each connection to `answer`; yields its dask:// address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            try:
                answer(conn)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"dask://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


def silent(conn: socket.socket) -> None:
    """Accepts and says nothing (a server that waits for its client to speak first)."""


def http(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def junk(conn: socket.socket) -> None:
    conn.sendall(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 16)  # a plausible length, then no Dask frames


def hangs_up(conn: socket.socket) -> None:
    conn.close()


@pytest.fixture
def short_timeout(monkeypatch):
    from infersim.sweep import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 0.5)


@pytest.mark.parametrize("answer, message", [
    (silent, "connected, but no Dask handshake within 0.5 s: not a Dask scheduler"),
    (http, "the server's first bytes b'HTTP/1.1' are not a Dask message: not a Dask scheduler"),
    (junk, "the server's first message is not a Dask handshake: not a Dask scheduler"),
    (hangs_up, "the connection failed before a Dask handshake"),
])
@pytest.mark.parametrize("command", [
    ["sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=1,2"],
    ["pareto", "--config", "qwen3-30b.yaml", "--gpus", "4", "--max-pp", "1"],
    ["serve", "--config", "serve-llama-8b-h100.yaml", "--rate-sweep", "1,2", "--num-requests", "10"],
])
def test_an_executor_that_is_not_a_dask_scheduler_is_one_line(capsys, short_timeout, answer, message, command) -> None:
    pytest.importorskip("distributed")
    with local_server(answer) as address:
        code, _out, err = run(capsys, *command, "--executor", address)
    assert code == 2
    one_line_error(err, f"--executor {address}", message)


@pytest.mark.parametrize("address", ["file:///etc/passwd", "http://127.0.0.1:80", "dask://", "dask://host",
                                     "dask://host:0", "dask://host:99999", "tcp://:8786", "dask://a b:1"])
def test_only_dask_and_tcp_addresses_are_taken(capsys, address) -> None:
    code, _out, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=1,2",
                          "--executor", address)
    assert code == 2
    one_line_error(err, "--executor", "expected dask://HOST:PORT" if "99999" not in address and ":0" not in address
                   else "is not between 1 and 65535")


def test_a_closed_port_is_one_line(capsys) -> None:
    with socket.socket() as probe:  # a port nobody listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        code, _out, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=1,2",
                              "--executor", f"dask://127.0.0.1:{port}")
    assert code == 2
    one_line_error(err, f"--executor dask://127.0.0.1:{port}: cannot connect")


def test_a_real_scheduler_passes_the_probe() -> None:
    distributed = pytest.importorskip("distributed")
    from infersim.sweep.cluster import probe_scheduler

    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None,
                                  protocol="tcp", host="127.0.0.1") as cluster:
        probe_scheduler(cluster.scheduler_address, timeout_s=5)
        with pytest.raises(Exception, match="could not register with it"):
            from infersim.sweep.cluster import dask_executor

            worker = next(iter(cluster.workers.values())).address
            dask_executor(worker)


def test_serve_flags_nothing_reads_are_refused(capsys) -> None:
    base = ["serve", "--config", "serve-llama-8b-h100.yaml"]
    code, _out, err = run(capsys, *base, "--rate-sweep", "1:3:1", "--rate", "5")
    assert code == 2
    one_line_error(err, "--rate 5 with --rate-sweep: the search chooses the rates; drop --rate")
    code, _out, err = run(capsys, *base, "--max-rate-under-slo", "--slo", "ttft=1s", "--rate", "5")
    assert code == 2
    one_line_error(err, "--rate 5 with --max-rate-under-slo")
    code, _out, err = run(capsys, *base, "--rate", "1", "--workers", "4")
    assert code == 2
    one_line_error(err, "--workers 4: runs the points of --rate-sweep or --max-rate-under-slo")
    code, _out, err = run(capsys, *base, "--rate", "1", "--trace-time-scale", "0.5")
    assert code == 2
    one_line_error(err, "--trace-time-scale 0.5 scales a --trace's arrival times; there is no --trace")


def test_a_rate_search_starts_no_more_workers_than_cpus(capsys, monkeypatch) -> None:
    import infersim.base.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 2)
    code, out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--rate-sweep", "1,2,4",
                         "--num-requests", "10", "--workers", "100000", "--format", "json")
    assert code == 0, err
    assert "--workers 100000: 2 CPUs available here; 2 worker processes started" in err
    import json

    assert [r["rate"] for r in json.loads(out)["rate_sweep"]] == [1.0, 2.0, 4.0]


def test_a_rate_search_with_a_concurrency_caps_each_rate(capsys) -> None:
    code, out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--rate-sweep", "2,4",
                         "--concurrency", "1", "--num-requests", "20", "--workers", "1", "--format", "json")
    assert code == 0, err
    import json

    rows = json.loads(out)["rate_sweep"]
    _code, uncapped, _ = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--rate-sweep", "2,4",
                                     "--num-requests", "20", "--workers", "1", "--format", "json")
    free = json.loads(uncapped)["rate_sweep"]
    # one request in flight at a time: the 20 requests run one after another, each ~2.7 s (500 tokens
    # at ~5.3 ms), so the run lasts longer than arrivals at 4 req/s with every request admitted
    assert [r["rate"] for r in rows] == [2.0, 4.0]
    assert rows[1]["duration"] > 20 * 2.5 > free[1]["duration"]


# -- messages name what the user wrote


@pytest.mark.parametrize("flags, message", [
    (["--model", "llama-3.1-8b", "--num-gpus", "2", "--tp", "4"],
     "--tp 4: more than the 2 GPUs of a pipeline stage (--num-gpus 2)"),
    (["--model", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3"],
     "--tp 3: does not divide the 8 GPUs of a pipeline stage"),
    (["--model", "qwen3-30b-a3b", "--num-gpus", "256", "--ep", "256"],
     "--ep 256: more than the 128 routed experts of qwen3-30b-a3b"),
    (["--model", "qwen3-30b-a3b", "--num-gpus", "8", "--ep", "3"],
     "--ep 3: does not divide the 8 GPUs of a pipeline stage"),
    (["--model", "qwen3-30b-a3b", "--num-gpus", "8", "--tp", "2", "--dp-attention", "2"],
     "--tp 2 x --dp-attention 2 = 4: fewer than the 8 GPUs of a pipeline stage"),
    (["--model", "llama-3.1-8b", "--num-gpus", "6", "--pp", "4"],
     "--pp 4: 4 pipeline stages do not divide --num-gpus 6"),
    (["--model", "llama-3.1-8b", "--pp", "3"], "--pp 3: llama-3.1-8b's 32 layers do not divide into 3 pipeline stages"),
    (["--model", "llama-3.1-8b", "--num-nodes", "3", "--num-gpus", "8"], "--num-nodes 3: does not divide --num-gpus 8"),
    (["--model", "llama-3.1-8b", "--num-gpus", "12"],
     "--num-gpus 12: more than one h100-sxm node's 8 GPUs, and not whole nodes of 8"),
    (["--model", "llama-3.1-8b", "--num-gpus", "16", "--num-nodes", "1"],
     "--num-nodes 1: 16 GPUs per node (--num-gpus 16), but a h100-sxm node holds 8"),
])
def test_layout_flags_are_named_in_their_messages(capsys, flags, message) -> None:
    code, _out, err = run(capsys, *flags, "--hardware", "h100")
    assert code == 2
    line = one_line_error(err, message)
    assert "attention.dp" not in line and "lm_head" not in line


def test_a_config_layout_names_the_field_it_gets_wrong(capsys) -> None:
    """The same classes from a config file: an EP above the experts is blamed on EP, not the LM head;
    a TP whose DP follows from it is blamed on TP, not on 'dp 0'."""
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.num_gpus=256",
                          "--set", "deployment.num_nodes=32", "--set", "deployment.attention.dp=0",
                          "--set", "deployment.attention.tp=1", "--set", "deployment.ffn.ep=256")
    assert code == 2
    one_line_error(err, "field 'deployment.ffn.ep' (value: 256): larger than the model's 128 experts")
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", "deployment.attention.tp=8",
                          "--set", "deployment.attention.dp=0")
    assert code == 2
    one_line_error(err, "field 'deployment.attention.tp' (value: 8): is more than the 4 GPUs of a pipeline stage")


# -- advice computed from the need


def _unfit_line(out: str) -> str:
    lines = out.splitlines()
    return lines[lines.index(next(line for line in lines if line.startswith("DOES NOT FIT"))) + 1]


def test_a_reserve_larger_than_the_hbm_reports_no_negative_memory_and_no_gpu_count(capsys) -> None:
    """A 1e14-wide FFN: activations of a 2,000-token prefill step of 1.2e9 GB. The message said 'only
    -1,199,999,915.51 GB ... are left' and 'about 2 x h100-sxm'."""
    code, out, _err = run(capsys, "--model", "llama-3.1-8b", "--hardware", "h100",
                          "--set", "model.intermediate_size=100000000000000")
    assert code == 1
    line = _unfit_line(out)
    assert "the runtime's reserve alone is 1,200,000,001.03 GB, more than the 85.52 GB of HBM" in line
    assert "fewer prompt tokens per prefill step" in line
    assert " -" not in line.replace(" - weights", "") and "x h100-sxm" not in line


def test_weights_no_cluster_holds_get_no_gpu_count(capsys) -> None:
    """A 1e13-token vocabulary: 1.6e8 GB of embeddings and LM head. Two GPUs were offered."""
    code, out, _err = run(capsys, "--model", "llama-3.1-8b", "--hardware", "h100",
                          "--set", "model.vocab_size=10000000000000")
    assert code == 1
    line = _unfit_line(out)
    assert "weights need 163,840,013.96 GB per GPU" in line
    assert "no fix offered: about 4.19e+06 x h100-sxm would hold them, more than 1,000,000 GPUs" in line
    assert "fp8" not in line  # half of 1.6e8 GB does not fit either


@pytest.mark.parametrize("layers, advice", [
    (3200, "fix: more GPUs, about 32 x h100-sxm (e.g. --num-gpus 32 --tp 8 --pp 4)"),  # 1,398 GB x 1.25 / 72.23 GB
    # 141.69 GB x 1.25 / 72.23 GB = 2.45 -> 4 (layouts in powers of two); half of it, 70.8 GB, fits in fp8
    (320, "fix: more GPUs, about 4 x h100-sxm (e.g. --num-gpus 4 --tp 4), or fp8 weights (--precision fp8)"),
])
def test_more_gpus_follow_the_need(capsys, layers, advice) -> None:
    code, out, _err = run(capsys, "--model", "llama-3.1-8b", "--hardware", "h100",
                          "--set", f"model.num_hidden_layers={layers}")
    assert code == 1
    assert _unfit_line(out).endswith(advice)


def test_a_gemm_wider_than_every_table_is_extrapolated_not_a_recursion(capsys) -> None:
    """hidden_size 1e7 against aiconfigurator's GEMM planes: a (K, N) corner the plane lacks ended in
    RecursionError."""
    code, out, _err = run(capsys, "--model", "llama-3.1-8b", "--hardware", "h100",
                          "--set", "model.hidden_size=10000000")
    assert code == 1 and "DOES NOT FIT" in out


# -- validate --measured: malformed points and the number rule

MEASURED_FIXTURE = Path(__file__).parent / "data" / "gpu_validation_fixture.yaml"


def _measured_file(tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    data = yaml.safe_load(MEASURED_FIXTURE.read_text())
    edit(data)
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, field, problem", [
    (lambda d: d["points"][0].update(metric=["ttft_ms"]), "points[0] (fx-llama-2-7b-2l-eager-ttft-b1-p1024).metric",
     "expected one of ttft_ms, decode_step_ms"),
    (lambda d: d["points"][1].update(new_tokens=[8, 40, 72]), ".new_tokens", "expected a list of two token counts"),
    (lambda d: d["points"][1].update(new_tokens=8), ".new_tokens", "expected a list of two token counts"),
    (lambda d: d["points"][1].update(new_tokens=[40, 8]), ".new_tokens", "N2 must be larger than N1"),
    (lambda d: d["points"][1].update(new_tokens=[8, "x"]), ".new_tokens[1]", "expected a whole number"),
    (lambda d: d["points"][0].update(provenance="gpu box"), ".provenance", "expected a mapping"),
    (lambda d: d["points"][0].update(provenance=[1, 2]), ".provenance", "expected a mapping"),
    (lambda d: d.update(provenance="gpu box"), "field 'provenance'", "expected a mapping"),
    (lambda d: d["points"][0].update(value=1e-300), ".value", "magnitude must be 0 or between 1e-40 and 1e+40"),
    (lambda d: d["points"][0].update(value=1e300), ".value", "magnitude must be 0 or between 1e-40 and 1e+40"),
    (lambda d: d["points"][0].update(value=[4.0]), ".value", "expected a number"),
    (lambda d: d["points"][0].update(batch=1.5), ".batch", "expected a whole number"),
    (lambda d: d["points"][0].update(hardware=["h100"]), ".hardware", "expected a name"),
    (lambda d: d["points"][0].update(id=7), ".id", "expected a name"),
    (lambda d: d["points"][0]["model"].update(full_layers="all"), ".model.full_layers", "expected a whole number"),
])
def test_a_malformed_measured_point_is_one_line(tmp_path, capsys, edit, field, problem) -> None:
    path = _measured_file(tmp_path, edit)
    code, out, err = run(capsys, "validate", "--measured", str(path))
    assert code == 2 and out == ""
    one_line_error(err, str(path), field, problem)


measured_values = st.recursive(st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True)
                               | st.text(max_size=4),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                            max_size=3), max_leaves=8)


@given(point=st.integers(0, 2), key=st.sampled_from(["id", "metric", "value", "unit", "batch", "prompt_tokens",
                                                     "new_tokens", "kv_capacity", "hardware", "engine", "mode",
                                                     "provenance", "model", "samples_ms"]), value=measured_values)
# 100 examples cover each of the 42 (point, key) pairs about twice; each writes and reads a whole file
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_measured_points_are_read_or_refused_in_one_message(tmp_path, point, key, value) -> None:
    from infersim.base.errors import ConfigError
    from infersim.validate.measured import load_measured

    path = _measured_file(tmp_path, lambda d: d["points"][point].update({key: value}))
    try:
        measured = load_measured([path])
    except ConfigError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
    else:
        for ref in measured.reference.values():
            assert 1e-40 <= ref.value <= 1e40


# -- bench files: a bad per-request length is refused with its index, not the whole list dropped

BENCH = {"backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "request_rate": 8.0, "burstiness": 1.0,
         "max_concurrency": None, "num_prompts": 500, "completed": 500, "total_input_tokens": 500_000,
         "total_output_tokens": 100_000, "mean_ttft_ms": 41.8, "median_ttft_ms": 37.9, "p99_ttft_ms": 92.4,
         "mean_tpot_ms": 11.6, "median_tpot_ms": 11.6, "p99_tpot_ms": 14.1, "request_throughput": 7.77,
         "output_throughput": 1553.5}


def _bench_file(tmp_path: Path, **changes) -> Path:
    import json

    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**BENCH, **changes}))
    return path


@pytest.mark.parametrize("key, values, index, problem", [
    ("input_lens", [1000] * 250 + ["x"] + [1000] * 249, 250, "expected a whole number"),
    ("output_lens", [200] * 499 + [-3], 499, "must be at least 0"),
    ("input_lens", [1000.5] + [1000] * 499, 0, "expected a whole number"),
    ("output_lens", [200] * 10 + [None] + [200] * 489, 10, "expected a whole number"),
])
def test_a_bad_length_entry_is_refused_with_its_index(tmp_path, capsys, key, values, index, problem) -> None:
    path = _bench_file(tmp_path, **{"input_lens": [1000] * 500, "output_lens": [200] * 500, key: values})
    code, _out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100")
    assert code == 2
    one_line_error(err, str(path), f"field '{key}[{index}]'", problem)


def test_lengths_that_are_not_a_list_are_refused(tmp_path, capsys) -> None:
    path = _bench_file(tmp_path, input_lens={"a": 1}, output_lens=[200] * 500)
    code, _out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100")
    assert code == 2
    one_line_error(err, "field 'input_lens'", "expected a list of per-request token counts")


def test_failed_requests_output_zero_is_not_a_length(tmp_path, capsys) -> None:
    """vLLM saves output length 0 for a failed request: the range is over the served ones."""
    path = _bench_file(tmp_path, input_lens=[900, 1100] * 250, output_lens=[0] * 3 + [150, 250] * 248 + [200])
    code, out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100", "--format", "json")
    assert code == 0, err
    assert "request lengths: input drawn uniformly over the file's range 900..1,100, output drawn uniformly over " \
           "the file's range 150..250 tokens" in out


def test_one_list_of_lengths_is_used_and_the_other_side_said(tmp_path, capsys) -> None:
    path = _bench_file(tmp_path, input_lens=[900, 1100] * 250)
    code, out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100")
    assert code == 0, err
    assert ("request lengths: input drawn uniformly over the file's range 900..1,100, output the file's mean 200.0 "
            "(it lists no per-request output lengths) tokens") in out


def test_a_backend_that_is_not_text_is_refused(tmp_path, capsys) -> None:
    path = _bench_file(tmp_path, backend=["vllm"])
    code, _out, err = run(capsys, "compare", "--bench-result", str(path), "--hardware", "h100")
    assert code == 2
    one_line_error(err, "field 'backend'", "expected a name")


@given(key=st.sampled_from(sorted(BENCH) + ["input_lens", "output_lens", "endpoint_type"]), value=measured_values)
@settings(max_examples=300, deadline=None)
def test_bench_results_are_read_or_refused_in_one_message(key, value) -> None:
    from infersim.base.errors import InferSimError
    from infersim.serve.bench_result import parse_serving_result, serve_options

    try:
        result = parse_serving_result({**BENCH, key: value}, "b.json", 1)
    except InferSimError as exc:
        assert str(exc).startswith("b.json: line 1") and "\n" not in str(exc)
        return
    options, notes = serve_options(result)
    assert result.completed >= 1 and all(isinstance(n, str) for n in notes)
    for name in ("isl", "osl"):
        spec = options[name]
        assert (spec["min"] >= 1 and spec["max"] <= 1e15) if isinstance(spec, dict) else spec >= 1


# -- mfu from-trace: impossible durations and shapes

TRACE = Path(__file__).parent / "data" / "traces" / "llama-2-7b-2l-eager-h100-synthesised-p1x128-d2.json.gz"
TRACE_RUN = Path(__file__).parent / "data" / "traces" / "llama-2-7b-2l-p1x128-d2.run.yaml"


def _edited_trace(tmp_path: Path, edit: Callable[[dict], None], name: str = "edited.json.gz") -> Path:
    import gzip
    import json

    with gzip.open(TRACE, "rt") as f:
        data = json.load(f)
    for event in data["traceEvents"] if isinstance(data, dict) else data:
        edit(event)
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def _from_trace(capsys, trace: Path, out: Path) -> tuple[int, str, str]:
    return run(capsys, "mfu", "from-trace", str(trace), "--config", str(TRACE_RUN), "--out", str(out))


def _kernel_duration(value: Callable[[float, int], float]) -> Callable[[dict], None]:
    count = [0]

    def edit(event: dict) -> None:
        if event.get("cat") == "kernel":
            event["dur"] = value(event["dur"], count[0])
            count[0] += 1
    return edit


def test_negative_durations_in_from_trace_are_dropped_and_counted(tmp_path, capsys) -> None:
    """Every other kernel negative: learned from the rest, the drop said (it was ZeroDivisionError)."""
    trace = _edited_trace(tmp_path, _kernel_duration(lambda dur, i: -dur if i % 2 else dur))
    code, out, err = _from_trace(capsys, trace, tmp_path / "tables")
    assert code == 0, err
    assert "note: 255 GPU events dropped: negative duration" in out


def test_a_trace_of_only_negative_durations_says_so(tmp_path, capsys) -> None:
    trace = _edited_trace(tmp_path, _kernel_duration(lambda dur, i: -abs(dur) - 1))
    code, _out, err = _from_trace(capsys, trace, tmp_path / "tables")
    assert code == 1
    one_line_error(err, str(trace), "no GPU kernel left to learn kernel times from: 511 GPU events dropped: "
                   "negative duration")
    assert not (tmp_path / "tables").exists() or not any((tmp_path / "tables").iterdir())


def test_kernels_of_zero_duration_learn_no_row(tmp_path, capsys) -> None:
    trace = _edited_trace(tmp_path, _kernel_duration(lambda dur, i: 0))
    code, _out, err = _from_trace(capsys, trace, tmp_path / "tables")
    assert code == 1
    one_line_error(err, "table rows dropped: the traced kernels of their shape took 0 µs")


def _input_dims(value: Callable[[int], int]) -> Callable[[dict], None]:
    def scale(dims):
        return [scale(d) for d in dims] if isinstance(dims, list) else value(dims) if isinstance(dims, int) else dims

    def edit(event: dict) -> None:
        args = event.get("args")
        if isinstance(args, dict) and isinstance(args.get("Input Dims"), list):
            args["Input Dims"] = scale(args["Input Dims"])
    return edit


@pytest.mark.parametrize("value, field, problem", [
    (lambda d: 0, "prefill aten::scaled_dot_product_attention batch (its recorded Input Dims)' (value: 0)",
     "must be at least 1"),
    (lambda d: d * 10**12, "prefill aten::scaled_dot_product_attention batch x length (its recorded Input Dims)",
     "too large: at most 1e+15 for a count"),
])
def test_impossible_traced_shapes_name_the_trace_not_a_set_override(tmp_path, capsys, value, field, problem) -> None:
    trace = _edited_trace(tmp_path, _input_dims(value))
    code, _out, err = _from_trace(capsys, trace, tmp_path / "tables")
    assert code == 2
    line = one_line_error(err, str(trace), field, problem)
    assert "--set" not in line and "workload.isl" not in line


# -- models guessed from HF config content

HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336,
            "hidden_act": "silu", "tie_word_embeddings": False}


def _hf(tmp_path: Path, name: str = "config.json", drop: tuple[str, ...] = (), **changes) -> Path:
    import json

    data = {k: v for k, v in {**HF_LLAMA, **changes}.items() if k not in drop}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _weights_gb(capsys, config: Path) -> float:
    import json

    code, out, err = run(capsys, "--model", str(config), "--hardware", "h200", "--format", "json")
    assert code == 0, err
    return json.loads(out)["memory"]["weights_gb"]


@pytest.mark.parametrize("changes, drop, field, problem", [
    ({"architectures": ["TotallyNewForCausalLM"]}, ("model_type",),
     "field 'architectures' (value: 'TotallyNewForCausalLM')", "not a model class InferSim models"),
    ({"architectures": ["TotallyNewForCausalLM"]}, (), "field 'architectures'", "not a model class InferSim models"),
    ({"model_type": "totally_new"}, ("architectures",), "field 'model_type' (value: 'totally_new')",
     "not a model family InferSim models"),
    ({}, ("architectures", "model_type"), "field 'model_type'", "the config names no architecture"),
    ({"architectures": ["MixtralForCausalLM"]}, (), "field 'architectures'", "names another family than model_type"),
    ({"architectures": "LlamaForCausalLM"}, (), "field 'architectures'", "expected a list of model class names"),
    ({"infersim_family": "llama-ish"}, (), "field 'infersim_family' (value: 'llama-ish')", "not a family InferSim"),
])
def test_an_unknown_architecture_is_refused_with_the_known_families(tmp_path, capsys, changes, drop, field,
                                                                     problem) -> None:
    config = _hf(tmp_path, drop=drop, **changes)
    for argv in (["--model", str(config), "--hardware", "h100"], ["cards", "import-hf", str(config), "--out", "-"]):
        code, _out, err = run(capsys, *argv)
        assert code == 2
        line = one_line_error(err, str(config), field, problem)
        if "not a" in problem and "infersim_family" not in field or "names no" in problem:
            assert "llama, llama4, mistral" in line and '"infersim_family": "<family>"' in line


def test_the_nearest_family_is_simulated_only_when_asked_and_said(tmp_path, capsys) -> None:
    import json

    asked = _hf(tmp_path, "new.json", architectures=["TotallyNewForCausalLM"], infersim_family="llama")
    code, out, err = run(capsys, "--model", str(asked), "--hardware", "h200", "--format", "json")
    assert code == 0, err
    note = "model new: simulated as the llama family at its config's request (infersim_family): its own " \
           "architecture is not one InferSim models"
    data = json.loads(out)
    assert note in data["notes"]
    code, out, err = run(capsys, "--model", str(asked), "--hardware", "h200")
    assert note in out
    # the same numbers as the Llama config it was asked to be
    assert data["memory"]["weights_gb"] == _weights_gb(capsys, _hf(tmp_path, "llama.json"))
    code, out, err = run(capsys, "cards", "import-hf", str(asked), "--out", "-")
    assert code == 0 and "imported_as: llama" in out and "simulated as the llama family" in err


def test_an_moe_family_with_no_experts_is_refused(tmp_path, capsys) -> None:
    """Mixtral with num_local_experts 0 became a dense model without a word."""
    config = _hf(tmp_path, architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=0,
                 num_experts_per_tok=2)
    code, _out, err = run(capsys, "--model", str(config), "--hardware", "h100")
    assert code == 2
    one_line_error(err, str(config), "field 'num_local_experts' (value: 0)", "the mixtral family's FFN layers are "
                   "routed experts")
    dense = _hf(tmp_path, "dense.json", num_local_experts=8, num_experts_per_tok=2)
    code, _out, err = run(capsys, "--model", str(dense), "--hardware", "h100")
    assert code == 2
    one_line_error(err, "field 'num_local_experts' (value: 8)", "the llama family has no routed experts")


def test_a_plain_relu2_mlp_has_two_matrices(tmp_path, capsys) -> None:
    """Nemotron's non-gated MLP with relu2: up and down, 2 x 4096 x 16384 per layer, not 3 (it was
    taken as a gated MLP: ~30-40% too many weights)."""
    base = {"architectures": ["NemotronForCausalLM"], "model_type": "nemotron", "hidden_act": "relu2",
            "intermediate_size": 16384, "vocab_size": 256000}
    plain = _weights_gb(capsys, _hf(tmp_path, "nemotron.json", **base))
    gated = _weights_gb(capsys, _hf(tmp_path, "llama.json", **{**base, "architectures": ["LlamaForCausalLM"],
                                                                 "model_type": "llama", "hidden_act": "silu"}))
    layer_mlp = 4096 * 16384 * 32 * 2 / 1e9  # one matrix of every layer, bf16, GB
    assert gated - plain == pytest.approx(layer_mlp, rel=1e-6)


@pytest.mark.parametrize("changes, field, problem", [
    ({"hidden_act": "relu2"}, "field 'hidden_act' (value: 'relu2')", "a gated MLP with activation relu2 is not"),
    ({"mlp_hidden_act": "relu2"}, "field 'mlp_hidden_act' (value: 'relu2')", "a gated MLP with activation relu2"),
    ({"hidden_act": "squared_softplus"}, "field 'hidden_act'", "not an activation InferSim prices"),
    ({"hidden_act": ["silu"]}, "field 'hidden_act'", "not an activation InferSim prices"),
    ({"router_act": "sigmoid"}, "field 'router_act'", "not an activation InferSim prices"),
    ({"router_act": "silu"}, "field 'router_act'", "the activation of a part InferSim does not model"),
])
def test_every_activation_field_is_read(tmp_path, capsys, changes, field, problem) -> None:
    config = _hf(tmp_path, **changes)
    code, _out, err = run(capsys, "--model", str(config), "--hardware", "h100")
    assert code == 2
    one_line_error(err, str(config), field, problem)


def test_the_mlps_own_activation_wins(tmp_path) -> None:
    from infersim.cards.hf_import import card_fields_from_hf

    fields = card_fields_from_hf({**HF_LLAMA, "architectures": ["NemotronForCausalLM"], "model_type": "nemotron",
                                  "hidden_act": "silu", "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu"},
                                 "c.json", "c")
    assert fields["ffn_activation"] == "relu2"
    gemma = card_fields_from_hf({**HF_LLAMA, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                                 "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"},
                                "g.json", "g")
    assert gemma["ffn_activation"] == "geglu"


hf_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=12),
                      st.sampled_from(["silu", "relu2", "gelu", "LlamaForCausalLM", "mixtral", "llama", "qwen3_moe"]),
                      st.lists(st.sampled_from(["LlamaForCausalLM", "X", 3]), max_size=2))


@given(edits=st.dictionaries(st.sampled_from(["architectures", "model_type", "hidden_act", "mlp_hidden_act",
                                              "hidden_activation", "activation_function", "infersim_family",
                                              "num_local_experts", "num_experts", "num_experts_per_tok",
                                              "intermediate_size", "hidden_size", "num_attention_heads",
                                              "n_routed_experts", "text_config", "layer_types", "sliding_window"]),
                             hf_values, max_size=4))
@settings(max_examples=300, deadline=None)
def test_hf_configs_are_read_or_refused_in_one_message(edits) -> None:
    from infersim.base.errors import ConfigError
    from infersim.cards.hf_import import card_fields_from_hf
    from infersim.cards.model import ModelCard, validate_model
    from infersim.cards.schema import build

    try:
        card = validate_model(build(ModelCard, card_fields_from_hf({**HF_LLAMA, **edits}, "c.json", "c"), "c.json"),
                              "c.json")
    except ConfigError as exc:
        assert str(exc).startswith("c.json") and "\n" not in str(exc)
        return
    assert card.ffn_matrices == (3 if card.ffn_activation in ("swiglu", "geglu") else 2)


# -- unbounded sweeps


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--grid", "workload.decode_batch_per_gpu=1..100000:1",
      "--grid", "model.num_key_value_heads=1..100000:1"],
     ("sweep of 10,000,000,000 configurations: 10,000,000,000 grid points (100,000 workload.decode_batch_per_gpu x "
      "100,000 model.num_key_value_heads); one sweep simulates at most 500,000")),
    (["pareto", "--gpus", "1..1024", "--batch", "1..1024:1"],
     "sweep of 2,382,100 configurations: 1 grid point x up to 2,382,100 layouts and batches per point"),
    (["pareto", "--gpus", "1..64", "--grid", "workload.isl=1..100000:1"],
     "sweep of 792,000,000 configurations: 100,000 grid points x up to 7,920 layouts and batches per point"),
    (["pareto", "--gpus", "1..100000:1"], "--gpus: 100,000 GPU counts; a layout search takes at most 4,096"),
])
def test_a_sweep_beyond_the_bound_is_refused_before_it_runs(capsys, argv, message) -> None:
    code, out, err = run(capsys, argv[0], "--config", "qwen3-30b.yaml", *argv[1:])
    assert code == 2 and out == ""
    one_line_error(err, message)


def test_the_search_bound_counts_every_layout_and_batch() -> None:
    """qwen3-30b-a3b (MoE), --gpus 8 --batch 1..64 (7 batches, plus the largest that fits), max PP/TP 8:
    units (8, 1), (8, 2), (8, 4), (8, 8); a stage of s GPUs tries attention TP t and FFN TP f from the
    divisors of s, and every EP dividing s / f: s = 8: 4 x (4 + 3 + 2 + 1) = 40 layouts; s = 4: 3 x
    (3 + 2 + 1) = 18; s = 2: 2 x 3 = 6; s = 1: 1."""
    from infersim.sweep.evaluate import Search

    search = Search((8,), (1, 2, 4, 8, 16, 32, 64))
    assert search.configurations_per_point(moe=True) == (40 + 18 + 6 + 1) * 8
    assert search.configurations_per_point(moe=False) == (16 + 9 + 4 + 1) * 8


def test_finished_chunks_are_let_go_while_a_sweep_runs(monkeypatch) -> None:
    """Each chunk's future is dropped once its rows are recorded (a Dask future keeps its result on
    the cluster while the client references it): by the time a chunk is recorded, no future of an
    earlier recorded chunk is alive."""
    import concurrent.futures as cf
    import gc
    import weakref

    from infersim.sweep import runner
    from infersim.sweep.evaluate import SweepSpec
    from infersim.sweep.grid import parse_grid
    from infersim.sweep.variants import load_base

    seen: list[weakref.ref] = []
    alive_at_record: list[int] = []

    completed = cf.as_completed

    def tracking(futures):
        for future in completed(futures):
            seen.append(weakref.ref(future))
            del future
            yield seen[-1]()
            gc.collect()
            alive_at_record.append(sum(1 for ref in seen[:-1] if ref() is not None))

    monkeypatch.setattr(runner.cf, "as_completed", tracking)
    spec = SweepSpec(load_base("qwen3-30b.yaml", [], None, None), tuple(parse_grid(["deployment.ffn.ep=1,2,4"])))
    with cf.ThreadPoolExecutor(2) as pool:
        result = runner.run_sweep(spec, executor=pool, chunk_units=1)
    assert len(result.rows) == 3 and len(alive_at_record) == 3
    assert alive_at_record == [0, 0, 0]


def test_sweep_output_is_written_row_by_row(tmp_path) -> None:
    """CSV and JSON are written from an iterator (a sweep's rows are not held twice as records)."""
    import csv
    import json

    from infersim.sweep.output import write_output

    def records():
        for i in range(3):
            yield {"a": i, "b": None if i == 1 else i / 2}

    assert write_output(str(tmp_path / "r.csv"), records(), {"x": 1}) == 3
    assert list(csv.DictReader((tmp_path / "r.csv").open())) == [{"a": "0", "b": "0.0"}, {"a": "1", "b": ""},
                                                                  {"a": "2", "b": "1.0"}]
    assert write_output(str(tmp_path / "r.json"), records(), {"x": [1, 2]}) == 3
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": [1, 2], "rows": [{"a": 0, "b": 0.0},
                                                                                    {"a": 1, "b": None},
                                                                                    {"a": 2, "b": 1.0}]}
    assert write_output(str(tmp_path / "e.json"), iter(()), {"x": 1}) == 0
    assert json.loads((tmp_path / "e.json").read_text()) == {"x": 1, "rows": []}


# -- property tests through the command line: layout flags and trace events


@given(gpus=st.sampled_from([None, 1, 2, 3, 4, 8, 16]), tp=st.sampled_from([None, 1, 2, 3, 4, 8, 16]),
       ep=st.sampled_from([None, 1, 2, 4, 8, 128, 256]), pp=st.sampled_from([None, 1, 2, 3, 4]),
       dp=st.sampled_from([None, 1, 2, 4]), model=st.sampled_from(["llama-3.1-8b", "qwen3-30b-a3b"]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_layout_flags_run_or_name_a_flag(capsys, gpus, tp, ep, pp, dp, model) -> None:
    flags = [f for name, value in (("--num-gpus", gpus), ("--tp", tp), ("--ep", ep), ("--pp", pp),
                                   ("--dp-attention", dp)) if value is not None for f in (name, str(value))]
    code, _out, err = run(capsys, "--model", model, "--hardware", "h100", *flags, "--format", "json")
    assert code in (0, 1, 2), err
    if code == 2:
        line = one_line_error(err)
        assert "--" in line or "field 'deployment" in line, line
        assert "(value: {'dp': 0" not in line  # a derived DP is never blamed


trace_values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                         st.text(max_size=6), st.lists(st.integers(-2, 4), max_size=3),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(edits=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["dur", "ts", "name", "args", "cat", "ph", "pid",
                                                                    "tid"]), trace_values), min_size=1, max_size=4))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_trace_events_are_measured_or_refused_in_one_message(tmp_path_factory, capsys, edits) -> None:
    import json
    import re

    from tracegen.synthetic import TraceBuilder, dense_step, write_trace

    b = TraceBuilder()
    start = b.cpu_us
    b.eager(dense_step(2))
    b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
    events = b.drain()
    kernels = [e for e in events if e.get("cat") == "kernel"]
    for index, key, value in edits:
        kernels[index % len(kernels)][key] = value
    path = tmp_path_factory.mktemp("trace") / "t.json"
    try:
        write_trace(path, events)
    except ValueError:  # NaN is JSON's Infinity / NaN: written by hand instead
        path.write_text(json.dumps({"traceEvents": events}))
    code, out, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml")
    assert code in (0, 1, 2), err
    if code:
        one_line_error(err)
    for number in re.findall(r"\d[\d,]*\.\d+ ms", out):  # every measured time a plausible one
        assert float(number.split()[0].replace(",", "")) < 3.6e6


def test_a_kernel_before_its_launch_or_with_a_boolean_time_is_dropped_and_counted(tmp_path, capsys) -> None:
    """A kernel at ts 0 (or false, which reads as 0) among Unix-time events made a step of 1.7e12 ms."""
    from tracegen.synthetic import TraceBuilder, dense_step, write_trace

    def trace(name: str, edit: Callable[[list[dict]], None]) -> Path:
        b = TraceBuilder()
        start = b.cpu_us
        b.eager(dense_step(2))
        b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
        events = b.drain()
        edit([e for e in events if e.get("cat") == "kernel"])
        return write_trace(tmp_path / name, events)

    for name, edit, note in (
            ("zero.json", lambda k: k[0].update(ts=0), "1 GPU event dropped: start more than a second before the "
                                                        "CPU launched them"),
            ("false.json", lambda k: k[0].update(ts=False), "1 GPU event dropped: timestamp or duration not a number"),
            ("true.json", lambda k: k[1].update(dur=True), "1 GPU event dropped: timestamp or duration not a number")):
        code, out, err = run(capsys, "compare", "--trace", str(trace(name, edit)), "--config", "qwen3-30b.yaml")
        assert code in (0, 1), err
        assert note in out
        step = next(line for line in out.splitlines() if line.startswith("GPU activities:"))
        assert step.startswith("GPU activities: 29 (")  # 30 kernels, one dropped


def test_a_stream_or_correlation_id_beyond_64_bits_is_read_as_unknown(tmp_path, capsys) -> None:
    """A kernel whose tid (its stream, where args name none) was 2**63, or whose stream and correlation
    ids were 2**70, ended in an internal error (OverflowError): no CUDA id lies outside 64 bits, so the
    kernel is kept and such an id read as one that is not a number: a stream from the event's tid, else
    unknown (-1), the launch unknown (-1)."""
    from infersim.trace.load import load_trace
    from tracegen.synthetic import TraceBuilder, dense_step, write_trace

    def trace(name: str, edit: Callable[[dict], None]) -> Path:
        b = TraceBuilder()
        start = b.cpu_us
        b.eager(dense_step(2))
        b.annotation("step[EXTEND bs=1 toks=512]", start, b.cpu_us + 1)
        events = b.drain()
        edit(next(e for e in events if e.get("cat") == "kernel"))
        return write_trace(tmp_path / name, events)

    def no_stream(kernel: dict) -> None:
        kernel["args"].pop("stream", None)
        kernel["tid"] = 9.223372036854776e18  # 2**63 as JSON writes a float

    def huge(kernel: dict) -> None:
        kernel["args"].update(stream=2 ** 70, correlation=2 ** 70)

    def digits(kernel: dict) -> None:  # int() refuses these: 5,000 digits, a second sign, a superscript
        kernel["args"].update(stream="9" * 5000, correlation="--5")
        kernel["tid"] = "²"

    for name, edit, stream in (("tid.json", no_stream, -1), ("ids.json", huge, 7),  # 7: the kernel's tid
                               ("digits.json", digits, -1)):
        path = trace(name, edit)
        loaded = load_trace(path)
        assert len(loaded.kernel_name) == 30 and loaded.kernel_stream[0] == stream, name
        correlation = loaded.kernel_correlation[0]
        assert correlation == -1 if name != "tid.json" else correlation > 0, name
        code, _, err = run(capsys, "compare", "--trace", str(path), "--config", "qwen3-30b.yaml")
        assert code in (0, 1), err
