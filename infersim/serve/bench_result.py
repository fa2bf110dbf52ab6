"""A serving benchmark's result held against `infersim serve` at the same load.

`vllm bench serve --save-result` (one JSON object; `--append-result` adds one per line) and
`python -m sglang.bench_serving --output-file` (one JSON object per line) save the load they ran
and what they measured (keys of vllm/benchmarks/serve.py and python/sglang/bench_serving.py):

- load: request_rate (requests/s; "inf" or Infinity: all at once), max_concurrency (null: no cap),
  burstiness (vLLM: gamma shape of the gaps, 1 = Poisson), num_prompts (vLLM) or completed;
  total_input_tokens / total_output_tokens over the completed requests, and with vLLM's
  --save-detailed (SGLang's --output-details) the per-request input_lens / output_lens;
- the server: backend (vllm, openai, sglang, sglang-oai, trt, ...), model_id (vLLM only);
- measured: mean/median/p99 TTFT, TPOT and ITL in ms, E2E latency (vLLM mean_e2el_ms, SGLang
  mean_e2e_latency_ms), request_throughput, output_throughput (tokens/s, whole server).

The same load is replayed by the serving simulator: a finite rate is Poisson arrivals at that
rate (gamma gaps of the file's burstiness), capped at max_concurrency in flight when one is given
(a request waits at the client for a slot, its TTFT starting when it is sent, as the tools time
it); an infinite rate with a cap is that many clients in closed loop; an infinite rate without one
is every request at once (offline). Request lengths are the file's: its per-request lengths when it
saved them (drawn uniformly over their range), else every request at the file's mean lengths.
The engine is the file's backend (--engine overrides it; a backend that names no engine, such as
vLLM's "openai", leaves the run's engine, said in a note).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from infersim.cards.schema import check_number
from infersim.base.errors import MISSING, ConfigError, InferSimError, NotPossible
from infersim.base.texttable import counted
from infersim.serve.workload import MAX_REQUESTS
from infersim.trace.bench import MetricComparison

VLLM = "vllm bench serve"
SGLANG = "sglang.bench_serving"

#: (label, unit, key in the file, keys the file may use instead, key in infersim serve's summary)
METRICS = (
    ("mean TTFT", "ms", "mean_ttft_ms", (), "mean_ttft_ms"),
    ("median TTFT", "ms", "median_ttft_ms", (), "median_ttft_ms"),
    ("p99 TTFT", "ms", "p99_ttft_ms", (), "p99_ttft_ms"),
    ("mean TPOT", "ms", "mean_tpot_ms", (), "mean_tpot_ms"),
    ("median TPOT", "ms", "median_tpot_ms", (), "median_tpot_ms"),
    ("p99 TPOT", "ms", "p99_tpot_ms", (), "p99_tpot_ms"),
    ("mean ITL", "ms", "mean_itl_ms", (), "mean_itl_ms"),
    ("median ITL", "ms", "median_itl_ms", (), "median_itl_ms"),
    ("p99 ITL", "ms", "p99_itl_ms", (), "p99_itl_ms"),
    ("mean E2E latency", "ms", "mean_e2el_ms", ("mean_e2e_latency_ms",), "mean_e2el_ms"),
    ("median E2E latency", "ms", "median_e2el_ms", ("median_e2e_latency_ms",), "median_e2el_ms"),
    ("request throughput", "req/s", "request_throughput", (), "request_throughput"),
    ("output throughput", "tok/s", "output_throughput", (), "output_throughput"),
)


@dataclass(frozen=True)
class ServingResult:
    """One saved serving benchmark run: its load and what it measured."""

    tool: str  # VLLM or SGLANG
    line: int
    backend: str
    model_id: str  # "" when the file does not say (sglang.bench_serving)
    request_rate: float  # requests/s; math.inf: all at once
    max_concurrency: int | None
    burstiness: float
    num_prompts: int
    completed: int
    mean_input_len: float
    mean_output_len: float
    input_range: tuple[int, int] | None  # (shortest, longest) prompt, when the file lists every request's
    output_range: tuple[int, int] | None
    measured: dict[str, float]  # METRICS key -> value in the file's unit

    @property
    def load(self) -> str:
        if math.isinf(self.request_rate):
            return (counted(self.max_concurrency, "concurrent client") if self.max_concurrency
                    else "all requests at once (offline)")
        burst = f", burstiness {self.burstiness:g}" if self.burstiness != 1 else ""
        cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return f"Poisson {self.request_rate:g} req/s{burst}{cap}"


def is_serving_result(data: Any) -> bool:
    """Whether a result object is a serving benchmark's (not sglang.bench_one_batch's)."""
    return (isinstance(data, dict) and "prefill_latency" not in data and "median_decode_latency" not in data
            and any(key in data for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms")))


def _rate(value: Any, where: str) -> float:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("inf", "infinity")):
        return math.inf
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return math.inf
    return float(check_number(value, where, "request_rate", gt=0))


def _lengths(data: dict[str, Any], key: str, where: str) -> tuple[int, int] | None:
    """(shortest, longest) of a per-request length list; None when the file has none. Every entry
    passes the number rule (one that does not is refused with its index, not the whole list dropped);
    a 0 is a failed request's (vLLM saves output length 0 for it) and is not a length."""
    values = data.get(key)
    if values is None:
        return None
    if not isinstance(values, list):
        raise ConfigError(where, key, values, "expected a list of per-request token counts")
    lengths = [int(check_number(v, where, f"{key}[{i}]", whole=True, ge=0)) for i, v in enumerate(values)]
    served = [n for n in lengths if n > 0]
    return (min(served), max(served)) if served else None


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(where, key, value, "expected a name (text)")
    return value


def parse_serving_result(data: dict[str, Any], source: str, line: int) -> ServingResult:
    """A result object of vllm bench serve or sglang.bench_serving (see the module docstring)."""
    where = f"{source}: line {line}"
    tool = VLLM if any(key in data for key in ("model_id", "tokenizer_id", "burstiness", "num_prompts")) else SGLANG

    def number(key: str, whole: bool = False, required: bool = True) -> float | None:
        value = data.get(key)
        if value is None:
            if required:
                raise ConfigError(where, key, MISSING, f"required field of a {tool} result is missing")
            return None
        return float(check_number(value, where, key, whole=whole, ge=0))

    completed = int(number("completed", whole=True))
    if completed < 1:
        raise InferSimError(f"{where}: no completed requests, nothing to compare")
    if completed > MAX_REQUESTS:  # every completed request is replayed
        raise ConfigError(where, "completed", data["completed"], f"more than the {MAX_REQUESTS:,} requests a serving "
                          "run simulates")
    cap = data.get("max_concurrency")
    measured = {}
    for _label, _unit, key, others, _summary in METRICS:
        for name in (key, *others):
            if data.get(name) is not None:
                measured[key] = float(check_number(data[name], where, name, ge=0))
                break
    num_prompts = data.get("num_prompts")
    if num_prompts is not None and check_number(num_prompts, where, "num_prompts", whole=True, gt=0) < completed:
        raise ConfigError(where, "num_prompts", num_prompts, f"fewer requests sent than the {completed:,} completed")
    return ServingResult(
        tool=tool, line=line, backend=_text(data, "backend", where) or _text(data, "endpoint_type", where),
        model_id=_text(data, "model_id", where), request_rate=_rate(data.get("request_rate"), where),
        max_concurrency=int(check_number(cap, where, "max_concurrency", whole=True, gt=0)) if cap is not None else None,
        burstiness=float(check_number(data.get("burstiness", 1.0), where, "burstiness", gt=0)),
        num_prompts=int(check_number(num_prompts, where, "num_prompts", whole=True, gt=0)) if num_prompts else completed,
        completed=completed, mean_input_len=number("total_input_tokens", whole=True) / completed,
        mean_output_len=number("total_output_tokens", whole=True) / completed,
        input_range=_lengths(data, "input_lens", where), output_range=_lengths(data, "output_lens", where),
        measured=measured)


def serve_options(result: ServingResult) -> tuple[dict[str, Any], list[str]]:
    """The options of infersim.serve.api.simulate_serving that replay the result's load, and notes
    on what was taken from where."""
    notes: list[str] = []
    options: dict[str, Any] = {"num_requests": result.completed}
    if result.completed != result.num_prompts:
        notes.append(f"{result.num_prompts - result.completed} of {result.num_prompts} requests failed in the "
                     "benchmark; the simulation serves the completed ones")
    if math.isinf(result.request_rate):
        if result.max_concurrency:
            options.update(mode="concurrency", concurrency=result.max_concurrency)
        else:
            options["mode"] = "offline"
    else:
        options.update(mode="poisson", rate=result.request_rate, burstiness=result.burstiness)
        if result.max_concurrency:
            options["concurrency"] = result.max_concurrency
        if result.tool == SGLANG:
            notes.append("sglang.bench_serving does not save its burstiness: Poisson arrivals (burstiness 1)")
    for name, mean, span in (("isl", result.mean_input_len, result.input_range),
                             ("osl", result.mean_output_len, result.output_range)):
        if span is not None and span[0] != span[1]:
            options[name] = {"dist": "uniform", "min": span[0], "max": span[1]}
        else:
            options[name] = max(1, round(mean))
    notes.append(_lengths_note(result))
    return options, notes


def _lengths_note(result: ServingResult) -> str:
    spans = (("input", result.input_range, result.mean_input_len), ("output", result.output_range,
                                                                   result.mean_output_len))
    if result.input_range is None and result.output_range is None:
        return (f"the file holds no per-request lengths: every request has the mean lengths, "
                f"{result.mean_input_len:,.1f} input and {result.mean_output_len:,.1f} output tokens")
    return "request lengths: " + ", ".join(
        f"{what} drawn uniformly over the file's range {span[0]:,}..{span[1]:,}" if span is not None else
        f"{what} the file's mean {mean:,.1f} (it lists no per-request {what} lengths)" for what, span, mean in spans
    ) + " tokens"


def engine_of_backend(backend: str) -> str | None:
    """The bundled engine card a benchmark backend name stands for (None: it names none)."""
    from infersim.cards.registry import bundled_names, resolve_name

    if not backend:
        return None
    try:
        path = resolve_name(backend, "engines")[0]
    except InferSimError:
        return None
    return path.stem if path.stem in bundled_names("engines") else None


@dataclass(frozen=True)
class ServingComparison:
    result: ServingResult
    predicted_title: str
    options: dict[str, Any]
    rows: tuple[MetricComparison, ...]
    notes: tuple[str, ...]
    summary: dict[str, Any]


def compare_serving(result: ServingResult, config: Any, options: dict[str, Any], notes: list[str],
                    title: str) -> ServingComparison:
    """Simulate the result's load on `config` and pair every metric both have."""
    from infersim.serve.api import simulate_serving

    summary = simulate_serving(config, options)
    rejected = int(summary.get("rejected") or 0)
    if rejected:
        why = [n for n in summary.get("notes", []) if "rejected" in n] or summary.get("warnings", [])[:1]
        if not summary.get("completed"):
            every = "the" if rejected == 1 else "all"
            raise NotPossible(f"the simulated server rejected {every} {counted(rejected, 'request')} on arrival, "
                              f"where the benchmark completed {result.completed:,}: " + "; ".join(why))
        notes = [*notes, f"the simulated server rejected {counted(rejected, 'request')} on arrival: " + "; ".join(why)]
    rows = tuple(MetricComparison(label, unit, result.measured[key], float(summary[mine]))
                 for label, unit, key, _others, mine in METRICS
                 if key in result.measured and summary.get(mine) is not None)
    return ServingComparison(result, title, options, rows, tuple(notes), summary)


def with_engine(flags: Any, result: ServingResult, config_engine: str | None) -> tuple[Any, list[str]]:
    """The run flags with the engine the result's backend names (unless --engine gave one), and
    the model its model_id names (unless --model or the config gave one: `config_engine` is the
    config file's engine, None without a file)."""
    notes = []
    if flags.engine is None:
        engine = engine_of_backend(result.backend)
        if engine is not None:
            flags = replace(flags, engine=engine)
            notes.append(f"engine {engine}: the file's backend '{result.backend}'")
        else:
            notes.append(f"backend '{result.backend or '(none)'}' names no engine card: the engine is "
                         f"{config_engine or 'the default'} (--engine sets it)")
    return flags, notes
