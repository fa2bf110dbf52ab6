"""Calibrate on a reference file: simulate its experiments, fit the constants, build the profile.

    from infersim.calibrate.run import calibrate
    outcome = calibrate([Path("runs.yaml")], hardware="h100-sxm", engine="vllm@0.15")
    outcome.profile   # the mapping `--out` writes; a run config's `calibration:` reads it back
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError, NotPossible
from infersim.base.stats import percentile
from infersim.calibrate.data import (
    METRICS,
    Experiment,
    Reference,
    load_bench_results,
    load_reference,
    predict_experiment,
    run_mapping,
)
from infersim.calibrate.fit import FitResult, FitSettings, Observation, fit_constants
from infersim.calibrate.traces import TRACE_METRIC, load_traces, predict_traced, traced_comparisons
from infersim.serve.trainval import STAGE_WINDOW_S
from infersim.cards.calibration import (
    CONSTANT_BY_NAME,
    CONSTANTS,
    PROFILE_KIND,
    Constant,
    card_value,
    with_constants,
)

INTERVAL_LEVEL = 0.9  # the prediction interval spans the held-out ratios' 5th to 95th percentile
MIN_INTERVAL_POINTS = 5  # fewer held-out points per metric give no interval


@dataclass(frozen=True)
class Calibration:
    reference: Reference
    experiments: tuple[Experiment, ...]  # those simulated (the others are in `skipped`)
    skipped: tuple[str, ...]
    result: FitResult
    priors: Mapping[str, float]
    profile: dict[str, Any]
    max_stage_s: float | None


def choose_constants(names: Sequence[str] | None) -> tuple[Constant, ...]:
    if not names:
        return CONSTANTS
    unknown = [n for n in names if n not in CONSTANT_BY_NAME]
    if unknown:
        raise InferSimError(f"--constants: unknown {', '.join(unknown)} (known: {', '.join(CONSTANT_BY_NAME)})")
    return tuple(CONSTANT_BY_NAME[n] for n in dict.fromkeys(names))


def _config(reference: Reference, experiment: Experiment, built: dict[Any, Any]) -> Any:
    from infersim.run.config import config_from_mapping, load_run_config

    key = experiment.config or (experiment.model, experiment.gpus)
    if key not in built:
        built[key] = (load_run_config(experiment.config) if experiment.config else
                      config_from_mapping(run_mapping(experiment, reference.hardware, reference.engine),
                                          f"experiment {experiment.id}"))
        if built[key].calibration is not None:
            raise InferSimError(f"{experiment.config}: the run config applies a calibration profile; calibrate "
                                "from the cards (drop its `calibration` key)")
    return built[key]


def _configs(reference: Reference) -> tuple[list[Any], list[Experiment], list[str]]:
    configs, kept, skipped = [], [], []
    built: dict[Any, Any] = {}
    for experiment in reference.experiments:
        config = _config(reference, experiment, built)
        try:
            if experiment.trace is None:  # a traced module was simulated when its trace was read
                predict_experiment(config, experiment)
        except NotPossible as exc:
            skipped.append(f"{experiment.id}: {exc}")
            continue
        except InferSimError as exc:  # a value the simulation refuses came from the experiment's file
            if not experiment.source:
                raise
            raise InferSimError(f"{experiment.source}: {exc}") from None
        configs.append(config)
        kept.append(experiment)
    cards = {(c.hardware.name, c.engine.name, c.engine.version) for c in configs}
    if len(cards) > 1:
        raise InferSimError("calibrate: the runs name several GPU/engine cards (" + ", ".join(
            f"{h} + {e} {v}" for h, e, v in sorted(cards)) + "); a profile is fitted per GPU and engine: calibrate "
            "each on its own")
    return configs, kept, skipped


def fitted_metrics(result: FitResult) -> list[str]:
    """The metrics measured: the serving ones in their order, then a trace's kernel time."""
    present = {o.metric for o in result.observations}
    return [m for m in (*METRICS, TRACE_METRIC) if m in present]


def relative_errors(result: FitResult, which: Sequence[float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {m: [] for m in fitted_metrics(result)}
    for o, predicted in zip(result.observations, which):
        out[o.metric].append(predicted / o.measured - 1)
    return out


def median_abs(values: Sequence[float]) -> float:
    return percentile(sorted(abs(v) for v in values), 50) if values else float("nan")


def prediction_intervals(result: FitResult) -> dict[str, dict[str, float]]:
    """Per metric: the 5th and 95th percentile of measured / predicted over held-out predictions."""
    if result.held_out is None:
        return {}
    out = {}
    for metric in fitted_metrics(result):
        ratios = sorted(o.measured / p for o, p in zip(result.observations, result.held_out) if o.metric == metric)
        if len(ratios) >= MIN_INTERVAL_POINTS:
            tail = (1 - INTERVAL_LEVEL) / 2 * 100
            out[metric] = {"low": round(percentile(ratios, tail), 4), "high": round(percentile(ratios, 100 - tail), 4),
                           "level": INTERVAL_LEVEL, "points": len(ratios)}
    return out


def _profile(reference: Reference, engine: Any, hardware: Any, experiments: Sequence[Experiment],
             result: FitResult, priors: Mapping[str, float], settings: FitSettings,
             max_stage_s: float | None) -> dict[str, Any]:
    constants = {f.constant.name: {"value": float(f"{f.value:.6g}"), "uncertainty": float(f"{f.sd:.3g}"),
                                   "prior": priors[f.constant.name], "card": f.constant.field,
                                   "meaning": f.constant.meaning} for f in result.fitted}
    refused = {c.name: why for c, why in result.refused}
    errors: dict[str, dict[str, float | None]] = {}
    for metric in fitted_metrics(result):
        before = relative_errors(result, result.before)[metric]
        after = relative_errors(result, result.after)[metric]
        held = relative_errors(result, result.held_out)[metric] if result.held_out else []
        errors[metric] = {"points": len(before), "median_abs_before": round(median_abs(before), 4),
                          "median_abs_after": round(median_abs(after), 4),
                          "median_abs_held_out": round(median_abs(held), 4) if held else None}
    points = [{"experiment": experiments[o.experiment].id, "stage": o.stage, "metric": o.metric,
               "measured_ms": o.measured, "before_ms": round(b, 4), "after_ms": round(a, 4),
               **({"held_out_ms": round(result.held_out[i], 4)} if result.held_out else {})}
              for i, (o, b, a) in enumerate(zip(result.observations, result.before, result.after))]
    return {"kind": PROFILE_KIND,
            "applies_to": {"hardware": hardware.name, "engine": engine.name, "engine_version": engine.version},
            "constants": constants, "refused": refused, "prediction_interval": prediction_intervals(result),
            "errors": errors, "points": points,
            "provenance": {"reference": list(reference.sources), "experiments": len(experiments),
                           "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "method": "MAP fit toward the card values on ln(predicted / measured), Huber loss "
                                     f"{settings.huber:g}, noise per metric "
                                     + ", ".join(f"{m} {v:g}" for m, v in settings.noise)
                                     + ("; each experiment weighs the same" if settings.weigh_experiments else "")
                                     + ("; constants kept only where better held out" if settings.held_out_gate else "")
                                     + "; held-out: leave one experiment out (infersim.calibrate.fit)",
                           "max_stage_s": max_stage_s, "simulations": result.evaluations}}


def calibrate(paths: Sequence[Path], hardware: str | None = None, engine: str | None = None,
              constants: Sequence[str] | None = None, settings: FitSettings | None = None,
              max_stage_s: float | None = STAGE_WINDOW_S, bench_results: Sequence[Path] = (),
              config: str | None = None, traces: Sequence[Path] = ()) -> Calibration:
    """Fit on the experiments of reference files (`paths`), of benchmark results (`bench_results`)
    and of profiler traces (`traces`), the last two on the run config `config`."""
    settings = settings or FitSettings()
    if not paths and not bench_results and not traces:
        raise InferSimError("calibrate: give --reference FILE, --bench-result FILE or --trace FILE (the last two "
                            "with --config)")
    reference = load_reference(list(paths), hardware, engine, max_stage_s) if paths else Reference((), "", "", ())
    bench = load_bench_results(list(bench_results), config)
    traced, unused = load_traces(list(traces), config)
    added = [*bench, *(Experiment(f"{Path(t.trace).name}:{t.point}", "", 0, {}, ((t.point, TRACE_METRIC, ms),),
                                  (), config, t) for t, ms in traced)]
    if added:
        reference = replace(reference, sources=(*reference.sources, *map(str, (*bench_results, *traces))),
                            experiments=(*reference.experiments, *added))
    configs, kept, skipped = _configs(reference)
    skipped += unused
    if not kept:
        raise NotPossible("calibrate: no experiment of the reference can be simulated: " + "; ".join(skipped))
    base = configs[0]
    chosen = choose_constants(constants)
    priors = {c.name: card_value(c, base.hardware, base.engine) for c in chosen}
    for c in chosen:
        if c.log and priors[c.name] <= 0:
            raise InferSimError(f"calibrate: {c.name} is {priors[c.name]:g} on the card ({c.field}); a multiplier "
                                "needs a positive card value")
    observations = [Observation(k, stage, metric, value) for k, e in enumerate(kept) for stage, metric, value in e.measured]

    # a traced lane's simulation at the constants last asked for, shared by the lane's modules (each
    # its own experiment): keyed by the constants and the lane, all traces running on one --config
    lanes: dict[tuple[Any, ...], Any] = {}

    def predict(values: Mapping[str, float], k: int) -> Mapping[tuple[str, str], float]:
        config = configs[k]
        hw, eng = with_constants(config.hardware, config.engine, values)
        constrained = replace(config, hardware=hw, engine=eng)
        traced = kept[k].trace
        if traced is None:
            return predict_experiment(constrained, kept[k])
        key = (tuple(sorted(values.items())), traced.trace, traced.rank)
        if key not in lanes:
            if lanes and next(iter(lanes))[0] != key[0]:
                lanes.clear()  # other constants: the lanes simulated at the last ones are not asked again
            lanes[key] = traced_comparisons(constrained, traced)
        return predict_traced(constrained, traced, lanes[key])

    result = fit_constants(chosen, priors, observations, predict, settings)
    profile = _profile(reference, base.engine, base.hardware, kept, result, priors, settings, max_stage_s)
    return Calibration(reference, tuple(kept), tuple(skipped), result, priors, profile, max_stage_s)
