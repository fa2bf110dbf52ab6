"""The energy of a serving run (docs/energy.md): every GPU of every pool over the benchmark's
duration, busy steps at their priced energy and the rest at idle draw.

Each step an instance runs costs every GPU of the instance the step's energy on one GPU
(infersim.engine.energy; bucketed like its time, infersim.serve.cost). Between steps, a GPU that
waits for requests (under a light offered load, or after its last request) draws its idle power,
and so does every GPU of an instance no request ever reaches. The window is the benchmark's
duration, from t = 0 to the last completion (vllm bench serve's). Not counted: the KV-cache transfer
between PD pools (its links' energy), and the host.
"""

from __future__ import annotations

from typing import Any

from infersim.run.energy import unavailable_reason
from infersim.serve.simulate import Pool, ServeResult


def _pool_energy(pool: Pool, duration: float) -> dict[str, Any]:
    """Busy and idle joules of a pool over `duration` seconds (all its GPUs)."""
    power = pool.config.hardware.power
    assert power is not None  # serving_energy checks every pool first
    per_instance = pool.config.deployment.num_gpus
    busy_s = sum(i.stats.busy_s for i in pool.instances)
    busy_j = sum(i.stats.busy_joules for i in pool.instances) * per_instance
    gpu_seconds = duration * pool.count * per_instance
    idle_s = gpu_seconds - busy_s * per_instance
    idle_j = max(idle_s, 0.0) * power.idle
    return {"role": pool.name, "gpus": pool.gpus, "busy_joules": busy_j, "idle_joules": idle_j,
            "joules": busy_j + idle_j, "busy_fraction": busy_s * per_instance / gpu_seconds if gpu_seconds else 0.0,
            "watts_per_gpu": (busy_j + idle_j) / gpu_seconds if gpu_seconds else 0.0, "idle_watts": power.idle}


def serving_energy(result: ServeResult, duration: float) -> dict[str, Any]:
    """The `energy` key of a serving summary: totals, per output token and request, mean W per GPU,
    utilisation and idle share, cost, per pool; or {"available": false, "reason": ...}."""
    missing = next((p.config.hardware.name for p in result.pools if p.config.hardware.power is None), None)
    if missing is not None:
        return {"available": False, "reason": unavailable_reason(missing)}
    pools = [_pool_energy(pool, duration) for pool in result.pools]
    total = sum(p["joules"] for p in pools)
    busy = sum(p["busy_joules"] for p in pools)
    gpus = sum(p["gpus"] for p in pools)
    # the energy is drawn over the whole simulated time: per token and request of every request it
    # served, those of stages' lead-ins and tails included
    done = result.outcomes.served()
    price = result.pools[0].config.electricity
    out_tokens = done.output_tokens
    completed = done.completed
    gpu_hours = duration * gpus / 3600
    prices = [p.config.hardware.usd_per_gpu_hour for p in result.pools]
    gpu_usd = sum(duration * p.gpus / 3600 * p.config.hardware.usd_per_gpu_hour for p in result.pools)
    energy_usd = price.usd(total)
    return {
        "available": True,
        "joules": total,
        "busy_joules": busy,
        "idle_joules": total - busy,
        "idle_share": (total - busy) / total if total else 0.0,
        "joules_per_output_token": total / out_tokens if out_tokens else None,
        "joules_per_request": total / completed if completed else None,
        "watts_per_gpu": total / (duration * gpus) if duration and gpus else 0.0,
        "gpu_hours": gpu_hours,
        "usd_per_kwh": price.usd_per_kwh,
        "pue": price.pue,
        "energy_usd_per_mtok": energy_usd / out_tokens * 1e6 if out_tokens else None,
        "gpu_usd_per_mtok": gpu_usd / out_tokens * 1e6 if out_tokens and all(prices) else None,
        "total_usd_per_mtok": (gpu_usd + energy_usd) / out_tokens * 1e6 if out_tokens and all(prices) else None,
        "pools": pools,
    }


def energy_text(s: dict[str, Any]) -> list[str]:
    """The ENERGY lines of a serving report."""
    energy = s.get("energy")
    if not energy:
        return []
    if not energy["available"]:
        return [f"ENERGY  {energy['reason']}"]
    per_token = energy["joules_per_output_token"]
    lines = [f"ENERGY  {energy['joules'] / 1e3:,.2f} kJ over {s['duration']:,.2f} s on {s['num_gpus']} GPU(s): "
             f"{per_token:,.3f} J per output token, {energy['joules_per_request']:,.1f} J per request; mean "
             f"{energy['watts_per_gpu']:,.0f} W per GPU" if per_token is not None else
             f"ENERGY  {energy['joules'] / 1e3:,.2f} kJ; no output tokens"]
    for pool in energy["pools"]:
        lines.append(f"  {pool['role']}: GPUs busy {pool['busy_fraction']:.1%} of the time; "
                     f"{pool['idle_joules'] / max(pool['joules'], 1e-30):.1%} of the energy drawn waiting "
                     f"(idle {pool['idle_watts']:g} W per GPU); mean {pool['watts_per_gpu']:,.0f} W per GPU")
    if energy["energy_usd_per_mtok"] is not None:
        text = (f"  cost per million output tokens: energy ${energy['energy_usd_per_mtok']:,.4f} at "
                f"${energy['usd_per_kwh']:g}/kWh x PUE {energy['pue']:g}")
        if energy["total_usd_per_mtok"] is not None:
            text += f" + GPU-hours ${energy['gpu_usd_per_mtok']:,.3f} = ${energy['total_usd_per_mtok']:,.3f}"
        lines.append(text)
    return lines
