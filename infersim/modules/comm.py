"""Collective communication time: latency + size / bandwidth, NVLink inside a node, RDMA across.

NCCL collectives follow NCCL's own tuning model (constants in the hardware card, from
src/graph/tuning.cc): for each protocol (LL, LL128, Simple)
    latency = base + m * ((ranks_per_node - 1) * nvlink_hop + log2(nodes) * network_hop)
with m = 2 for all-reduce (reduce then broadcast) and 1 otherwise; the bandwidth term moves the
bytes each GPU must send over NVLink and over its NIC at the protocol's efficiency; the fastest
protocol wins, as in NCCL. DeepEP dispatch/combine use the card's DeepEP latency and the same
byte accounting (low-latency mode sends everything through the NIC once the group spans nodes).
"""

from __future__ import annotations

import math

from infersim.cards.hardware import HardwareCard
from infersim.kernels import Bound, CollectiveShape, CommShape, Cost, Source, TokenExchangeShape


def _traffic(shape: CollectiveShape) -> tuple[float, float]:
    """(bytes each GPU sends over NVLink, bytes each GPU sends over its NIC)."""
    ranks, local = shape.ranks, min(shape.ranks_per_node, shape.ranks)
    nodes = shape.nodes
    size = shape.bytes_per_rank
    if shape.kind == "p2p":
        return (size, 0.0) if nodes == 1 else (0.0, size)
    if shape.kind == "all_to_all":
        # each rank keeps 1/ranks of its data, sends the rest spread evenly over the other ranks
        return size * (local - 1) / ranks, size * (ranks - local) / ranks
    steps = 2.0 if shape.kind == "all_reduce" else 1.0
    # hierarchical: reduce-scatter/all-gather inside the node, then across nodes on a 1/local shard
    intra = steps * size * (local - 1) / local
    inter = steps * (size / local) * (nodes - 1) / nodes if nodes > 1 else 0.0
    return intra, inter


def _bandwidth_time(intra: float, inter: float, hw: HardwareCard, efficiency: float) -> float:
    nvlink = hw.peak.nvlink_bandwidth * hw.derates.nvlink_efficiency * efficiency
    network = hw.peak.network_bandwidth * hw.derates.network_efficiency * efficiency
    t_intra = intra / nvlink if intra else 0.0
    t_inter = inter / network if inter else 0.0
    return max(t_intra, t_inter)  # the two links run concurrently (pipelined chunks)


def token_exchange_cost(shape: TokenExchangeShape, hw: HardwareCard) -> Cost:
    if shape.ep <= 1 or shape.tokens <= 0:
        return Cost(0.0, 0.0, 0.0, Bound.COMM, Source.ROOFLINE, "no peers")
    intra, inter = shape.traffic()
    if shape.implementation == "nccl":
        proto = hw.derates.collective_latency["Simple"]
        local = min(shape.ranks_per_node, shape.ep)
        latency = proto.base + (local - 1) * proto.nvlink_hop + math.log2(shape.nodes) * proto.network_hop
    elif shape.implementation == "deepep-low-latency":
        latency = hw.derates.deepep_low_latency_latency
    else:
        latency = hw.derates.deepep_normal_latency
    seconds = latency + _bandwidth_time(intra, inter, hw, 1.0)
    detail = (f"{shape.implementation} {shape.direction} over EP{shape.ep} ({shape.nodes} node{'s' if shape.nodes > 1 else ''}): "
              f"{intra / 1e6:,.1f} MB NVLink, {inter / 1e6:,.1f} MB network per GPU")
    return Cost(0.0, intra + inter, seconds, Bound.COMM, Source.ROOFLINE, detail)


def comm_cost(shape: CommShape, hw: HardwareCard) -> Cost:
    if isinstance(shape, TokenExchangeShape):
        return token_exchange_cost(shape, hw)
    return collective_cost(shape, hw)


def collective_cost(shape: CollectiveShape, hw: HardwareCard) -> Cost:
    if shape.ranks <= 1 or shape.bytes_per_rank <= 0:
        return Cost(0.0, 0.0, 0.0, Bound.COMM, Source.ROOFLINE, "no peers")
    intra, inter = _traffic(shape)
    nodes = shape.nodes
    if shape.implementation == "nccl":
        m = 2.0 if shape.kind == "all_reduce" else 1.0
        local = min(shape.ranks_per_node, shape.ranks)
        best = math.inf
        best_name = ""
        for name, proto in hw.derates.collective_latency.items():
            latency = proto.base + m * ((local - 1) * proto.nvlink_hop + math.log2(nodes) * proto.network_hop)
            total = latency + _bandwidth_time(intra, inter, hw, proto.bandwidth_efficiency)
            if total < best:
                best, best_name = total, name
        detail = f"NCCL {shape.kind} over {shape.ranks} GPUs ({nodes} node{'s' if nodes > 1 else ''}), {best_name} protocol"
        return Cost(0.0, shape.bytes_per_rank, best, Bound.COMM, Source.ROOFLINE, detail)
    if shape.implementation == "deepep-low-latency":
        if nodes > 1:  # IBGDA sends every remote token through the NIC, NVLink peers included
            intra, inter = 0.0, intra + inter
        latency = hw.derates.deepep_low_latency_latency
    else:
        latency = hw.derates.deepep_normal_latency
    seconds = latency + _bandwidth_time(intra, inter, hw, 1.0)
    detail = f"{shape.implementation} {shape.kind} over {shape.ranks} GPUs ({nodes} node{'s' if nodes > 1 else ''})"
    return Cost(0.0, shape.bytes_per_rank, seconds, Bound.COMM, Source.ROOFLINE, detail)
