"""Partial weight offload in the stage engine (`deployment.weight_offload: auto`).

Weights that do not fit in HBM beside the engine's reserve and the KV cache the workload needs stay
in host memory and are copied to the GPU every forward pass over the host link (PCIe; NVLink-C2C to
Grace on a GB200), one layer ahead of compute: while layer i computes, layer i+1's offloaded
weights arrive in a second buffer (SGLang's and vLLM's layer-wise CPU offload prefetch this way).

Which weights (so that each layer's transfer is defined): an equal share of every MoE layer's
routed-expert weights for an MoE model (most of its bytes, and each expert is its own tensor that
an offloader can leave on the host), an equal share of every layer's linear weights for a dense
model. Embeddings, the LM head and norms stay in HBM: they are small and read by every step.

The step's time reuses the ZeRO-Inference prefetch schedule of the `generate` subcommand
(infersim.costing.host_transfer.prefetch_schedule): a layer costs the larger of its compute and its
transfer, plus the first offloaded layer's transfer, which nothing before it hides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infersim.cards.hardware import HardwareCard

ROUTED_EXPERTS = "routed-expert weights"
LAYER_WEIGHTS = "layer weights"


def host_link_bytes_per_s(hw: HardwareCard) -> float:
    """Achievable host-to-device rate of the card's host link: pcie_bandwidth x pcie_efficiency."""
    return hw.peak.pcie_bandwidth * hw.derates.pcie_efficiency


@dataclass(frozen=True)
class WeightOffload:
    """Weights one GPU keeps in host memory and streams to HBM every forward pass."""

    bytes_per_gpu: float  # offloaded weight bytes per GPU
    pool: str  # which weights are offloaded: ROUTED_EXPERTS or LAYER_WEIGHTS
    pool_bytes_per_gpu: float  # all weights of that kind on one GPU: the most that can be offloaded
    # offloaded bytes of one layer, per layer kind in model.layer_composition order (the order of
    # a StagePlan's groups); 0 for kinds holding none of the pool (dense layers of an MoE model)
    bytes_per_layer: tuple[float, ...]
    link_bytes_per_s: float  # achievable host-to-device rate: pcie_bandwidth x pcie_efficiency
    host_memory_bytes: float  # host memory per GPU the hardware card offers for offload
    shortfall_bytes: float  # weights per GPU that had to leave HBM (more than bytes_per_gpu when the pool is too small)

    @property
    def fraction(self) -> float:
        """Share of the pool kept in host memory."""
        return self.bytes_per_gpu / self.pool_bytes_per_gpu if self.pool_bytes_per_gpu else 0.0

    @property
    def fits_pool(self) -> bool:
        """False when even the whole pool in host memory does not free enough HBM."""
        return self.shortfall_bytes <= self.pool_bytes_per_gpu

    @property
    def fits_host(self) -> bool:
        return self.bytes_per_gpu <= self.host_memory_bytes


@dataclass(frozen=True)
class OffloadCost:
    """What streaming the offloaded weights adds to one forward pass."""

    exposed_s: float  # seconds the pass takes beyond its compute (transfers compute could not hide)
    transfer_s: float  # seconds the host link is busy in the pass
    bytes: float  # bytes copied to the GPU in the pass
    layers: int  # layers with offloaded weights


def offload_cost(layers: Sequence[tuple[float, float, int]], link_bytes_per_s: float) -> OffloadCost:
    """The cost of one pass over layer groups given as (compute seconds of one layer, offloaded
    bytes of one layer, number of layers), in execution order. Layers whose weights are all
    resident still take part: their compute hides the next offloaded layer's prefetch."""
    # here: only a run that offloads weights prices transfers (the engine imports this module)
    from infersim.costing.host_transfer import PassUnit, prefetch_schedule, transfer_seconds

    units = [PassUnit(f"layer {i}", compute_s, transfer_seconds(moved, 0.0, link_bytes_per_s), weight_bytes=moved)
             for i, (compute_s, moved, count) in enumerate(layers) for _ in range(count)]
    compute = sum(u.compute_s for u in units)
    return OffloadCost(max(prefetch_schedule(units) - compute, 0.0), sum(u.h2d_s for u in units),
                       sum(u.weight_bytes for u in units), sum(1 for u in units if u.weight_bytes > 0))
