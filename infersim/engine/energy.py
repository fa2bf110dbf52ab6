"""A step's energy on one GPU: each operation's time at the draw of what bounds it (docs/energy.md).

The model. Each operation of a step runs at the hardware card's draw for its bound (`Power`):
compute-bound at `compute_bound`, memory-bound at `memory_bound`, communication at
`communication_bound`; time bound by launch overhead, the serving engine's exposed host work and
weights waiting on the host link is the GPU waiting, at `idle`. Written as idle power for the whole
step plus each operation's draw above idle,

    E = P_idle x T_step + sum over operations of t_op x (P_bound(op) - P_idle),

which is sum(t_op x P_bound(op)) when operations run one after another (T_step = sum t_op). Under
two-batch overlap one micro-batch's communication runs beside the other's compute: both add their
draw above idle during the overlap, and the step is shorter than the operations' sum by the
overlap saved. The GPU's power management holds the mean at the board power: E <= P_board x T_step
(`capped` says when it binds). Every GPU of a deployment runs the same step (the stage engine
prices one GPU; a rank that finishes early waits at idle draw, which the busiest rank's step time
already counts), so a step's energy over all GPUs is this times the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from infersim.cards.power import Power
from infersim.engine.stage import StageResult
from infersim.shapes.kernels import Bound

#: the kind of draw each bound runs at; launch overhead, host work and the host link are waiting
KIND_OF_BOUND = {Bound.COMPUTE: "compute", Bound.MEMORY: "memory", Bound.COMM: "communication",
                 Bound.OVERHEAD: "idle", Bound.HOST_LINK: "idle"}
KINDS = ("compute", "memory", "communication", "idle")
#: the power card's field holding the draw of each kind of work
DRAW_FIELD = {"compute": "compute_bound", "memory": "memory_bound", "communication": "communication_bound",
              "idle": "idle"}


def draw(power: Power, kind: str) -> float:
    """Watts one GPU draws while doing `kind` of work."""
    return getattr(power, DRAW_FIELD[kind])


@dataclass(frozen=True)
class StepEnergy:
    """One step on one GPU: joules, the step's seconds, seconds per kind of work, and whether the
    board power limit bounded the mean draw."""

    joules: float
    seconds: float
    seconds_by_kind: dict[str, float]
    capped: bool = False

    @property
    def watts(self) -> float:
        """Mean draw of the GPU over the step."""
        return self.joules / self.seconds if self.seconds > 0 else 0.0


def step_joules(seconds_by_kind: dict[str, float], step_s: float, power: Power) -> tuple[float, bool]:
    """(joules of a step of `step_s` seconds whose operations spent `seconds_by_kind`, held at the
    board power limit; whether that limit binds): step_energy's number without its record (what a
    sweep row keeps)."""
    return _held_joules([seconds_by_kind.get(kind, 0.0) for kind in KINDS], step_s, power)


def _held_joules(by_kind: list[float], step_s: float, power: Power) -> tuple[float, bool]:
    """step_joules of seconds by kind of draw in KINDS order. Each kind's draw above idle, added in
    that order (the idle kind's zero among them) and not by sum(), whose rounding differs between
    Python versions: every path to a step's joules gives the same number to the last bit."""
    idle = power.idle
    above = (by_kind[0] * (power.compute_bound - idle) + by_kind[1] * (power.memory_bound - idle)
             + by_kind[2] * (power.communication_bound - idle) + by_kind[3] * (idle - idle))
    joules = idle * step_s + above
    limit = power.board * step_s
    return min(joules, limit), joules > limit * (1 + 1e-12)


def step_energy(seconds_by_kind: dict[str, float], step_s: float, power: Power) -> StepEnergy:
    """The energy of a step of `step_s` seconds whose operations spent `seconds_by_kind` (their sum
    may exceed the step under overlap; a step longer than the sum waits at idle draw)."""
    joules, capped = step_joules(seconds_by_kind, step_s, power)
    return StepEnergy(joules, step_s, dict(seconds_by_kind), capped)


def seconds_by_kind(stage: StageResult) -> dict[str, float]:
    """Seconds of a stage's operations by kind of draw (all layers and micro-batches)."""
    out = dict.fromkeys(KINDS, 0.0)
    for op in stage.operations:
        out[KIND_OF_BOUND[op.bound]] += op.time_s
    return out


#: the place of each bound's kind of draw in KINDS
_KIND_PLACE = {bound: KINDS.index(kind) for bound, kind in KIND_OF_BOUND.items()}


def step_joules_by_bound(by_bound: dict[Bound, float], step_s: float, power: Power) -> tuple[float, bool]:
    """step_joules of `by_bound`'s seconds as seconds by kind of draw, without a dict of kinds
    between them (a sweep row and a serving step ask for it every time)."""
    by_kind = [0.0, 0.0, 0.0, 0.0]
    place = _KIND_PLACE
    for bound, seconds in by_bound.items():
        by_kind[place[bound]] += seconds
    return _held_joules(by_kind, step_s, power)


def stage_energy(stage: StageResult, power: Power) -> StepEnergy:
    """One step of a stage on one GPU (a chunked prompt's steps together)."""
    return step_energy(seconds_by_kind(stage), stage.step_time_s, power)
