"""Validation files measured on GPUs by benchmarks/gpu/measure_e2e.py (format infersim-gpu-validation-1).

Each point is self-contained: the cut HF config of the model it ran, the mode and engine card, the
hardware card of the GPU, batch, prompt and generated lengths, the metric, the measured value and the
run's provenance. Here each becomes a reference point and a mapping entry of the kinds `validate`
already runs, so they are compared beside the public reference:

  ttft_ms         stage_prefill, metric prefill.ttft_ms: `batch` prompts of `prompt_tokens` in one prefill step
                  (workload isl = prompt, prefill_tokens_per_gpu = batch x prompt)
  decode_step_ms  stage_decode, metric decode.tpot_ms at decode batch `batch`; eager (DynamicCache): osl =
                  N1 + N2, so the simulator's mean decode context isl + osl / 2 is the measured steps' mean
                  context prompt + (N1 + N2) / 2; compiled (StaticCache): osl = kv_capacity - prompt, the
                  allocation every step attends over
The model is the inline card infersim.cards.hf_import makes from the point's config (its layer count is the
cut one), the engine the point's card, one GPU, the tables the run would choose by itself (auto). Points of
a smoke run (`provenance.smoke`, a CPU proving the script) are listed as not expressed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infersim.cards.schema import check_number, load_yaml
from infersim.base.errors import MISSING, ConfigError
from infersim.validate.evaluate import NotExpressed, ReferencePoint
from infersim.validate.mapping import Conversion, PointMapping

FORMAT = "infersim-gpu-validation-1"
METRICS = {"ttft_ms": ("stage_prefill", "prefill.ttft_ms"), "decode_step_ms": ("stage_decode", "decode.tpot_ms")}
#: the bundled measured validation files (written by benchmarks/gpu/measure_e2e.py on the GPUs, committed here)
BUNDLED_DIR = Path(__file__).resolve().parent / "measured"


@dataclass
class MeasuredSet:
    """Reference points and their mapping from measured validation files, and what cannot be compared."""

    reference: dict[str, ReferencePoint] = field(default_factory=dict)
    mapping: dict[str, PointMapping] = field(default_factory=dict)
    not_expressed: list[NotExpressed] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def bundled_files() -> list[Path]:
    return sorted(BUNDLED_DIR.glob("*.yaml")) if BUNDLED_DIR.is_dir() else []


def _require(point: dict[str, Any], key: str, source: str, where: str) -> Any:
    if key not in point or point[key] is None:
        raise ConfigError(source, f"{where}.{key}", MISSING, "every measured point names it")
    return point[key]


def _text(point: dict[str, Any], key: str, source: str, where: str) -> str:
    value = _require(point, key, source, where)
    if not isinstance(value, str) or not value:
        raise ConfigError(source, f"{where}.{key}", value, "expected a name (text)")
    return value


def _whole(value: Any, source: str, where: str) -> int:
    return int(check_number(value, source, where, whole=True, ge=1))


def _smoke(provenance: Any, source: str, where: str) -> bool:
    """Whether a provenance mapping (a file's or a point's; absent: not) marks a smoke run."""
    if provenance is None:
        return False
    if not isinstance(provenance, dict):
        raise ConfigError(source, where, provenance, "expected a mapping (script, command, date, device, smoke ...)")
    smoke = provenance.get("smoke", False)
    if not isinstance(smoke, bool):
        raise ConfigError(source, f"{where}.smoke", smoke, "expected true or false")
    return smoke


def _new_tokens(point: dict[str, Any], source: str, where: str) -> tuple[int, int]:
    """The two generated-token counts (N1, N2) whose step times were differenced."""
    value = _require(point, "new_tokens", source, where)
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(source, f"{where}.new_tokens", value, "expected a list of two token counts [N1, N2]")
    n1, n2 = (_whole(n, source, f"{where}.new_tokens[{i}]") for i, n in enumerate(value))
    if n2 <= n1:
        raise ConfigError(source, f"{where}.new_tokens", value, "N2 must be larger than N1 (steps N1..N2 are timed)")
    return n1, n2


def _metric(point: dict[str, Any], source: str, where: str) -> str:
    metric = _require(point, "metric", source, where)
    if not isinstance(metric, str) or metric not in METRICS:
        raise ConfigError(source, f"{where}.metric", metric, f"expected one of {', '.join(METRICS)}")
    return metric


def point_run(point: dict[str, Any], source: str, where: str) -> tuple[str, dict[str, Any], str]:
    """(mapping kind, inline run config, why) of one measured point."""
    from infersim.cards.hf_import import card_fields_from_hf

    metric = _metric(point, source, where)
    model = _require(point, "model", source, where)
    if not isinstance(model, dict) or not isinstance(model.get("config"), dict):
        raise ConfigError(source, f"{where}.model.config", MISSING, "the point's HF config (a mapping)")
    name = model.get("name") or "measured-model"
    if not isinstance(name, str):
        raise ConfigError(source, f"{where}.model.name", name, "expected a name (text)")
    card = card_fields_from_hf(model["config"], f"{source} {where}.model.config", name)
    batch = _whole(_require(point, "batch", source, where), source, f"{where}.batch")
    prompt = _whole(_require(point, "prompt_tokens", source, where), source, f"{where}.prompt_tokens")
    run: dict[str, Any] = {"model": card, "hardware": _text(point, "hardware", source, where),
                           "engine": _text(point, "engine", source, where), "deployment": {"num_gpus": 1}}
    kind, _ = METRICS[metric]
    full = model.get("full_layers")
    full = "?" if full is None else _whole(full, source, f"{where}.model.full_layers")
    layers = f"{card['num_hidden_layers']} of {full} layers"
    mode = point.get("mode")
    if kind == "stage_prefill":
        run["workload"] = {"isl": prompt, "osl": 1, "prefill_tokens_per_gpu": batch * prompt,
                           "decode_batch_per_gpu": 1}
        why = f"{name} ({layers}), {mode} mode: one forward over {batch} x {prompt} prompt tokens"
        return kind, run, why
    capacity = point.get("kv_capacity")
    if capacity is not None:
        capacity = _whole(capacity, source, f"{where}.kv_capacity")
        osl = capacity - prompt
        why = f"static cache of {capacity} positions: osl = capacity - prompt"
        if osl < 1:
            raise ConfigError(source, f"{where}.kv_capacity", capacity, f"must exceed prompt_tokens ({prompt})")
    else:
        n1, n2 = _new_tokens(point, source, where)
        osl = n1 + n2
        why = f"steps {n1}..{n2} differenced: mean context prompt + (N1 + N2) / 2, so osl = N1 + N2"
    run["workload"] = {"isl": prompt, "osl": osl, "decode_batch_per_gpu": batch}
    return kind, run, f"{name} ({layers}), {mode} mode, decode batch {batch}, prompt {prompt}; {why}"


def load_measured(paths: list[Path]) -> MeasuredSet:
    """The points of measured validation files, as reference points and mapping entries."""
    out = MeasuredSet()
    for path in paths:
        source = str(path)
        data = load_yaml(Path(path), "measured validation file")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(source, "format", data.get("format", MISSING) if isinstance(data, dict) else MISSING,
                              f"expected a validation file of format {FORMAT} (benchmarks/gpu/measure_e2e.py)")
        points = data.get("points") or []
        if not isinstance(points, list):
            raise ConfigError(source, "points", points, "expected a list of measured points")
        out.files.append(source)
        smoke = _smoke(data.get("provenance"), source, "provenance")
        for index, point in enumerate(points):
            _add_point(out, point, source, f"points[{index}]", smoke)
    return out


def _add_point(out: MeasuredSet, point: Any, source: str, where: str, smoke: bool) -> None:
    """One measured point into `out`: a reference point and its mapping, or a smoke run not compared."""
    if not isinstance(point, dict):
        raise ConfigError(source, where, point, "expected a mapping (one measured point)")
    pid = _text(point, "id", source, where)
    where = f"{where} ({pid})"
    if pid in out.reference or any(n.id == pid for n in out.not_expressed):
        raise ConfigError(source, f"{where}.id", pid, "a second point with the same id")
    # the number rule of every reference value: positive, finite, of magnitude 1e-40..1e40
    value = float(check_number(_require(point, "value", source, where), source, f"{where}.value", gt=0))
    if point.get("unit", "ms") != "ms":
        raise ConfigError(source, f"{where}.unit", point.get("unit"), "measured points are in ms")
    mode = point.get("mode", "?")
    if not isinstance(mode, str):
        raise ConfigError(source, f"{where}.mode", mode, "expected a mode name (eager, compiled ...)")
    kind, run, why = point_run(point, source, where)
    label = f"GPU {run['hardware']} {mode}"
    if smoke or _smoke(point.get("provenance"), source, f"{where}.provenance"):
        out.not_expressed.append(NotExpressed(pid, label, kind, "smoke run on a CPU: proves "
                                              "benchmarks/gpu/measure_e2e.py, measures no GPU"))
        return
    metric = point["metric"]
    out.reference[pid] = ReferencePoint(pid, label, value, "ms", metric)
    out.mapping[pid] = PointMapping(pid, kind, why, {"": Conversion(METRICS[metric][1], unit="ms")}, run=run)
