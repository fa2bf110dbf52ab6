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

from infersim.base.errors import InferSimError, echo

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


def _distribution(spec: Any, where: str) -> Any:
    """An inference-perf length (a number: fixed; a Distribution mapping) as an InferSim length."""
    if not isinstance(spec, Mapping):
        return spec
    unknown = sorted(map(str, set(spec) - {"min", "max", "mean", "std_dev", "type", "variance", "total_count", "skew"}))
    if unknown:
        raise InferSimError(f"{where}: unknown Distribution key(s) {unknown}")
    d = {**DISTRIBUTION_DEFAULTS, **spec}
    kind = d["type"]
    if d.get("variance") is not None:
        if "std_dev" in spec:
            raise InferSimError(f"{where}: give std_dev or variance, not both (as inference-perf requires)")
        d["std_dev"] = math.sqrt(float(d["variance"]))
    if kind == "fixed":
        return int(d["mean"])
    if kind == "uniform":
        return {"dist": "uniform", "min": d["min"], "max": d["max"]}
    if kind in ("normal", "lognormal"):
        return {"dist": kind, "mean": d["mean"], "std": d["std_dev"], "min": d["min"], "max": d["max"]}
    if kind == "skew_normal":
        return {"dist": kind, "mean": d["mean"], "std": d["std_dev"], "skew": d.get("skew", 0.0), "min": d["min"],
                "max": d["max"]}
    if kind == "poisson":
        return {"dist": kind, "mean": d["mean"] if d["mean"] > 0 else 1.0, "min": d["min"], "max": d["max"]}
    raise InferSimError(f"{where}.type: {echo(kind)} is not an inference-perf distribution (normal, skew_normal, "
                        "lognormal, uniform, poisson, fixed)")


def _stages(load: Mapping[str, Any], concurrent: bool) -> list[dict[str, Any]]:
    stages = load.get("stages")
    if not isinstance(stages, list) or not stages:
        if load.get("sweep") is not None:
            raise InferSimError("inference-perf profile: load.sweep finds its stages by probing a live server's "
                                "saturation; give load.stages (or use --rate-sweep)")
        raise InferSimError(f"inference-perf profile: load.stages: expected a list of stages (got {echo(stages)})")
    out = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Mapping):
            raise InferSimError(f"inference-perf profile: load.stages[{i}]: expected a mapping (got {echo(stage)})")
        if concurrent:
            out.append({"concurrency": stage.get("concurrency_level"), "num_requests": stage.get("num_requests")})
        else:
            out.append({"rate": stage.get("rate"), "duration_s": stage.get("duration")})
    return out


def _data(data: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    kind = data.get("type", "mock")
    if kind == "shared_prefix":
        sp = data.get("shared_prefix")
        if not isinstance(sp, Mapping):
            raise InferSimError("inference-perf profile: data.type shared_prefix needs data.shared_prefix")
        if sp.get("multimodal") is not None or data.get("multimodal") is not None:
            notes.append("inference-perf profile: multimodal content is not modelled (its tokens are not counted)")

        def length(key: str, legacy: str | None, default: Any) -> Any:
            value = sp.get(key, default)
            if not isinstance(value, Mapping) and legacy and sp.get(legacy) is not None:
                value = sp[legacy]
            return _distribution(value, f"data.shared_prefix.{key}")

        return {"type": "shared_prefix",
                "num_groups": sp.get("num_groups", sp.get("num_unique_system_prompts", 10)),
                "prompts_per_group": sp.get("num_prompts_per_group", sp.get("num_users_per_system_prompt", 10)),
                "system_prompt_len": length("system_prompt_len", None, 100),
                "question_len": length("question_len", "question_distribution", 50),
                "output_len": length("output_len", "output_distribution", 50),
                "multi_turn": bool(sp.get("enable_multi_turn_chat", False)), "order": "cycle"}
    if kind in ("random", "synthetic"):
        if data.get("input_distribution") is None or data.get("output_distribution") is None:
            raise InferSimError(f"inference-perf profile: data.type {kind} needs input_distribution and "
                                "output_distribution")
        if kind == "synthetic":
            notes.append("inference-perf profile: data.type synthetic takes its prompts from a text corpus; they are "
                         "taken to share no prefix")
        return {"type": "random", "input": _distribution(data["input_distribution"], "data.input_distribution"),
                "output": _distribution(data["output_distribution"], "data.output_distribution")}
    raise InferSimError(f"inference-perf profile: data.type {echo(kind)} reads a dataset whose token counts need its "
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
    if kind not in LOAD_TYPES:
        raise InferSimError(f"{source}: load.type {echo(kind)} is not modelled from a profile (constant, poisson and "
                            "concurrent are; replay a trace with --trace)")
    notes: list[str] = []
    form: dict[str, Any] = {"load": {"stages": _stages(load, kind == "concurrent"),
                                     "interval_s": load.get("interval", 1.0)},
                            "data": _data(data, notes)}
    if LOAD_TYPES[kind] is not None:
        form["load"]["timer"] = LOAD_TYPES[kind]
    ignored = _not_read(profile)
    if ignored:
        notes.append(f"{source}: not read: " + "; ".join(ignored))
    form["notes"] = notes
    return form
