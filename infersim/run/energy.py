"""The energy of a run (docs/energy.md): J per token and per request, mean W per GPU, and what it
costs beside the GPU-hours.

A request's energy is its prompt's share of prefill steps plus its output tokens' share of decode
steps, at the simulated prefill step and decode batch: isl prompt tokens at the prefill step's J
per prompt token, and osl - 1 output tokens at the decode step's J per output token (the first
token comes out of the prefill). Energies are over all GPUs: a step of E joules per GPU on G GPUs
that yields N tokens per GPU costs E / N per token. Mean W per GPU is the request's energy over the
GPU-seconds it takes. Cost per million output tokens: the GPU-hours at the card's price, and the
energy at the run's electricity price times its PUE.

A hardware card without power facts gives `EnergyUnavailable` with the reason, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from infersim.cards.power import Electricity
from infersim.engine.energy import StepEnergy, stage_energy
from infersim.engine.stage import StageResult
from infersim.run.simulate import SimulationResult


@dataclass(frozen=True)
class EnergyUnavailable:
    """Why a run has no energy figures."""

    reason: str


def unavailable_reason(hardware_name: str) -> str:
    return (f"not available: hardware card {hardware_name} has no power facts (its `power` section: board, idle, "
            "compute_bound, memory_bound, communication_bound watts; docs/energy.md)")


@dataclass(frozen=True)
class RunEnergy:
    """Energy figures of a simulated run (SI: joules, seconds, watts, US dollars)."""

    prefill: StepEnergy  # one prefill step (a chunked prompt's steps together) on one GPU
    decode: StepEnergy  # one decode step on one GPU
    joules_per_prompt_token: float
    joules_per_decode_token: float  # the decode step's energy per output token it yields
    joules_per_request: float
    gpu_seconds_per_request: float
    isl: int
    osl: int
    usd_per_gpu_hour: float
    electricity: Electricity

    @property
    def joules_per_output_token(self) -> float:
        """A request's energy per output token, its prompt's prefill included."""
        return self.joules_per_request / self.osl

    @property
    def watts_per_gpu(self) -> float:
        """Mean draw per GPU over the steps a request takes (prefill and decode in their shares)."""
        return self.joules_per_request / self.gpu_seconds_per_request if self.gpu_seconds_per_request > 0 else 0.0

    @property
    def energy_usd_per_mtok(self) -> float:
        """Energy cost per million output tokens, at the electricity price and PUE."""
        return self.electricity.usd(self.joules_per_output_token) * 1e6

    @property
    def gpu_usd_per_mtok(self) -> float:
        """GPU-hours per million output tokens at the card's price (0: the card has no price)."""
        return self.gpu_seconds_per_request / self.osl * 1e6 / 3600 * self.usd_per_gpu_hour

    @property
    def total_usd_per_mtok(self) -> float:
        return self.gpu_usd_per_mtok + self.energy_usd_per_mtok


def _per_token(stage: StageResult, step: StepEnergy) -> tuple[float, float]:
    """(joules, GPU-seconds) per token a step yields: prompt tokens (prefill), output tokens (decode)."""
    tokens = stage.tokens_per_gpu * stage.tokens_per_step
    return step.joules / tokens, stage.step_time_s / tokens


def run_energy(result: SimulationResult) -> RunEnergy | EnergyUnavailable:
    """The energy figures of a run, or why there are none."""
    cfg = result.config
    power = cfg.hardware.power
    if power is None:
        return EnergyUnavailable(unavailable_reason(cfg.hardware.name))
    prefill, decode = stage_energy(result.prefill, power), stage_energy(result.decode, power)
    prompt_j, prompt_s = _per_token(result.prefill, prefill)
    output_j, output_s = _per_token(result.decode, decode)
    isl, osl = cfg.workload.isl, cfg.workload.osl
    return RunEnergy(prefill, decode, prompt_j, output_j, isl * prompt_j + (osl - 1) * output_j,
                     isl * prompt_s + (osl - 1) * output_s, isl, osl, cfg.hardware.usd_per_gpu_hour, cfg.electricity)
