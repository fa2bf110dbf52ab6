"""Power facts of a GPU (the hardware card's `power` section) and the price of electricity (the run
config's `energy` section): what a step's energy is made from (docs/energy.md).

All values SI: watts (J/s) per GPU, US dollars per kWh (1 kWh = 3.6e6 J).

A GPU draws a different power depending on what bounds the kernel it runs: tensor-core bound
kernels (prefill GEMMs, attention) hold the board at its power limit, HBM-bound kernels (decode
GEMMs streaming weights, decode attention streaming the KV cache) leave the tensor cores mostly
waiting, collectives keep the links and a few SMs busy, and between kernels (host overhead,
pipeline bubbles, a GPU waiting for requests) the GPU still draws its idle power: clocks up,
memory allocated, a serving engine attached. The card states each of them with its source.

The section is optional: a card without it (a user's own GPU whose power is not published) gets no
energy figures, and every report says "not available" and why; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from infersim.base.errors import ConfigError
from infersim.cards.schema import spec

#: joules in one kilowatt-hour
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, kw_only=True)
class Power:
    """What one GPU draws, watts, by what bounds the work it does (hardware card `power`)."""

    board: float = spec(doc="maximum board power (TDP, or AMD's TBP), W: the limit the GPU's power management holds",
                        gt=0)
    idle: float = spec(doc="draw with a serving engine loaded and no kernel running (highest performance state, "
                           "memory allocated), W: host overhead, pipeline bubbles, a GPU waiting for requests", gt=0)
    compute_bound: float = spec(doc="draw while tensor-core bound kernels run (prefill GEMMs, attention), W", gt=0)
    memory_bound: float = spec(doc="draw while HBM-bound kernels run (decode GEMMs streaming weights, decode "
                                   "attention streaming the KV cache, norms), W", gt=0)
    communication_bound: float = spec(doc="draw while collectives and expert all-to-all run (links busy, a few SMs "
                                          "copying), W", gt=0)


def validate_power(power: Power | None, source: str) -> None:
    """Every draw lies between idle and the board power."""
    if power is None:
        return
    if power.idle >= power.board:
        raise ConfigError(source, "power.idle", power.idle, f"must be below the board power ({power.board:g} W)")
    for name in ("compute_bound", "memory_bound", "communication_bound"):
        value = getattr(power, name)
        if not power.idle <= value <= power.board:
            raise ConfigError(source, f"power.{name}", value,
                              f"must lie between the idle draw ({power.idle:g} W) and the board power "
                              f"({power.board:g} W)")


#: the default electricity price, US dollars per kWh: US EIA, Electric Power Annual 2023 (released
#: 2024-10-17), average revenue per kWh sold to industrial customers, U.S. total 8.04 cents
DEFAULT_USD_PER_KWH = 0.0804


@dataclass(frozen=True, kw_only=True)
class Electricity:
    """What energy costs (run config `energy`; flags --usd-per-kwh, --pue)."""

    usd_per_kwh: float = spec(
        DEFAULT_USD_PER_KWH,
        doc="electricity price, US dollars per kWh (default 0.0804: US EIA Electric Power Annual 2023, average "
            "price to industrial customers, 8.04 cents/kWh)", ge=0)
    pue: float = spec(
        1.0, doc="power usage effectiveness: facility energy / IT energy, multiplies the GPUs' energy in the cost "
                 "(default 1.0: the GPU boards' energy only; Uptime Institute's 2024 survey average is 1.56)",
        ge=1, le=5)

    def usd(self, joules: float) -> float:
        """The price of `joules` of GPU energy at this price and PUE."""
        return joules * self.pue / JOULES_PER_KWH * self.usd_per_kwh
