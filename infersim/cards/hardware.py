"""Hardware cards: datasheet peaks, kept apart from named, sourced derates.

All values SI: FLOP/s, bytes, bytes/s, seconds. Bandwidths are per GPU, per direction.

The GPUs of a node talk over the card's scale-up links (NVLink, or AMD's Infinity Fabric: the
`nvlink_*` fields hold either) within `peak.nvlink_domain`, and over PCIe otherwise: a card without
scale-up links declares `peak.nvlink_bandwidth: 0`, and states what NCCL reaches over its node's
PCIe hierarchy in `derates.pcie_collective` and the PCI step latencies in
`derates.collective_latency.*.pcie_hop` (docs/adding-a-gpu.md).
"""

from __future__ import annotations

from itertools import pairwise
from dataclasses import dataclass
from typing import Literal

from infersim.cards.power import Power, validate_power
from infersim.cards.schema import spec
from infersim.base.errors import ConfigError, MISSING

#: GPU makers a card may name: the vendor decides the collective library (NCCL or RCCL) and the
#: software stack the engines run on it
VENDORS = ("nvidia", "amd")


@dataclass(frozen=True, kw_only=True)
class Peaks:
    """What the datasheet promises."""

    flops: dict[str, float] = spec(
        doc="dense tensor-core FLOP/s by input format (bf16, fp16, fp8, int8, fp6, fp4); a format the chip lacks "
            "has no key", gt=0)
    hbm_bytes: float = spec(doc="HBM capacity, bytes", gt=0)
    hbm_bandwidth: float = spec(doc="HBM bandwidth, bytes/s", gt=0)
    nvlink_bandwidth: float = spec(
        doc="scale-up (NVLink, or AMD Infinity Fabric) bandwidth per GPU per direction, all its links together, "
            "bytes/s; 0 = none: the GPUs of a node talk over PCIe", ge=0)
    network_bandwidth: float = spec(doc="scale-out (RDMA NIC) bandwidth per GPU per direction, bytes/s", ge=0)
    pcie_bandwidth: float = spec(doc="host link bandwidth per GPU per direction, bytes/s", gt=0)
    sm_count: int = spec(doc="streaming multiprocessors", gt=0)
    l2_bytes: float = spec(doc="L2 cache, bytes", gt=0)
    gpus_per_node: int = spec(
        doc="GPUs in one node (server): they talk over NVLink within nvlink_domain, over PCIe beyond it, and "
            "over the NIC across nodes", gt=0)
    nvlink_domain: int = spec(
        0, doc="GPUs one NVLink (Infinity Fabric) domain joins: 0 = every GPU of the node (NVSwitch, a full mesh); "
               "2 = bridged pairs (H100 NVL, RTX A6000): larger groups talk over PCIe. Ignored without NVLink", ge=0)
    nvlink_topology: Literal["switch", "mesh"] = spec(
        "switch", doc="switch: any group of the domain gets the full nvlink_bandwidth (NVSwitch, or a bridged pair); "
                      "mesh: one direct link to each other GPU of the domain, nvlink_bandwidth split evenly over them "
                      "(AMD Infinity Fabric on 8-GPU MI300X/MI325X/MI355X platforms), so a group of k GPUs of a "
                      "domain of D reaches (k-1)/(D-1) of it")


@dataclass(frozen=True, kw_only=True)
class CollectiveLatency:
    """NCCL-style latency model: base latency per collective plus per-hop latency, by protocol
    (RCCL's values on AMD cards: the same model, its own constants)."""

    base: float = spec(doc="NCCL baseLat for the protocol, seconds", ge=0)
    nvlink_hop: float = spec(doc="NCCL hwLat per intra-node step over NVLink (RCCL: Infinity Fabric), seconds", ge=0)
    network_hop: float = spec(doc="NCCL hwLat per inter-node step (NET), seconds", ge=0)
    bandwidth_efficiency: float = spec(doc="fraction of link bandwidth the protocol reaches", gt=0, le=1)
    # Default only so that inline test cards stay short; every bundled card sets it for LL with its source.
    nvlink_hop_factor_across_nodes: float = spec(
        1.0, doc="multiplier on the intra-node (NVLink) step latency, Tree's and Ring's, when the collective spans "
                 "nodes (NCCL tuning.cc v2.7.3-v2.17.1: LL x 1.8)", ge=1)
    # Optional: only cards whose GPUs may talk over PCIe need it (a run that does and lacks it says so).
    pcie_hop: float | None = spec(
        None, doc="NCCL hwLat per intra-node step over PCIe (PCI), seconds (null = unknown: collectives over "
                  "PCIe are refused)", ge=0)
    enabled: bool = spec(
        True, doc="false: the collective library never runs this protocol on this GPU (RCCL enables LL128 only "
                  "where its platform model says so)")


@dataclass(frozen=True, kw_only=True)
class PcieTier:
    """What NCCL reaches among the GPUs of one level of a node's PCIe hierarchy (behind one PCIe
    switch, on one CPU socket, the whole node across sockets)."""

    gpus: int = spec(doc="GPUs in this tier (a group is placed on as few tiers as possible)", gt=1)
    efficiency: float = spec(
        doc="achievable fraction of pcie_bandwidth per GPU per direction for collectives among them "
            "(nccl-tests all_reduce_perf busbw at large sizes / pcie_bandwidth)", gt=0, le=1)


@dataclass(frozen=True, kw_only=True)
class KernelTimeScale:
    """Measured kernel time on this cluster over what the kernel tables (or the roofline) give, per
    kernel family: 1 = the tables as they are. A calibration profile (infersim.cards.calibration)
    sets these from a user's own runs; a bundled card leaves them at 1."""

    gemm: float = spec(1.0, doc="time multiplier of dense and grouped (MoE) GEMMs and the DSA indexer", ge=0.1, le=10)
    attention: float = spec(1.0, doc="time multiplier of attention kernels (softmax, linear attention / SSM phases)",
                            ge=0.1, le=10)
    memory: float = spec(1.0, doc="time multiplier of memory-bound elementwise kernels (norms, rotary, activations, "
                                  "casts)", ge=0.1, le=10)
    collectives: float = spec(1.0, doc="time multiplier of collectives and token exchanges (NCCL, DeepEP)",
                              ge=0.1, le=10)


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
    kernel_launch_overhead: float = spec(
        doc="fixed time per kernel launch (gaps between kernels), seconds; for elementwise kernels a kernel-table "
            "set's own rule replaces it where it brings one (aiconfigurator's 3 us)", ge=0)
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
    kernel_time_scale: KernelTimeScale = spec(
        default_factory=KernelTimeScale,
        doc="measured over predicted kernel time per kernel family on a user's cluster (set by a calibration "
            "profile; 1 = the kernel tables and roofline as they are)")
    # Optional: only cards whose GPUs may talk over PCIe need it (a run that does and lacks it says so).
    pcie_collective: tuple[PcieTier, ...] = spec(
        default_factory=tuple,
        doc="GPU-to-GPU collectives over PCIe (no NVLink, or groups larger than nvlink_domain): the node's PCIe "
            "hierarchy, smallest group first; a group of k GPUs reaches the efficiency of the first tier of at "
            "least k GPUs (empty = unknown: collectives over PCIe are refused)")


@dataclass(frozen=True, kw_only=True)
class HardwareCard:
    """One GPU type and its interconnects: datasheet peaks and achievable fractions (hardware/*.yaml)."""

    name: str = spec(doc="short name, as used in run configs")
    vendor: str = spec(doc="GPU maker: nvidia or amd (decides the collective library, NCCL or RCCL, and the engines' "
                           "software stack: engine cards list the vendors they run on, EngineCard.vendors)")
    aliases: tuple[str, ...] = spec(
        default_factory=tuple, doc="other names the card answers to (e.g. h100 for h100-sxm), matched ignoring case "
                                   "and punctuation")
    peak: Peaks = spec(doc="datasheet peaks")
    derates: Derates = spec(doc="achievable fractions and overheads")
    description: str = spec("", doc="the exact product")
    usd_per_gpu_hour: float = spec(0.0, doc="rental price per GPU-hour, US dollars (0 = unknown)", ge=0)
    host_memory_bytes: float = spec(0.0, doc="CPU memory per GPU available for offload, bytes", ge=0)
    nvme_bandwidth: float = spec(0.0, doc="NVMe read bandwidth per GPU, bytes/s (0 = none)", ge=0)
    compute_capability: float | None = spec(
        None, doc="CUDA compute capability (8.0 A100, 9.0 Hopper, 10.0 Blackwell): NCCL's protocol bandwidth caps "
                  "across nodes are tabled by it (null = unknown: cross-node NCCL collectives are refused; always "
                  "null on AMD)", gt=0)
    # Optional: a card without published power facts gets no energy figures (reports say so), never a guess.
    power: Power | None = spec(
        None, doc="what the GPU draws, W, by what bounds its work (docs/energy.md); null = unknown: energy is "
                  "reported as not available")

    @property
    def nvlink_gpus(self) -> int:
        """GPUs one NVLink (Infinity Fabric) domain joins; 1 without NVLink."""
        if not self.peak.nvlink_bandwidth > 0:
            return 1
        return self.peak.nvlink_domain or self.peak.gpus_per_node

    def talks_over_nvlink(self, gpus: int) -> bool:
        """Whether a group of `gpus` GPUs of one node talks over NVLink (else over PCIe)."""
        return gpus <= self.nvlink_gpus

    def pcie_tier(self, gpus: int) -> PcieTier | None:
        """The PCIe tier a group of `gpus` GPUs of one node is placed in; None when the card gives none."""
        return next((tier for tier in self.derates.pcie_collective if tier.gpus >= gpus), None)

    @property
    def scale_up_name(self) -> str:
        """What the scale-up links are called on this GPU, for reports."""
        return "Infinity Fabric" if self.vendor == "amd" else "NVLink"

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
        """The GEMM efficiency of a format the card has a rate for (validate_hardware holds the two
        key sets equal)."""
        return self.derates.compute_efficiency[dtype]


REQUIRED_PROTOCOLS = ("LL", "LL128", "Simple")
#: tensor-core input formats a card may give a rate and an efficiency for
TENSOR_FORMATS = ("bf16", "fp16", "fp8", "int8", "fp6", "fp4")


def _check_formats(card: HardwareCard, source: str) -> None:
    """peak.flops and derates.compute_efficiency name known formats, the same ones: a format with a
    rate and no efficiency (or the reverse) would be priced with another format's number."""
    rates, efficiencies = card.peak.flops, card.derates.compute_efficiency
    for field, keys in (("peak.flops", rates), ("derates.compute_efficiency", efficiencies)):
        for key in keys:
            if key not in TENSOR_FORMATS:
                import difflib  # only for a card that names an unknown format

                close = difflib.get_close_matches(key, TENSOR_FORMATS, n=1, cutoff=0.5)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(source, f"{field}.{key}", keys[key],
                                  f"unknown format{hint}; formats: {', '.join(TENSOR_FORMATS)}")
    for key in rates:
        if key not in efficiencies:
            raise ConfigError(source, f"derates.compute_efficiency.{key}", MISSING,
                              f"peak.flops has a {key} rate, so its GEMM efficiency is needed too")
    for key in efficiencies:
        if key not in rates:
            raise ConfigError(source, f"peak.flops.{key}", MISSING,
                              f"derates.compute_efficiency has a {key} efficiency, but the card gives no {key} rate")


def _check_vendor(card: HardwareCard, source: str) -> None:
    if card.vendor not in VENDORS:
        import difflib  # only for a card that names an unknown vendor

        close = difflib.get_close_matches(card.vendor.lower(), VENDORS, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(source, "vendor", card.vendor, f"must be one of {', '.join(VENDORS)}{hint}")
    if card.vendor != "nvidia" and card.compute_capability is not None:
        raise ConfigError(source, "compute_capability", card.compute_capability,
                          f"a CUDA compute capability, but the card's vendor is {card.vendor}: leave it out (null)")


def _check_links(card: HardwareCard, source: str) -> None:
    peak = card.peak
    if peak.nvlink_domain == 1 or peak.nvlink_domain > peak.gpus_per_node:
        raise ConfigError(source, "peak.nvlink_domain", peak.nvlink_domain,
                          f"0 (the whole node) or 2 to the node's {peak.gpus_per_node} GPUs (peak.gpus_per_node)")
    tiers = card.derates.pcie_collective
    for i, (before, after) in enumerate(pairwise(tiers), start=1):
        if after.gpus <= before.gpus:
            raise ConfigError(source, f"derates.pcie_collective[{i}].gpus", after.gpus,
                              f"tiers go from the smallest group to the largest (the one before holds {before.gpus})")
    if tiers and tiers[-1].gpus > peak.gpus_per_node:
        raise ConfigError(source, f"derates.pcie_collective[{len(tiers) - 1}].gpus", tiers[-1].gpus,
                          f"more GPUs than a node holds ({peak.gpus_per_node}, peak.gpus_per_node)")


def validate_hardware(card: HardwareCard, source: str) -> HardwareCard:
    _check_vendor(card, source)
    _check_links(card, source)
    validate_power(card.power, source)
    if "bf16" not in card.peak.flops:
        raise ConfigError(source, "peak.flops.bf16", MISSING, "every card needs a bf16 rate")
    _check_formats(card, source)
    missing = [p for p in REQUIRED_PROTOCOLS if p not in card.derates.collective_latency]
    if missing:
        raise ConfigError(source, f"derates.collective_latency.{missing[0]}", MISSING,
                          f"needs protocols {', '.join(REQUIRED_PROTOCOLS)}")
    if card.derates.deepep_normal_sms >= card.peak.sm_count:
        raise ConfigError(source, "derates.deepep_normal_sms", card.derates.deepep_normal_sms,
                          f"must be fewer than the {card.peak.sm_count} SMs of the GPU")
    return card

