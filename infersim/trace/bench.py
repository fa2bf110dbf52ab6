"""SGLang benchmark results: parsing, and the workload a prediction must use to be comparable.

Two JSONL formats, one JSON object per line:

- `sglang.bench_one_batch` (`--result-filename`): batch_size, input_len, output_len, prefill_latency
  (s), prefill_throughput (tok/s), median_decode_latency (s), median_decode_throughput (tok/s), ...
  One static batch on the whole server: TTFT = prefill latency, TPOT = median decode latency.
- `sglang.bench_serving` (`--output-file`): completed, total_input_tokens, total_output_tokens,
  mean_ttft_ms, median_tpot_ms, output_throughput (tok/s), max_concurrency, concurrency, ...

The simulator counts tokens per GPU (every GPU owns its share; attention TP replicates a group's
tokens). A server-wide batch B of ISL-long prompts on G GPUs per pipeline stage is therefore
B x ISL / G prompt tokens and B / G decode requests per GPU; throughputs are compared server-wide
(tokens/GPU/s x G).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersim.cards.schema import check_number
from infersim.base.plaindata import JsonError, loads_json
from infersim.base.errors import MISSING, ConfigError, InferSimError
from infersim.trace.compare import relative_error
from infersim.base.units import MS

ONE_BATCH = "bench_one_batch"
SERVING = "bench_serving"


@dataclass(frozen=True)
class BenchRecord:
    """One benchmark result line, in seconds and tokens/s."""

    kind: str  # bench_one_batch | bench_serving
    line: int
    label: str
    batch_size: float  # requests in flight, whole server (max or mean concurrency for serving)
    input_len: int
    output_len: int
    ttft_s: float | None
    tpot_s: float | None
    prefill_throughput: float | None  # prompt tokens/s, whole server
    decode_throughput: float | None  # generated tokens/s, whole server


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    unit: str  # "s" or "tok/s" (serving results: "ms", "req/s", "tok/s")
    measured: float
    predicted: float

    @property
    def error(self) -> float | None:
        return relative_error(self.predicted, self.measured)


@dataclass(frozen=True)
class BenchWorkload:
    isl: int
    osl: int
    prefill_tokens_per_gpu: int
    decode_batch_per_gpu: int
    notes: tuple[str, ...]


@dataclass(frozen=True)
class BenchComparison:
    record: BenchRecord
    workload: BenchWorkload
    metrics: tuple[MetricComparison, ...]
    notes: tuple[str, ...]


def _number(data: dict[str, Any], key: str, source: str, line: int, required: bool = True, whole: bool = False,
            ge: float | None = None) -> float | None:
    """A result field through the same number rule as cards and configs (finite, whole where a
    count, in range): a count or time must be positive, a throughput at least 0."""
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{source}: line {line}", key, MISSING, "required field is missing")
        return None
    bound = {"ge": ge} if ge is not None else {"gt": 0}
    return float(check_number(value, f"{source}: line {line}", key, whole=whole, **bound))


def parse_bench_record(data: Any, source: str, line: int) -> BenchRecord:
    if not isinstance(data, dict):
        raise InferSimError(f"{source}: line {line}: expected a JSON object of benchmark results")
    if "prefill_latency" in data or "median_decode_latency" in data:
        batch = _number(data, "batch_size", source, line, whole=True)
        isl = _number(data, "input_len", source, line, whole=True)
        osl = _number(data, "output_len", source, line, whole=True)
        prefill = _number(data, "prefill_latency", source, line, required=False)
        decode = _number(data, "median_decode_latency", source, line, required=False)
        prefill_tp = _number(data, "prefill_throughput", source, line, required=False, ge=0)
        decode_tp = _number(data, "median_decode_throughput", source, line, required=False, ge=0)
        if prefill_tp is None and prefill:
            prefill_tp = batch * isl / prefill
        if decode_tp is None and decode:
            decode_tp = batch / decode
        label = str(data.get("run_name") or f"batch {int(batch)}, input {int(isl)}, output {int(osl)}")
        return BenchRecord(ONE_BATCH, line, label, batch, int(isl), int(osl), prefill, decode, prefill_tp, decode_tp)
    if any(key in data for key in ("mean_ttft_ms", "median_tpot_ms", "median_ttft_ms", "mean_tpot_ms")):
        completed = _number(data, "completed", source, line, whole=True, ge=0)
        if not completed:
            raise InferSimError(f"{source}: line {line}: no completed requests")
        total_in = _number(data, "total_input_tokens", source, line, whole=True)
        total_out = _number(data, "total_output_tokens", source, line, whole=True)
        ttft = _number(data, "mean_ttft_ms", source, line, required=False)
        if ttft is None:
            ttft = _number(data, "median_ttft_ms", source, line, required=False)
        tpot = _number(data, "median_tpot_ms", source, line, required=False)
        if tpot is None:
            tpot = _number(data, "mean_tpot_ms", source, line, required=False)
        max_conc = _number(data, "max_concurrency", source, line, required=False)
        mean_conc = _number(data, "concurrency", source, line, required=False)
        batch = max_conc or mean_conc
        if not batch:
            raise InferSimError(f"{source}: line {line}: neither 'max_concurrency' nor 'concurrency' gives the "
                                "number of requests in flight")
        label = f"{data.get('backend', 'sglang')} {data.get('dataset_name', '')}, concurrency {batch:g}".replace(" ,", ",")
        return BenchRecord(SERVING, line, label, batch, max(1, round(total_in / completed)),
                           max(1, round(total_out / completed)),
                           ttft * MS if ttft is not None else None, tpot * MS if tpot is not None else None,
                           _number(data, "input_throughput", source, line, required=False, ge=0),
                           _number(data, "output_throughput", source, line, required=False, ge=0))
    keys = ", ".join(sorted(map(str, data))[:8]) or "none"
    raise InferSimError(f"{source}: line {line}: not a sglang.bench_one_batch or sglang.bench_serving result "
                        f"(fields: {keys})")


def read_bench_results(path: str | Path) -> tuple[BenchRecord, ...]:
    """All result lines of a JSONL file (a single JSON object or list is accepted too)."""
    return tuple(parse_bench_record(data, str(path), line) for line, data in read_result_objects(path))


def read_result_objects(path: str | Path) -> tuple[tuple[int, Any], ...]:
    """(line, JSON value) of every result in a benchmark result file: JSONL (one object per line,
    as sglang.bench_serving and vllm bench serve --append-result write), one JSON object (pretty
    or not: vllm bench serve --save-result) or a JSON list."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InferSimError(f"{source}: file not found") from None
    except IsADirectoryError:
        raise InferSimError(f"{source}: is a directory, not a benchmark result file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InferSimError(f"{source}: cannot read file: {exc}") from None
    stripped = text.strip()
    if not stripped:
        raise InferSimError(f"{source}: empty file, no benchmark results")
    records: list[tuple[int, Any]] = []
    if stripped.startswith("["):
        items = loads_json(stripped, source)
        if not isinstance(items, list):
            raise InferSimError(f"{source}: expected a JSON list of results")
        return tuple((i + 1, item) for i, item in enumerate(items))
    try:  # one pretty-printed object
        whole = loads_json(stripped, source)
    except JsonError as exc:
        if exc.too_deep:
            raise
        whole = None  # not one object: read line by line
    if isinstance(whole, dict):
        return ((1, whole),)
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            records.append((number, loads_json(line, f"{source}: line {number}")))
    return tuple(records)


def _per_gpu(total: float, gpus: int, what: str) -> tuple[int, str | None]:
    exact = total / gpus
    value = max(1, round(exact))
    if abs(exact - value) > 1e-9:
        return value, (f"{what}: {total:g} over {gpus} GPUs is {exact:g} per GPU; simulated with {value} "
                       f"(the simulator counts whole tokens/requests per GPU)")
    return value, None


def bench_workload(record: BenchRecord, gpus_per_stage: int, attention_tp: int) -> BenchWorkload:
    """Per-GPU workload matching a benchmark line (see the module docstring)."""
    notes = []
    if record.kind == ONE_BATCH:
        prefill, note = _per_gpu(record.batch_size * record.input_len, gpus_per_stage, "prompt tokens")
    else:
        # TTFT of one request: its prompt is prefilled by one attention-TP group
        prefill, note = _per_gpu(record.input_len, attention_tp, "prompt tokens of one request")
        notes.append("bench_serving TTFT includes queueing and batching with other requests; the prediction "
                     "is one request's prefill alone")
    if note:
        notes.append(note)
    decode, note = _per_gpu(record.batch_size, gpus_per_stage, "decode batch")
    if note:
        notes.append(note)
    return BenchWorkload(record.input_len, record.output_len, prefill, decode, tuple(notes))


def compare_bench_record(record: BenchRecord, workload: BenchWorkload, prefill_step_s: float, prefill_tgs: float,
                         decode_step_s: float, decode_tgs: float, gpus_per_stage: int,
                         extra_notes: tuple[str, ...] = ()) -> BenchComparison:
    metrics = []
    if record.ttft_s is not None:
        metrics.append(MetricComparison("TTFT", "s", record.ttft_s, prefill_step_s))
    if record.tpot_s is not None:
        metrics.append(MetricComparison("TPOT", "s", record.tpot_s, decode_step_s))
    if record.kind == ONE_BATCH and record.prefill_throughput is not None:
        metrics.append(MetricComparison("prefill throughput", "tok/s", record.prefill_throughput,
                                        prefill_tgs * gpus_per_stage))
    if record.decode_throughput is not None:
        metrics.append(MetricComparison("decode throughput" if record.kind == ONE_BATCH else "output throughput",
                                        "tok/s", record.decode_throughput, decode_tgs * gpus_per_stage))
    return BenchComparison(record, workload, tuple(metrics), workload.notes + extra_notes)
