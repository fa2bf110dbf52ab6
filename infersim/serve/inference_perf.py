"""Reads an inference-perf profile (its config.yml) as a serving workload, naming what it leaves out.

inference-perf (kubernetes-sigs/inference-perf, inference_perf/config/) describes a run by `load`
(type constant | poisson | concurrent, stages, interval between stages) and `data` (the request
generator). Read here, with its defaults and semantics from its source:
  load.type constant     -> timer constant (ConstantLoadTimer: int(rate x duration) sends spread over
                            the stage by rescaled exponential gaps)
  load.type poisson      -> timer ip-poisson (PoissonLoadTimer: a Poisson count per second)
  load.type concurrent   -> closed-loop stages {num_requests, concurrency_level}
  load.stages            -> stages, each drained before the next (run_stage waits for every request)
  load.interval          -> the pause between stages (default 1 s)
  data.type shared_prefix -> data shared_prefix with data.shared_prefix's num_groups
                            (num_unique_system_prompts), num_prompts_per_group
                            (num_users_per_system_prompt), system_prompt_len, question_len, output_len
                            (each a number or a Distribution), the legacy question_distribution /
                            output_distribution, enable_multi_turn_chat
  data.type random | synthetic -> data random with input_distribution / output_distribution
A Distribution is {type (default normal), min (default 10), max (default 1024), mean (default 512),
std_dev (default 200) or variance, skew}: normal, skew_normal (mean + std_dev x a standard
skew-normal draw of shape skew), lognormal (of the lengths' own mean and std) and poisson draws are
rounded and clipped to [min, max] as inference-perf's sample_from_distribution does; uniform is
drawn on the whole numbers min..max (inference-perf rounds a real draw on [min, max + 1], so its
two end values are half and one and a half times as likely); fixed is int(mean).
Everything else in the file is named in the run's notes as not read, with why: the client's worker
pool and its concurrency cap, request timeouts, seeds (the run's --seed seeds everything), the API
(a chat template's tokens are not counted), the server, tokenizer, metrics and report sections.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from infersim.base.errors import ConfigError, InferSimError, echo

DISTRIBUTION_DEFAULTS = {"min": 10, "max": 1024, "mean": 512.0, "std_dev": 200.0, "type": "normal"}
LOAD_TYPES = {"constant": "constant", "poisson": "ip-poisson", "concurrent": None}
#: keys read elsewhere or irrelevant to the timing, and why they are not read
NOT_READ = {
    "load.num_workers": "the client's worker processes",
    "load.worker_max_concurrency": "the client's per-worker cap on requests in flight (default 100 per worker; "
                                   "not modelled: the client is taken to keep up)",
    "load.worker_max_tcp_connections": "the client's connection pool",
    "load.request_timeout": "client-side timeouts (requests are never timed out here)",
    "load.base_seed": "inference-perf's seed (the run's --seed seeds every draw here)",
    "load.circuit_breakers": "client-side circuit breakers",
    "load.lora_traffic_split": "LoRA adapters (not modelled)",
    "data.shared_prefix.seed": "inference-perf's prompt seed (the run's --seed is used)",
    "data.corpus_file_path": "the text prompts are made of (only lengths matter here)",
    "data.use_chat_template": "a chat template's extra tokens",
    "api": "the API (completion or chat: a chat template's tokens are not counted; streaming is assumed, as TTFT "
           "needs it; outputs are taken to be output_len long, as with ignore_eos)",
    "server": "the server's address and type (the run's engine card stands for it)",
    "tokenizer": "the tokenizer (lengths are tokens as given)",
    "metrics": "server metrics collection",
    "report": "report settings",
    "storage": "result storage",
    "circuit_breakers": "client-side circuit breakers",
}


def is_inference_perf(profile: Mapping[str, Any]) -> bool:
    """Whether a mapping is an inference-perf profile rather than InferSim's own workload form."""
    load = profile.get("load")
    if any(key in profile for key in ("api", "server", "tokenizer", "report", "storage", "metrics")):
        return True
    if isinstance(load, Mapping) and ("type" in load or "interval" in load or "num_workers" in load):
        return True
    stages = load.get("stages") if isinstance(load, Mapping) else None
    return isinstance(stages, list) and any(isinstance(s, Mapping) and "duration" in s for s in stages)


def _number(value: Any, source: str, path: str, *, whole: bool = False, gt: float | None = None,
            ge: float | None = None) -> int | float:
    """A number of the profile under the project's one number rule, refused naming file, key and value."""
    from infersim.cards.schema import check_number

    checked = check_number(value, source, path, whole=whole, gt=gt, ge=ge)
    # a number written as a number passes on as written, so a valid profile reads exactly as it did
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else checked


def _fixed_length(mean: Any, source: str, where: str) -> int:
    # inference-perf sends int(mean) tokens, so 50.7 reads as 50; a mean under 1 would be refused
    # downstream quoting the truncated 0, so it is refused here quoting the value written
    value = _number(mean, source, f"{where}.mean")
    if value < 1:
        raise ConfigError(source, f"{where}.mean", mean, "a fixed length sends int(mean) tokens; it must be at least 1")
    return int(value)


def _distribution(spec: Any, source: str, where: str) -> Any:
    """An inference-perf length (a number: fixed; a Distribution mapping) as an InferSim length."""
    if not isinstance(spec, Mapping):
        return _number(spec, source, where, whole=True, gt=0)
    unknown = sorted(map(str, set(spec) - {"min", "max", "mean", "std_dev", "type", "variance", "total_count", "skew"}))
    if unknown:
        raise InferSimError(f"{source}: {where}: unknown Distribution key(s) {unknown}")
    d = {**DISTRIBUTION_DEFAULTS, **spec}
    kind = d["type"]
    if kind == "fixed":
        return _fixed_length(d["mean"], source, where)
    if d.get("variance") is not None:
        if "std_dev" in spec:
            raise InferSimError(f"{source}: {where}: give std_dev or variance, not both (as inference-perf requires)")
        d["std_dev"] = math.sqrt(_number(d["variance"], source, f"{where}.variance", ge=0))
    bounds = {key: _number(d[key], source, f"{where}.{key}", whole=True) for key in ("min", "max")}
    if kind == "uniform":
        return {"dist": "uniform", **bounds}
    mean = _number(d["mean"], source, f"{where}.mean")
    std = _number(d["std_dev"], source, f"{where}.std_dev", ge=0)
    if kind in ("normal", "lognormal"):
        return {"dist": kind, "mean": mean, "std": std, **bounds}
    if kind == "skew_normal":
        skew = _number(d.get("skew", 0.0), source, f"{where}.skew")
        return {"dist": kind, "mean": mean, "std": std, "skew": skew, **bounds}
    if kind == "poisson":
        return {"dist": kind, "mean": mean if mean > 0 else 1.0, **bounds}
    raise InferSimError(f"{source}: {where}.type: {echo(kind)} is not an inference-perf distribution (normal, "
                        "skew_normal, lognormal, uniform, poisson, fixed)")


#: the keys of a stage by load type; inference-perf forbids the other type's keys (StandardLoadStage)
#: or ignores them (ConcurrentLoadStage sets rate and duration at run time), and either way they are not read
STAGE_KEYS = {False: ("rate", "duration"), True: ("num_requests", "concurrency_level")}
#: keys inference-perf has in a stage of a load type not modelled here
STAGE_NOT_MODELLED = {"concurrent_sessions", "session_rate", "num_sessions", "timeout"}


def _stage_keys(stage: Mapping[str, Any], kind: str, concurrent: bool, source: str, where: str) -> None:
    takes = STAGE_KEYS[concurrent]
    for key in sorted(map(str, stage)):
        if key in takes:
            continue
        if key in STAGE_KEYS[not concurrent]:
            problem = f"not read in a load.type {kind} stage (it takes {' and '.join(takes)})"
        elif key in STAGE_NOT_MODELLED:
            problem = "a key of load.type trace_session_replay stages, which is not modelled"
        else:
            problem = f"unknown key; a load.type {kind} stage takes {' and '.join(takes)}"
        raise InferSimError(f"{source}: {where}.{key}: {problem}")
    missing = [key for key in takes if stage.get(key) is None]
    if missing:
        raise InferSimError(f"{source}: {where}: a load.type {kind} stage needs {' and '.join(takes)} "
                            f"(missing {', '.join(missing)})")


def _stages(load: Mapping[str, Any], kind: str, source: str) -> list[dict[str, Any]]:
    stages = load.get("stages")
    if not isinstance(stages, list) or not stages:
        if load.get("sweep") is not None:
            raise InferSimError(f"{source}: load.sweep finds its stages by probing a live server's saturation; give "
                                "load.stages (or use --rate-sweep)")
        raise InferSimError(f"{source}: load.stages: expected a list of stages (got {echo(stages)})")
    concurrent = kind == "concurrent"
    out = []
    for i, stage in enumerate(stages):
        where = f"load.stages[{i}]"
        if not isinstance(stage, Mapping):
            raise InferSimError(f"{source}: {where}: expected a mapping (got {echo(stage)})")
        _stage_keys(stage, kind, concurrent, source, where)
        if concurrent:
            out.append({"concurrency": _number(stage["concurrency_level"], source, f"{where}.concurrency_level",
                                               whole=True, gt=0),
                        "num_requests": _number(stage["num_requests"], source, f"{where}.num_requests", whole=True,
                                                gt=0)})
        else:
            out.append({"rate": _number(stage["rate"], source, f"{where}.rate", gt=0),
                        "duration_s": _number(stage["duration"], source, f"{where}.duration", gt=0)})
    return out


#: data.shared_prefix's keys in inference-perf (SharedPrefix); seed and multimodal are named in the notes
SHARED_PREFIX_KEYS = {"num_groups", "num_unique_system_prompts", "num_prompts_per_group", "num_users_per_system_prompt",
                      "system_prompt_len", "question_len", "output_len", "question_distribution",
                      "output_distribution", "enable_multi_turn_chat", "seed", "multimodal"}


def _one_of(sp: Mapping[str, Any], key: str, other: str, default: Any, source: str) -> Any:
    """The value of a key that has a second spelling (an alias, or a legacy key), refusing both given:
    which one inference-perf would take is not something a reader of the file can tell."""
    if sp.get(key) is not None and sp.get(other) is not None:
        raise InferSimError(f"{source}: data.shared_prefix: give {key} or {other}, not both")
    return sp[key] if sp.get(key) is not None else sp[other] if sp.get(other) is not None else default


def _shared_prefix(data: Mapping[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    sp = data.get("shared_prefix")
    if not isinstance(sp, Mapping):
        raise InferSimError(f"{source}: data.type shared_prefix needs data.shared_prefix as a mapping "
                            f"(got {echo(sp)})")
    unknown = sorted(map(str, set(sp) - SHARED_PREFIX_KEYS))
    if unknown:
        raise InferSimError(f"{source}: data.shared_prefix: unknown key(s) {unknown}; expected "
                            f"{', '.join(sorted(SHARED_PREFIX_KEYS))}")
    if sp.get("multimodal") is not None or data.get("multimodal") is not None:
        notes.append(f"{source}: multimodal content is not modelled (its tokens are not counted)")
    multi = sp.get("enable_multi_turn_chat")
    if multi is not None and not isinstance(multi, bool):
        raise ConfigError(source, "data.shared_prefix.enable_multi_turn_chat", multi, "expected true or false")

    def length(key: str, legacy: str | None, default: Any) -> Any:
        if legacy is None:
            return _distribution(sp.get(key, default), source, f"data.shared_prefix.{key}")
        # question_distribution stands for question_len when given, so name the key that was written
        written = legacy if sp.get(legacy) is not None else key
        return _distribution(_one_of(sp, key, legacy, default, source), source, f"data.shared_prefix.{written}")

    def count(key: str, alias: str) -> int:
        written = alias if sp.get(alias) is not None else key
        return int(_number(_one_of(sp, key, alias, 10, source), source, f"data.shared_prefix.{written}", whole=True,
                           gt=0))

    return {"type": "shared_prefix",
            "num_groups": count("num_groups", "num_unique_system_prompts"),
            "prompts_per_group": count("num_prompts_per_group", "num_users_per_system_prompt"),
            "system_prompt_len": length("system_prompt_len", None, 100),
            "question_len": length("question_len", "question_distribution", 50),
            "output_len": length("output_len", "output_distribution", 50),
            "multi_turn": bool(multi), "order": "cycle"}


def _data(data: Mapping[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    kind = data.get("type", "mock")
    if kind == "shared_prefix":
        return _shared_prefix(data, source, notes)
    if kind in ("random", "synthetic"):
        if data.get("input_distribution") is None or data.get("output_distribution") is None:
            raise InferSimError(f"{source}: data.type {kind} needs input_distribution and output_distribution")
        if kind == "synthetic":
            notes.append(f"{source}: data.type synthetic takes its prompts from a text corpus; they are taken to share "
                         "no prefix")
        return {"type": "random",
                "input": _distribution(data["input_distribution"], source, "data.input_distribution"),
                "output": _distribution(data["output_distribution"], source, "data.output_distribution")}
    default = " (inference-perf's default)" if "type" not in data else ""
    raise InferSimError(f"{source}: data.type {echo(kind)}{default} reads a dataset whose token counts need its "
                        "tokenizer; give its lengths as a trace (--trace or --lengths-from) instead")


def _present(profile: Mapping[str, Any], dotted: str) -> bool:
    node: Any = profile
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


READ = {"load": {"type", "stages", "interval", "sweep"},
        "data": {"type", "shared_prefix", "input_distribution", "output_distribution", "multimodal"}}


def _not_read(profile: Mapping[str, Any]) -> list[str]:
    names = [f"{key} ({why})" for key, why in NOT_READ.items() if _present(profile, key)]
    for section, read in READ.items():
        body = profile.get(section)
        if isinstance(body, Mapping):
            names += [f"{section}.{key} (not modelled)" for key in sorted(map(str, body))
                      if key not in read and f"{section}.{key}" not in NOT_READ]
    data = profile.get("data")
    kind = data.get("type") if isinstance(data, Mapping) else None
    # each data type reads its own keys; the other type's are named, not dropped
    other: tuple[str, ...] = (("input_distribution", "output_distribution") if kind == "shared_prefix" else
                              ("shared_prefix",) if kind in ("random", "synthetic") else ())
    names += [f"data.{key} (not read with data.type {kind})" for key in other if isinstance(data, Mapping) and key in data]
    known_top = {"load", "data"} | {key.partition(".")[0] for key in NOT_READ}
    names += [f"{key} (not an inference-perf section known here)" for key in sorted(map(str, set(profile) - known_top))]
    return names


def workload_from_inference_perf(profile: Any, source: str = "inference-perf profile") -> dict[str, Any]:
    """InferSim's workload form (infersim.serve.workload_spec) of an inference-perf profile."""
    if not isinstance(profile, Mapping):
        raise InferSimError(f"{source}: expected a mapping with load and data (got {echo(profile)})")
    load, data = profile.get("load"), profile.get("data")
    if not isinstance(load, Mapping) or not isinstance(data, Mapping):
        raise InferSimError(f"{source}: needs a load section and a data section")
    kind = load.get("type", "constant")
    if not isinstance(kind, str) or kind not in LOAD_TYPES:
        raise InferSimError(f"{source}: load.type {echo(kind)} is not modelled from a profile (constant, poisson and "
                            "concurrent are; replay a trace with --trace)")
    notes: list[str] = []
    form: dict[str, Any] = {"load": {"stages": _stages(load, kind, source),
                                     "interval_s": _number(load.get("interval", 1.0), source, "load.interval", ge=0)},
                            "data": _data(data, source, notes)}
    if LOAD_TYPES[kind] is not None:
        form["load"]["timer"] = LOAD_TYPES[kind]
    ignored = _not_read(profile)
    if ignored:
        notes.append(f"{source}: not read: " + "; ".join(ignored))
    form["notes"] = notes
    return form
