"""The streaming Chrome-trace reader: same events as json.load, bounded reads, one clear error per bad file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import shared_reference

from infersim.base.errors import InferSimError
from infersim.trace.load import load_trace
from infersim.trace.reader import ChromeTraceReader, TraceFormatError, iter_trace_events
from tracegen.synthetic import KernelSpec, TraceBuilder, write_trace

EVENTS = [
    {"ph": "X", "cat": "kernel", "name": "k1 \"quoted\" {braces} [brackets], commas", "pid": 0, "tid": 7,
     "ts": 1.5, "dur": 2, "args": {"stream": 7, "correlation": 1, "nested": {"a": [1, 2, {"b": None}]}}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm \\u00e9 \u00b5s", "pid": 1, "tid": 1, "ts": 1e15, "dur": 0.25,
     "args": {"flag": True, "none": None, "neg": -3.5e-3}},
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
]


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk", [1, 3, 17, 4096])
def test_events_match_json_load_at_any_chunk_size(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "t.json"
    _write(path, json.dumps({"schemaVersion": 1, "traceEvents": EVENTS, "traceName": "x", "deviceProperties": [{"id": 0}]},
                            indent=2))
    reader = ChromeTraceReader(path, chunk_chars=chunk)
    assert list(reader) == EVENTS
    assert reader.top_level == {"schemaVersion": 1, "traceName": "x", "deviceProperties": [{"id": 0}]}


def test_bare_list_gzip_trailing_empty_event_and_tolerated_commas(tmp_path: Path) -> None:
    text = "[" + ",".join(json.dumps(e) for e in EVENTS) + ",{}, ]"
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(text)
    assert list(iter_trace_events(path, chunk_chars=5)) == EVENTS


def test_bare_number_cut_by_a_chunk_boundary_is_read_whole(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", '{"schemaVersion": 123456, "traceEvents": []}')
    for chunk in range(1, 30):
        reader = ChromeTraceReader(path, chunk_chars=chunk)
        assert list(reader) == []
        assert reader.top_level["schemaVersion"] == 123456


def test_real_trace_streams_to_the_same_events(tmp_path: Path) -> None:
    path = shared_reference("traces", "deepseek-v3-train-ep64-h800.json")
    expected = [e for e in json.loads(path.read_text())["traceEvents"] if e]
    reader = ChromeTraceReader(path, chunk_chars=65536)
    assert list(reader) == expected
    assert len(expected) == 14240
    assert reader.top_level["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 64}


def test_reading_is_incremental(tmp_path: Path) -> None:
    """The first event is available after one chunk, not after the whole file."""
    builder = TraceBuilder(cpu_noise=3)
    for _ in range(3000):
        builder.launch(KernelSpec("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 5.0))
    path = write_trace(tmp_path / "big.json", builder.drain())
    size = path.stat().st_size
    assert size > 2_000_000
    reader = ChromeTraceReader(path, chunk_chars=65536)
    events = iter(reader)
    next(events)
    assert reader.chars_read <= 65536
    assert sum(1 for _ in events) + 1 == 3000 * 9
    assert reader.chars_read == size


# ---------------------------------------------------------------------------------------------
# Bad files: one InferSimError naming the file


GOOD = json.dumps({"traceEvents": EVENTS})


@pytest.mark.parametrize("name, content, message", [
    ("empty.json", "", "empty file"),
    ("spaces.json", "   \n ", "empty file"),
    ("text.json", "hello world", "not JSON"),
    ("csv.json", "a,b,c\n1,2,3\n", "not JSON"),
    ("nokey.json", '{"schemaVersion": 1, "other": []}', "no 'traceEvents' list"),
    ("notlist.json", '{"traceEvents": {"a": 1}}', "'traceEvents' is not a list"),
    ("numbers.json", "[1, 2, 3]", "traceEvents[0] is a int"),
    ("truncated.json", GOOD[: len(GOOD) // 2], "truncated"),
    ("truncated_end.json", GOOD[:-2], "truncated"),
    ("cut_after_comma.json", GOOD[: GOOD.index("}, {") + 3], "truncated"),
    ("syntax.json", GOOD.replace('"pid": 1,', '"pid": 1 "x",'), "malformed JSON"),
    ("trailing.json", GOOD + " {}", "unexpected text after the end"),
    ("binary.json", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not a text trace"),
])
def test_bad_file_is_one_error_naming_it(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(TraceFormatError) as info:
        list(iter_trace_events(path, chunk_chars=64))
    text = str(info.value)
    assert str(path) in text
    assert message in text
    assert "\n" not in text


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(GOOD.encode() * 50)
    path = _write(tmp_path / "cut.json.gz", data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json\.gz: truncated"):
        list(iter_trace_events(path))


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(GOOD.encode()))
    data[20:30] = b"\x00" * 10
    path = _write(tmp_path / "bad.json.gz", bytes(data))
    with pytest.raises(TraceFormatError, match=r"bad\.json\.gz"):
        list(iter_trace_events(path))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="file not found"):
        list(iter_trace_events(tmp_path / "nope.json"))
    with pytest.raises(InferSimError, match="is a directory"):
        list(iter_trace_events(tmp_path))


def test_load_keeps_only_gpu_activities_launches_and_annotations(tmp_path: Path) -> None:
    builder = TraceBuilder(cpu_noise=2)
    begin = builder.cpu_us
    builder.launch(KernelSpec("nvjet_tst_a", 10.0, stream=7))
    builder.launch(KernelSpec("Memcpy HtoD (Pinned -> Device)", 3.0, stream=7), api="cudaMemcpyAsync",
                   cat="gpu_memcpy")
    builder.annotation("step[DECODE bs=1]", 0.0, 1e18)
    events = builder.drain()
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventQuery", "pid": 1000, "tid": 1000,
                   "ts": 5.0, "dur": 1.0, "args": {"correlation": 99}})
    events.append({"ph": "X", "cat": "Kernel", "name": "old_style_kernel", "pid": 0, "tid": 7, "ts": begin + 9.0,
                   "dur": 4.0, "args": {"stream": 7, "correlation": 50}})
    raw = load_trace(write_trace(tmp_path / "t.json", events))
    names = [raw.names[i] for i in raw.kernel_name]
    assert names == ["nvjet_tst_a", "Memcpy HtoD (Pinned -> Device)", "old_style_kernel"]
    assert list(raw.kernel_kind) == [0, 1, 0]
    assert list(raw.kernel_dur_us) == [10.0, 3.0, 4.0]
    assert [raw.names[i] for i in raw.launch_name] == ["cudaLaunchKernel", "cudaMemcpyAsync"]  # no event queries
    assert [a.name for a in raw.annotations] == ["step[DECODE bs=1]"]
    assert raw.events_read == len(events)
