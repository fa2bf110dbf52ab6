"""Measured serving runs to calibrate on, and the simulator's prediction of each.

A benchmark result (`vllm bench serve --save-result`, `sglang.bench_serving --output-file`) is
one experiment per result, its whole run's mean TTFT, ITL and E2E measured, on the deployment a run
config names. A reference file holds `experiments:` in the form of ../shared/reference/vllm_serving_trainval.yaml
(infersim.serve.trainval): each with its model, GPU count (`tp`), the server's `vllm:` limits, the
`workload:` the load generator sent, and `measured:` per load stage (stage_0, stage_1, ...) the
mean TTFT, ITL and E2E in milliseconds. Which GPU and engine card the runs used is given on the
command line when the file does not name a bundled card (`hardware: {card: h100-sxm}`, `engine:`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError, NotPossible, echo

#: the metrics fitted: the reference file's name -> the serving summary's name (per stage)
METRICS: dict[str, str] = {"ttft_mean_ms": "mean_ttft_ms", "itl_mean_ms": "mean_itl_ms", "e2e_mean_ms": "mean_e2el_ms"}


#: the stage name of a benchmark result's whole run (it has no load stages)
WHOLE_RUN = "run"


@dataclass(frozen=True)
class Experiment:
    id: str
    model: str
    gpus: int
    options: Mapping[str, Any]  # serve options (infersim.serve.api), stages cut to max_stage_s
    measured: tuple[tuple[str, str, float], ...]  # (stage, metric, value in ms)
    notes: tuple[str, ...] = ()
    config: str | None = None  # a run config file that names the deployment (benchmark results), else built here
    trace: Any = None  # a traced module (infersim.calibrate.traces.TracedModule): measured kernel time, not serving
    source: str = ""  # the file (and line or experiment) it was read from: what a message about it names


@dataclass(frozen=True)
class Reference:
    sources: tuple[str, ...]
    hardware: str
    engine: str
    experiments: tuple[Experiment, ...]


def _measured(experiment: Mapping[str, Any], where: str) -> tuple[tuple[str, str, float], ...]:
    stages = experiment.get("measured")
    if not isinstance(stages, Mapping):
        raise InferSimError(f"{where}: no 'measured' stanza (got {echo(stages)})")
    out = []
    for stage, values in stages.items():
        if not str(stage).startswith("stage_") or not isinstance(values, Mapping):
            continue  # whole_run repeats the stages
        for metric in METRICS:
            value = values.get(metric)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise InferSimError(f"{where}: measured.{stage}.{metric}: expected a positive number of ms "
                                    f"(got {echo(value)})")
            out.append((str(stage), metric, float(value)))
    if not out:
        raise InferSimError(f"{where}: measured: no stage_N with {', '.join(METRICS)}")
    return tuple(out)


def _card_of(experiment: Mapping[str, Any], key: str, given: str | None) -> str | None:
    if given:
        return given
    stated = experiment.get(key)
    if isinstance(stated, str):
        return stated
    if isinstance(stated, Mapping) and isinstance(stated.get("card"), str):
        return stated["card"]
    return None


def _bench_config(config: str) -> Any:
    from infersim.run.config import load_run_config

    return load_run_config(config)


def _refuse_other_engine(backend: str, engine: str, where: str, config: str) -> None:
    """A result measured on another engine than the config's would fit that engine's constants to
    the other's runs."""
    from infersim.serve.bench_result import engine_of_backend

    import re

    card = engine_of_backend(backend)  # the bundled card's file name: <engine>[-<version>]
    ran = re.sub(r"-\d[\d.]*$", "", card) if card is not None else engine
    if ran != engine:
        raise InferSimError(f"{where}: the result's backend '{backend}' ran {ran}, but --config {config} "
                            f"runs {engine}: give a config of the engine the benchmark ran")


def _refuse_other_model(model_id: str, card: Any, where: str, config: str) -> None:
    """A result of another model than the config's would fit the constants to runs the simulation
    does not replay (infersim.cards.registry.other_bundled_model tells)."""
    from infersim.cards.registry import other_bundled_model

    found = other_bundled_model(model_id, card)
    if found is None:
        return
    checkpoint = f" (checkpoint {card.checkpoint})" if card.checkpoint else ""
    raise InferSimError(f"{where}: the result's model_id '{model_id}' names the bundled model {found.card} "
                        f"({found.how}), but --config {config} runs {card.name}{checkpoint}: give a config of the "
                        "model the benchmark served")


def load_bench_results(paths: list[Path], config: str | None) -> list[Experiment]:
    """Each result of `vllm bench serve` / `sglang.bench_serving` files as an experiment of one
    whole run (its load replayed as infersim.serve.bench_result does), on the run config `config`."""
    from infersim.serve.bench_result import (
        is_serving_result,
        parse_serving_result,
        serve_options,
    )
    from infersim.trace.bench import read_result_objects

    if not paths:
        return []
    if config is None:
        raise InferSimError("--bench-result: give --config RUN.yaml, the model, GPUs and engine the benchmark ran")
    run_config = _bench_config(config)
    experiments = []
    for path in paths:
        for line, data in read_result_objects(path):
            where = f"{path}: line {line}"
            if not is_serving_result(data):
                raise InferSimError(f"{where}: not a vllm bench serve or sglang.bench_serving result")
            result = parse_serving_result(data, str(path), line)
            _refuse_other_engine(result.backend, run_config.engine.name, where, str(config))
            _refuse_other_model(result.model_id, run_config.model, where, str(config))
            measured = tuple((WHOLE_RUN, metric, result.measured[key]) for metric, key in METRICS.items()
                             if result.measured.get(key))
            if not measured:
                raise InferSimError(f"{where}: none of {', '.join(METRICS.values())} measured")
            options, notes = serve_options(result)
            experiments.append(Experiment(f"{path.name}:{line}", result.model_id or "", 0, options, measured,
                                          tuple(notes), config, source=where))
    return experiments


#: the `vllm:` counts infersim.serve.trainval converts with int(), and the least each may be
_VLLM_COUNTS = (("max_num_seqs", 1), ("max_num_batched_tokens", 1), ("gpu_kv_cache_blocks", 1),
                ("cpu_kv_offload_blocks", 0))
#: the `workload:` counts it passes on (a length may also be a distribution: a mapping, checked later)
_WORKLOAD_COUNTS = (("num_unique_system_prompts", 1), ("num_users_per_system_prompt", 1), ("system_prompt_len", 0),
                    ("question_len", 1), ("output_len", 1))


def _counted(stanza: Mapping[str, Any], name: str, counts: tuple[tuple[str, int], ...], where: str) -> dict[str, Any]:
    from infersim.cards.schema import check_number

    out = dict(stanza)
    for key, least in counts:
        if stanza.get(key) is not None and not isinstance(stanza[key], Mapping):
            out[key] = int(check_number(stanza[key], where, f"{name}.{key}", whole=True, ge=least))
    return out


def _checked_stages(workload: dict[str, Any], where: str) -> None:
    from infersim.cards.schema import check_number

    stages = workload.get("stages")
    if not isinstance(stages, list):
        return  # trainval_workload says there are none
    checked = []
    for index, stage in enumerate(stages):
        if isinstance(stage, Mapping):
            stage = dict(stage)
            for key in ("rate_rps", "duration_s"):
                if stage.get(key) is not None:
                    stage[key] = float(check_number(stage[key], where, f"workload.stages[{index}].{key}", gt=0))
        checked.append(stage)
    workload["stages"] = checked


def _checked(run: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`run` with the numbers infersim.serve.trainval converts (with int() and float(), or reads as
    they come) passed through the number rule first: a bad one is refused naming the file, its key and
    its value, rather than by int() or, later, by the simulation under the name of a serving option."""
    from infersim.cards.schema import check_number

    out = dict(run)
    for name, counts in (("vllm", _VLLM_COUNTS), ("workload", _WORKLOAD_COUNTS)):
        stanza = run.get(name)
        if not isinstance(stanza, Mapping):
            raise InferSimError(f"{where}: no '{name}' stanza (got {echo(stanza)})")
        out[name] = _counted(stanza, name, counts, where)
    _checked_stages(out["workload"], where)
    hf_config = run.get("hf_config")
    if hf_config is not None:
        if not isinstance(hf_config, Mapping):
            raise InferSimError(f"{where}: hf_config: expected a mapping (got {echo(hf_config)})")
        positions = hf_config.get("max_position_embeddings")
        if positions is not None:  # a context holds at least a token in and one out
            out["hf_config"] = {**hf_config, "max_position_embeddings":
                                int(check_number(positions, where, "hf_config.max_position_embeddings", whole=True,
                                                 ge=2))}
    return out


def _experiment(run: Mapping[str, Any], index: int, where: str, max_stage_s: float | None) -> Experiment:
    """One experiment of a reference file (`run`, its `index`-th), its serving options checked as the
    simulation will read them; `where` names the file and the experiment."""
    from infersim.serve.trainval import trainval_options
    from infersim.serve.workload_spec import parse_workload

    tp = run.get("tp", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InferSimError(f"{where}: tp: expected a whole number of GPUs (got {echo(tp)})")
    try:
        # multi-turn rounds as the runs of this format sent them: fixed-length requests
        # (the same expansion as validate's trainval source, infersim.serve.trainval.FIXED_ROUNDS_NOTE)
        options = trainval_options(_checked(run, where), max_stage_s, session_context=False)
    except (KeyError, TypeError) as exc:
        raise InferSimError(f"{where}: workload or vllm stanza incomplete ({exc})") from None
    parse_workload(options["workload"], f"{where}: workload")  # the rest of the workload, before any run
    return Experiment(str(run.get("id", index)), run["model"], tp, options, _measured(run, where),
                      tuple(options["workload"].get("notes", ())), source=where)


def load_reference(paths: list[Path], hardware: str | None, engine: str | None,
                   max_stage_s: float | None) -> Reference:
    """The experiments of reference files; `hardware` and `engine` (card names) name what the runs
    used where the files do not."""
    from infersim.base.errors import ConfigError
    from infersim.cards.schema import load_yaml

    experiments: list[Experiment] = []
    cards: set[tuple[str, str]] = set()
    seen: dict[str, str] = {}  # experiment id -> the file that gave it first
    for path in paths:
        if path.is_dir():
            raise InferSimError(f"--reference {path}: is a directory, not a reference file")
        if not path.is_file():
            raise InferSimError(f"--reference {path}: no such file")
        try:  # load_yaml: text that is not UTF-8, a key given twice, nesting too deep are one message each
            data = load_yaml(path, "reference file")
        except ConfigError as exc:
            raise InferSimError(f"--reference {exc}") from None
        runs = data.get("experiments") if isinstance(data, Mapping) else None
        if not isinstance(runs, list) or not runs:
            raise InferSimError(f"--reference {path}: expected 'experiments:', a list of measured serving runs "
                                "(the form of vllm_serving_trainval.yaml)")
        for index, run in enumerate(runs):
            if not isinstance(run, Mapping) or not isinstance(run.get("model"), str):
                raise InferSimError(f"{path}: experiments[{index}]: expected a mapping with model, tp, vllm, "
                                    "workload, measured")
            where = f"{path}: experiment {run.get('id', index)}"
            if "id" in run:  # a run given twice would count twice in the fit
                key = str(run["id"])
                if key in seen:
                    raise InferSimError(f"--reference {path}: experiment id {key} is given twice (also in "
                                        f"{seen[key]}); each measured run counts once in a fit")
                seen[key] = str(path)
            gpu, eng = _card_of(run, "hardware", hardware), _card_of(run, "engine", engine)
            if gpu is None or eng is None:
                missing = " and ".join(f for f, v in (("--hardware", gpu), ("--engine", eng)) if v is None)
                raise InferSimError(f"{where}: names no bundled {'GPU' if gpu is None else 'engine'} card; give "
                                    f"{missing} (e.g. --hardware h100-sxm --engine vllm@0.15)")
            cards.add((gpu, eng))
            experiments.append(_experiment(run, index, where, max_stage_s))
    if len(cards) > 1:
        raise InferSimError("--reference: the experiments name several GPU/engine cards "
                            f"({', '.join(sorted(f'{g} + {e}' for g, e in cards))}); a profile is fitted per GPU and "
                            "engine: calibrate each on its own")
    gpu, eng = cards.pop() if cards else (hardware or "", engine or "")
    return Reference(tuple(str(p) for p in paths), gpu, eng, tuple(experiments))


def run_mapping(experiment: Experiment, hardware: str, engine: str) -> dict[str, Any]:
    """The run config of one experiment: the model on `gpus` GPUs, tensor-parallel (vLLM's
    --tensor-parallel-size; experts split the same way, no expert parallelism)."""
    n = experiment.gpus
    return {"model": experiment.model, "hardware": hardware, "engine": engine,
            "deployment": {"num_gpus": n, "attention": {"tp": n, "dp": 1}, "ffn": {"tp": n, "ep": 1}},
            "workload": {"isl": 1024, "osl": 256}}


def predict_experiment(config: Any, experiment: Experiment) -> dict[tuple[str, str], float]:
    """(stage, metric) -> predicted ms of one experiment under `config` (a RunConfig)."""
    from infersim.serve.api import simulate_serving

    if experiment.trace is not None:
        from infersim.calibrate.traces import predict_traced

        return predict_traced(config, experiment.trace)

    summary = simulate_serving(config, dict(experiment.options))
    stages = summary.get("stages") or []
    out: dict[tuple[str, str], float] = {}
    for stage, metric, _value in experiment.measured:
        if stage == WHOLE_RUN:
            predicted = summary.get(METRICS[metric])
        else:
            index = int(stage.split("_", 1)[1])
            if index >= len(stages):
                raise NotPossible(f"experiment {experiment.id}: the simulated run has no {stage}")
            predicted = stages[index].get(METRICS[metric])
        if not predicted or predicted <= 0:
            why = [w for w in summary.get("warnings", []) if "no request completed" in w]
            why += [n for n in summary.get("notes", []) if "rejected" in n]
            raise NotPossible(f"experiment {experiment.id}: no {METRICS[metric]} predicted for {stage} "
                              f"({'; '.join(why) if why else 'no request completed'})")
        out[(stage, metric)] = float(predicted)
    return out
