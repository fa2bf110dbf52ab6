"""Hardware cards: datasheet peaks, kept apart from named, sourced derates.

All values SI: FLOP/s, bytes, bytes/s, seconds. Bandwidths are per GPU, per direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infersim.cards.schema import spec
from infersim.errors import ConfigError, MISSING


@dataclass(frozen=True, kw_only=True)
class Peaks:
    """What the datasheet promises."""

    flops: dict[str, float] = spec(doc="dense tensor-core FLOP/s by input format (bf16, fp16, fp8, int8, fp4)", gt=0)
    hbm_bytes: float = spec(doc="HBM capacity, bytes", gt=0)
    hbm_bandwidth: float = spec(doc="HBM bandwidth, bytes/s", gt=0)
    nvlink_bandwidth: float = spec(doc="scale-up (NVLink) bandwidth per GPU per direction, bytes/s", ge=0)
    network_bandwidth: float = spec(doc="scale-out (RDMA NIC) bandwidth per GPU per direction, bytes/s", ge=0)
    pcie_bandwidth: float = spec(doc="host link bandwidth per GPU per direction, bytes/s", gt=0)
    sm_count: int = spec(doc="streaming multiprocessors", gt=0)
    l2_bytes: float = spec(doc="L2 cache, bytes", gt=0)
    gpus_per_node: int = spec(doc="GPUs sharing one NVLink domain", gt=0)


@dataclass(frozen=True, kw_only=True)
class CollectiveLatency:
    """NCCL-style latency model: base latency per collective plus per-hop latency, by protocol."""

    base: float = spec(doc="NCCL baseLat for the protocol, seconds", ge=0)
    nvlink_hop: float = spec(doc="NCCL hwLat per intra-node step (NVLink), seconds", ge=0)
    network_hop: float = spec(doc="NCCL hwLat per inter-node step (NET), seconds", ge=0)
    bandwidth_efficiency: float = spec(doc="fraction of link bandwidth the protocol reaches", gt=0, le=1)
    # Default only so that inline test cards stay short; every bundled card sets it for LL with its source.
    nvlink_hop_factor_across_nodes: float = spec(
        1.0, doc="multiplier on the intra-node (NVLink) step latency, Tree's and Ring's, when the collective spans "
                 "nodes (NCCL tuning.cc v2.7.3-v2.17.1: LL x 1.8)", ge=1)


@dataclass(frozen=True, kw_only=True)
class Derates:
    """What real software reaches on this chip, each with its source in the card's comments."""

    compute_efficiency: dict[str, float] = spec(doc="achievable fraction of peak FLOP/s for large GEMMs, by format", gt=0, le=1)
    attention_compute_efficiency: float = spec(doc="achievable fraction of bf16 peak for attention kernels", gt=0, le=1)
    memory_efficiency: float = spec(doc="achievable fraction of HBM bandwidth for streaming kernels", gt=0, le=1)
    elementwise_memory_efficiency: float = spec(
        doc="achievable fraction of HBM bandwidth for norm / rotary / activation / quant-cast kernels", gt=0, le=1)
    nvlink_efficiency: float = spec(doc="achievable fraction of NVLink bandwidth in collectives", gt=0, le=1)
    network_efficiency: float = spec(doc="achievable fraction of NIC bandwidth in collectives", gt=0, le=1)
    gemm_tile_m: int = spec(doc="rows per tensor-core tile: each GEMM/expert's M is padded to a multiple of it", gt=0)
    kernel_launch_overhead: float = spec(doc="fixed time per kernel launch (gaps between kernels), seconds", ge=0)
    collective_latency: dict[str, CollectiveLatency] = spec(doc="NCCL protocols LL, LL128, Simple: latency model")
    deepep_normal_latency: float = spec(doc="fixed latency of one DeepEP normal-mode dispatch or combine, seconds", ge=0)
    deepep_low_latency_latency: float = spec(doc="fixed latency of one DeepEP low-latency dispatch or combine, seconds", ge=0)
    deepep_normal_sms: int = spec(doc="SMs DeepEP normal mode occupies while it runs (taken from overlapped compute)", ge=0)
    # Default only so that inline test cards stay short; every bundled card sets it with its source.
    deepep_copy_rate_per_sm: float = spec(
        6.0e9, doc="bytes/s one SM held by DeepEP normal mode moves through a GPU's receive side (forwarding "
                   "RDMA arrivals over NVLink, copying them out): the kernel's rate limit is this x its SMs", gt=0)
    # Default only so that inline test cards stay short; every bundled card sets it with its source.
    pcie_efficiency: float = spec(
        0.8, doc="achievable fraction of pcie_bandwidth for pinned host-to-device copies while streaming weights/KV "
                 "(offloaded inference)", gt=0, le=1)


@dataclass(frozen=True, kw_only=True)
class HardwareCard:
    """One GPU type and its interconnects: datasheet peaks and achievable fractions (hardware/*.yaml)."""

    name: str = spec(doc="short name, as used in run configs")
    aliases: tuple[str, ...] = spec(
        default_factory=tuple, doc="other names the card answers to (e.g. h100 for h100-sxm), matched ignoring case "
                                   "and punctuation")
    peak: Peaks = spec(doc="datasheet peaks")
    derates: Derates = spec(doc="achievable fractions and overheads")
    description: str = spec("", doc="the exact product")
    usd_per_gpu_hour: float = spec(0.0, doc="rental price per GPU-hour, US dollars (0 = unknown)", ge=0)
    host_memory_bytes: float = spec(0.0, doc="CPU memory per GPU available for offload, bytes", ge=0)
    nvme_bandwidth: float = spec(0.0, doc="NVMe read bandwidth per GPU, bytes/s (0 = none)", ge=0)
    vendor: Literal["nvidia", "amd"] = spec(
        "nvidia", doc="who makes the GPU: engine cards list the vendors they run on (EngineCard.vendors)")
    compute_capability: float | None = spec(
        None, doc="CUDA compute capability (8.0 A100, 9.0 Hopper, 10.0 Blackwell): NCCL's protocol bandwidth caps "
                  "across nodes are tabled by it (null = unknown: cross-node NCCL collectives are refused)", gt=0)

    def peak_flops(self, dtype: str, source: str = "") -> float:
        """Dense FLOP/s for a tensor-core input format; int4/fp4 weight-only formats run at the
        activation format's rate, so callers pass the compute format."""
        try:
            return self.peak.flops[dtype]
        except KeyError:
            have = ", ".join(sorted(self.peak.flops))
            raise ConfigError(source or f"hardware card {self.name}", "peak.flops", dtype,
                              f"this GPU has no {dtype} tensor-core rate (it has: {have})") from None

    def compute_efficiency(self, dtype: str) -> float:
        eff = self.derates.compute_efficiency
        found = eff.get(dtype)  # asked for every GEMM priced: the fallbacks only when it is missing
        if found is None:
            found = eff["bf16"] if "bf16" in eff else min(eff.values())
        return found


REQUIRED_PROTOCOLS = ("LL", "LL128", "Simple")


def validate_hardware(card: HardwareCard, source: str) -> HardwareCard:
    if "bf16" not in card.peak.flops:
        raise ConfigError(source, "peak.flops.bf16", MISSING, "every card needs a bf16 rate")
    missing = [p for p in REQUIRED_PROTOCOLS if p not in card.derates.collective_latency]
    if missing:
        raise ConfigError(source, f"derates.collective_latency.{missing[0]}", MISSING,
                          f"needs protocols {', '.join(REQUIRED_PROTOCOLS)}")
    if card.derates.deepep_normal_sms >= card.peak.sm_count:
        raise ConfigError(source, "derates.deepep_normal_sms", card.derates.deepep_normal_sms,
                          f"must be fewer than the {card.peak.sm_count} SMs of the GPU")
    return card

