"""Calibration profiles: physical constants of one (GPU, engine) fitted to a user's own measured runs.

A profile (written by `infersim calibrate`, read through a run config's `calibration:` key) sets a
few card fields to the values the measurements call for. Each constant is a field that already
exists on the hardware or engine card, so a calibrated run differs from an uncalibrated one only in
those fields; everything else (kernel tables, roofline, scheduler) stays as the cards say.

    kind: infersim-calibration
    applies_to: {hardware: h100-sxm, engine: vllm, engine_version: "0.15.1"}
    constants:
      gemm_time_scale: {value: 1.08, uncertainty: 0.04, prior: 1.0, card: hardware.derates.kernel_time_scale.gemm}
      ...
    refused: {step_cpu: "why it was not fitted"}
    prediction_interval: {ttft_mean_ms: {low: 0.81, high: 1.22, level: 0.9}}   # measured / predicted
    errors, points, provenance: what was fitted on, and how well (for the reader)

The constants, their cards' fields, plausible ranges and prior widths are CONSTANTS below; the
ranges are physical (a kernel running at half or twice its tabulated time on the same GPU model
is the most a driver, clock or build difference was seen to do; host times of a Python engine are
microseconds per request and a few milliseconds per step at most).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from infersim.base.errors import InferSimError, echo
from infersim.cards.engine import EngineCard
from infersim.cards.hardware import HardwareCard

PROFILE_KIND = "infersim-calibration"


@dataclass(frozen=True)
class Constant:
    """One fittable constant: the card field it sets, how it is fitted and what values are plausible."""

    name: str
    card: Literal["hardware", "engine"]
    path: tuple[str, ...]  # the field inside the card
    log: bool  # a multiplier, fitted in log space (prior_sd in log units); else seconds, fitted as is
    low: float
    high: float
    prior_sd: float
    meaning: str

    @property
    def field(self) -> str:
        return ".".join((self.card, *self.path))


CONSTANTS: tuple[Constant, ...] = (
    Constant("gemm_time_scale", "hardware", ("derates", "kernel_time_scale", "gemm"), True, 0.5, 2.0, 0.2,
             "GEMM time on this cluster over the kernel tables' / roofline's"),
    Constant("attention_time_scale", "hardware", ("derates", "kernel_time_scale", "attention"), True, 0.5, 2.0, 0.2,
             "attention kernel time over the tables' / roofline's"),
    Constant("memory_time_scale", "hardware", ("derates", "kernel_time_scale", "memory"), True, 0.5, 2.5, 0.25,
             "memory-bound elementwise kernel time (norms, rotary, activations) over the tables' / roofline's"),
    Constant("collective_time_scale", "hardware", ("derates", "kernel_time_scale", "collectives"), True, 0.5, 3.0, 0.3,
             "collective (all-reduce, all-gather, token exchange) time over the tables' / NCCL model's"),
    Constant("kv_transfer_efficiency", "hardware", ("derates", "pcie_efficiency"), True, 0.2, 1.0, 0.25,
             "achieved fraction of PCIe bandwidth moving KV between host and GPU"),
    Constant("step_fixed", "engine", ("overheads", "step_fixed"), False, 0.0, 5e-3, 0.5e-3,
             "host time per step on the critical path (seconds)"),
    Constant("step_cpu", "engine", ("overheads", "step_cpu"), False, 0.0, 5e-3, 1e-3,
             "scheduler CPU time per step, hidden by an overlap scheduler while the GPU step is longer (seconds)"),
    Constant("request_cpu", "engine", ("overheads", "request_cpu"), False, 0.0, 200e-6, 20e-6,
             "CPU time per request in a step (seconds)"),
    Constant("api_server_latency", "engine", ("overheads", "api_server_latency"), False, 0.0, 50e-3, 5e-3,
             "API-server time per request outside the engine core, in and out (seconds)"),
)
CONSTANT_BY_NAME = {c.name: c for c in CONSTANTS}


@dataclass(frozen=True)
class FittedConstant:
    name: str
    value: float
    uncertainty: float  # one standard deviation, in the constant's own units
    prior: float


@dataclass(frozen=True)
class CalibrationProfile:
    source: str
    hardware: str
    engine: str
    engine_version: str
    constants: tuple[FittedConstant, ...]
    # metric -> (low, high, level): the measured value over the calibrated prediction, held-out
    prediction_interval: tuple[tuple[str, float, float, float], ...] = ()

    def describe(self) -> str:
        fitted = ", ".join(f"{c.name} {format_value(CONSTANT_BY_NAME[c.name], c.value)}" for c in self.constants)
        return (f"calibration {self.source} ({self.hardware}, {self.engine} {self.engine_version}): "
                f"{fitted or 'no constant fitted'}")

    def interval(self, metric: str) -> tuple[float, float, float] | None:
        for name, low, high, level in self.prediction_interval:
            if name == metric:
                return low, high, level
        return None


def format_value(constant: Constant, value: float) -> str:
    """A multiplier as is; a time in ms from a millisecond up, else in us."""
    if constant.log or value == 0:
        return f"{value:.3g}"
    return f"{value * 1e3:.3g} ms" if abs(value) >= 1e-3 else f"{value * 1e6:.3g} us"


def card_value(constant: Constant, hardware: HardwareCard, engine: EngineCard) -> float:
    node: Any = hardware if constant.card == "hardware" else engine
    for part in constant.path:
        node = getattr(node, part)
    return float(node)


def _set_path(node: Any, path: tuple[str, ...], value: float) -> Any:
    if len(path) == 1:
        return replace(node, **{path[0]: value})
    return replace(node, **{path[0]: _set_path(getattr(node, path[0]), path[1:], value)})


def with_constants(hardware: HardwareCard, engine: EngineCard,
                   values: Mapping[str, float]) -> tuple[HardwareCard, EngineCard]:
    """The two cards with the named constants set (validated cards in, cards of the same type out)."""
    for name, value in values.items():
        constant = CONSTANT_BY_NAME[name]
        if constant.card == "hardware":
            hardware = _set_path(hardware, constant.path, value)
        else:
            engine = _set_path(engine, constant.path, value)
    return hardware, engine


def applies(profile: CalibrationProfile, hardware: HardwareCard, engine: EngineCard) -> str:
    """'' when the profile is for this GPU and engine; else why not."""
    if hardware.name != profile.hardware:
        return f"it was fitted on {profile.hardware}, and the run's GPU is {hardware.name}"
    if engine.name != profile.engine or engine.version != profile.engine_version:
        return (f"it was fitted with {profile.engine} {profile.engine_version}, and the run's engine is "
                f"{engine.name} {engine.version}")
    return ""


def apply_profile(profile: CalibrationProfile, hardware: HardwareCard,
                  engine: EngineCard) -> tuple[HardwareCard, EngineCard]:
    """The cards with the profile's constants set; a profile for another GPU or engine is refused."""
    why = applies(profile, hardware, engine)
    if why:
        raise InferSimError(f"calibration {profile.source}: does not apply: {why}")
    return with_constants(hardware, engine, {c.name: c.value for c in profile.constants})


# ---------------------------------------------------------------------------------------------
# Reading a profile file


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InferSimError(f"{where}: expected a number (got {echo(value)})")
    return float(value)


def _constant(name: Any, body: Any, where: str) -> FittedConstant:
    if name not in CONSTANT_BY_NAME:
        raise InferSimError(f"{where}: unknown constant {echo(name)} (known: {', '.join(CONSTANT_BY_NAME)})")
    if not isinstance(body, Mapping) or "value" not in body:
        raise InferSimError(f"{where}.{name}: expected a mapping with value and uncertainty (got {echo(body)})")
    constant = CONSTANT_BY_NAME[name]
    value = _number(body["value"], f"{where}.{name}.value")
    if not constant.low <= value <= constant.high:
        raise InferSimError(f"{where}.{name}.value: {value:g} is outside the plausible range "
                            f"{constant.low:g}..{constant.high:g} of {constant.meaning}")
    uncertainty = _number(body.get("uncertainty", 0.0), f"{where}.{name}.uncertainty")
    prior = _number(body.get("prior", value), f"{where}.{name}.prior")
    return FittedConstant(name, value, uncertainty, prior)


def _intervals(raw: Any, where: str) -> tuple[tuple[str, float, float, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InferSimError(f"{where}: expected a mapping of metric -> {{low, high, level}} (got {echo(raw)})")
    out = []
    for metric, body in raw.items():
        if not isinstance(body, Mapping):
            raise InferSimError(f"{where}.{metric}: expected {{low, high, level}} (got {echo(body)})")
        low, high = _number(body.get("low"), f"{where}.{metric}.low"), _number(body.get("high"), f"{where}.{metric}.high")
        level = _number(body.get("level"), f"{where}.{metric}.level")
        if not 0 < low <= high or not 0 < level < 1:
            raise InferSimError(f"{where}.{metric}: expected 0 < low <= high and 0 < level < 1 (got {echo(dict(body))})")
        out.append((str(metric), low, high, level))
    return tuple(out)


def profile_from_mapping(data: Any, source: str) -> CalibrationProfile:
    if not isinstance(data, Mapping) or data.get("kind") != PROFILE_KIND:
        raise InferSimError(f"calibration {source}: not a calibration profile (expected 'kind: {PROFILE_KIND}', "
                            "as `infersim calibrate --out` writes)")
    target = data.get("applies_to")
    if not isinstance(target, Mapping) or not all(isinstance(target.get(k), str)
                                                  for k in ("hardware", "engine", "engine_version")):
        raise InferSimError(f"calibration {source}: applies_to: expected hardware, engine and engine_version "
                            f"(got {echo(target)})")
    constants = data.get("constants") or {}
    if not isinstance(constants, Mapping):
        raise InferSimError(f"calibration {source}: constants: expected a mapping (got {echo(constants)})")
    fitted = tuple(_constant(name, body, f"calibration {source}: constants") for name, body in constants.items())
    return CalibrationProfile(source, target["hardware"], target["engine"], target["engine_version"], fitted,
                              _intervals(data.get("prediction_interval"), f"calibration {source}: prediction_interval"))


def load_profile(path: str | Path, base: Path | None = None) -> CalibrationProfile:
    """A profile file; a relative path is looked up next to the run config first, then here."""
    from infersim.cards.schema import load_yaml

    candidate = Path(path)
    if not candidate.is_absolute() and base is not None and (base / candidate).is_file():
        candidate = base / candidate
    if not candidate.is_file():
        raise InferSimError(f"calibration {path}: {'is a directory, not a file' if candidate.is_dir() else 'no such file'}")
    return profile_from_mapping(load_yaml(candidate), str(path))
