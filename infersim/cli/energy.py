"""The energy section of a run's report, as text and as JSON-ready data (docs/energy.md, docs/cli.md)."""

from __future__ import annotations

from typing import Any

from infersim.engine.energy import KINDS, StepEnergy
from infersim.base.units import MS
from infersim.run.energy import EnergyUnavailable, RunEnergy, run_energy
from infersim.run.simulate import SimulationResult


def _step_json(step: StepEnergy) -> dict[str, Any]:
    return {"joules_per_gpu": step.joules, "step_ms": step.seconds / MS, "watts_per_gpu": step.watts,
            "seconds_by_kind": {kind: step.seconds_by_kind.get(kind, 0.0) for kind in KINDS},
            "power_capped": step.capped}


def energy_json(result: SimulationResult) -> dict[str, Any]:
    """The run's `energy` key: the figures, or {"available": false, "reason": ...}."""
    energy = run_energy(result)
    if isinstance(energy, EnergyUnavailable):
        return {"available": False, "reason": energy.reason}
    price = energy.electricity
    return {
        "available": True,
        "joules_per_output_token": energy.joules_per_output_token,
        "joules_per_request": energy.joules_per_request,
        "joules_per_prompt_token": energy.joules_per_prompt_token,
        "decode_joules_per_token": energy.joules_per_decode_token,
        "watts_per_gpu": energy.watts_per_gpu,
        "gpu_seconds_per_request": energy.gpu_seconds_per_request,
        "prefill": _step_json(energy.prefill),
        "decode": _step_json(energy.decode),
        "usd_per_kwh": price.usd_per_kwh,
        "pue": price.pue,
        "usd_per_gpu_hour": energy.usd_per_gpu_hour or None,
        "energy_usd_per_mtok": energy.energy_usd_per_mtok,
        "gpu_usd_per_mtok": energy.gpu_usd_per_mtok if energy.usd_per_gpu_hour else None,
        "total_usd_per_mtok": energy.total_usd_per_mtok if energy.usd_per_gpu_hour else None,
    }


def _kinds_text(step: StepEnergy) -> str:
    busy = {k: v for k, v in step.seconds_by_kind.items() if v > 0}
    total = sum(busy.values())
    return ", ".join(f"{kind} {100 * seconds / total:.0f}%" for kind, seconds in busy.items()) if total else "-"


def _cost_text(energy: RunEnergy) -> str:
    price = energy.electricity
    pue = f"PUE {price.pue:g}" + (" (GPU boards only)" if price.pue == 1 else "")
    text = (f"  cost per million output tokens: energy ${energy.energy_usd_per_mtok:,.4f} at "
            f"${price.usd_per_kwh:g}/kWh x {pue}")
    if energy.usd_per_gpu_hour:
        text += (f" + GPU-hours ${energy.gpu_usd_per_mtok:,.3f} at ${energy.usd_per_gpu_hour:g}/GPU-hour = "
                 f"${energy.total_usd_per_mtok:,.3f}")
    return text


def energy_text(result: SimulationResult) -> list[str]:
    """The ENERGY section of the text report."""
    energy = run_energy(result)
    if isinstance(energy, EnergyUnavailable):
        return [f"ENERGY  {energy.reason}"]
    return [
        f"ENERGY   {energy.joules_per_output_token:,.3f} J per output token, {energy.joules_per_request:,.1f} J per "
        f"request (ISL {energy.isl}, OSL {energy.osl}); mean {energy.watts_per_gpu:,.0f} W per GPU",
        f"  prefill: {energy.joules_per_prompt_token:,.4f} J per prompt token; {energy.prefill.watts:,.0f} W per GPU "
        f"over the step ({_kinds_text(energy.prefill)} of its kernel time)"
        + (" (held at the board power)" if energy.prefill.capped else ""),
        f"  decode:  {energy.joules_per_decode_token:,.4f} J per output token; {energy.decode.watts:,.0f} W per GPU "
        f"over the step ({_kinds_text(energy.decode)} of its kernel time)"
        + (" (held at the board power)" if energy.decode.capped else ""),
        _cost_text(energy),
    ]
