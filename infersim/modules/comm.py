"""Collective communication time: latency + size / bandwidth, NVLink (or PCIe) inside a node, RDMA across.

NCCL collectives follow NCCL's own tuning model (constants in the hardware card, from
src/graph/tuning.cc): for each protocol (LL, LL128, Simple)
    latency = base + m * ((ranks_per_node - 1) * nvlink_hop + log2(nodes) * network_hop)
with m = 2 for all-reduce (reduce then broadcast) and 1 otherwise; the bandwidth term moves the
bytes each GPU must send over NVLink and over its NIC at the protocol's efficiency; the fastest
protocol wins, as in NCCL. DeepEP dispatch/combine use the card's DeepEP latency and the same
byte accounting (low-latency mode sends everything through the NIC once the group spans nodes).

Across nodes, all-reduce / all-gather / reduce-scatter follow NCCL's tuning model in full
(`_nccl_multinode`): NCCL picks, per message, the fastest of Ring and Tree (Tree for all-reduce
only) in each protocol, with Ring's own latencies (every one of the ring's nsteps steps is paid,
as many of them across the network as the last chunk crosses, ceil(nsteps / GPUs per node), and no
intra step is cheaper than the NET proxy overhead), intra-node steps of LL at 1.8x once the
collective spans nodes (the card's nvlink_hop_factor_across_nodes, NCCL <= 2.17), and
NCCL's protocol bandwidths: the bus bandwidth of the slowest link (NVLink, or the node's NICs
together), LL capped at llMaxBw and Tree LL at 1/3.8 of it, converted to algorithm bandwidth
(x n/(2(n-1)) ring all-reduce, x n/(n-1) ring all-gather/reduce-scatter, x 1/2 tree). The
single-node path keeps the NCCL Tree latency with per-link byte counts (engines mostly replace it
with their custom all-reduce, timed by the kernel tables).

Inside a node a group talks over the card's scale-up links (NVLink; Infinity Fabric on AMD) when it
fits the card's NVLink domain, else over PCIe (`intra_node_link`): behind an NVSwitch every group
gets the full per-GPU bandwidth; on a full mesh (AMD's 8-GPU platforms: one link to each peer) a
group of k GPUs of a domain of D uses k-1 of the D-1 links; over PCIe a GPU reaches the efficiency
the card states for the smallest PCIe tier (switch, socket, node) holding the group, the step
latency is NCCL's PCI hwLat (`pcie_hop`), and LL128 is not used (NCCL enables it only where every
intra-node hop is NVLink). AMD cards carry RCCL's constants in the same model; across nodes RCCL's
tuning (its own bandwidth ratios and per-size corrections) is not modelled and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from infersim.base.records import cheap_init
from infersim.cards.hardware import CollectiveLatency, HardwareCard
from infersim.base.errors import MISSING, ConfigError
from infersim.shapes.comm_shapes import CollectiveShape, CommShape, TokenExchangeShape
from infersim.shapes.kernels import Bound, Cost, Source


# NCCL tuning-model constants that the hardware card's collective_latency (NCCL Tree values) does not
# hold: the Ring column, the NET proxy overhead, the LL bandwidth caps and the protocol corrections.
# Source for all of them: NVIDIA/nccl src/graph/tuning.cc, as transcribed in
# ../shared/reference/constants.md section 2 (ncclTunerConstantsDefaults; units there us and GB/s).
# (base, NVLink hop, NET hop) of Ring per protocol, seconds: baseLatencies Ring {6.6, 14.0, 8.4},
# hwLatencies NVLINK Ring {0.6, 1.9, 3.4}, NET Ring {2.7, 4.0, 14.0}
_RING_LATENCY = {"LL": (6.6e-6, 0.6e-6, 2.7e-6), "LL128": (14.0e-6, 1.9e-6, 4.0e-6), "Simple": (8.4e-6, 3.4e-6, 14.0e-6)}
# hwLatencies PCI Ring {1.0, 2.5, 5.7}: a Ring step between GPUs of a node that talk over PCIe
_RING_PCI_HOP = {"LL": 1.0e-6, "LL128": 2.5e-6, "Simple": 5.7e-6}
# NCCL_NET_OVERHEAD default 1.0 us on Intel x86 hosts (DGX H100/H200/B200: Xeon Platinum), x3 for Simple:
# an inter-node ring still launches every step through the network proxy (NCCL >= 2.18, Ring only).
# NCCL charges 2.0 us on AMD hosts (DGX A100, Azure NDmv4: EPYC); the NDmv4 2x8 1 KiB all-gather
# (NCCL 2.17.1, before this term) measures 33.7 us, which 2.0 us a step would put at 42 us (+25%)
_NET_OVERHEAD = 1.0e-6
# llMaxBws (bus bandwidth cap of the LL protocol, bytes/s) for 1 / 2 / >=4 nodes, by GPU generation
_LL_MAX_BW = {"volta": (39.0e9, 39.0e9, 20.4e9), "ampere": (87.7e9, 22.5e9, 19.0e9),
              "hopper": (141.0e9, 45.0e9, 35.0e9), "blackwell": (282.0e9, 90.0e9, 70.0e9)}
_TREE_ALLREDUCE_BW = 0.92     # Tree AllReduce: busBw x 0.92
_TREE_LL_BW = 1.0 / 3.8       # Tree LL: busBw / 3.8 (then capped at llMaxBw)
_TREE_LL128_BW = 120.0 / 128.0  # Tree LL128 across nodes: busBw x 120/128
_RING_LL_BW = 0.5             # Ring LL: busBw x 0.5 (then capped at llMaxBw)
_RING_LL128_BW = 0.92         # Ring LL128: busBw x 0.92


@cheap_init
@dataclass(frozen=True, slots=True)
class IntraNodeLink:
    """The link a group of GPUs of one node talks over, and what each GPU reaches on it."""

    name: str  # "NVLink", "Infinity Fabric" or "PCIe"
    bandwidth: float  # achievable bytes/s per GPU per direction among the group
    over_pcie: bool


def intra_node_link(hw: HardwareCard, gpus: int) -> IntraNodeLink:
    """The link `gpus` GPUs of one node talk over: NVLink within the card's NVLink domain (all of
    nvlink_bandwidth behind a switch, (k-1)/(D-1) of it for k GPUs of a full mesh of D), else PCIe:
    pcie_bandwidth x the efficiency of the card's smallest PCIe tier holding them."""
    if hw.talks_over_nvlink(gpus):
        bandwidth = hw.peak.nvlink_bandwidth * hw.derates.nvlink_efficiency
        domain = hw.nvlink_gpus
        if hw.peak.nvlink_topology == "mesh" and domain > 1:
            bandwidth *= (max(gpus, 2) - 1) / (domain - 1)
        return IntraNodeLink(hw.scale_up_name, bandwidth, False)
    tier = hw.pcie_tier(gpus)
    if tier is None:
        why = ("no NVLink: peak.nvlink_bandwidth is 0" if hw.nvlink_gpus == 1
               else f"NVLink joins only {hw.nvlink_gpus} of them: peak.nvlink_domain")
        tiers = [t.gpus for t in hw.derates.pcie_collective]
        raise ConfigError(f"hardware card {hw.name}", "derates.pcie_collective", tiers or MISSING,
                          f"{gpus} GPUs of a node talk over PCIe ({why}), but the card states no PCIe tier of "
                          f"{gpus} or more GPUs: add one with what NCCL reaches there (nccl-tests all_reduce busbw / "
                          "pcie_bandwidth; docs/adding-a-gpu.md)")
    return IntraNodeLink("PCIe", hw.peak.pcie_bandwidth * tier.efficiency, True)


def p2p_bandwidth(hw: HardwareCard, gpus: int) -> tuple[float, str]:
    """(bytes/s, link name) one GPU sends to one peer at while `gpus` GPUs of a node exchange data
    pairwise (KV-cache transfer between instances): one link of a mesh, else the group's link."""
    link = intra_node_link(hw, gpus)
    if link.over_pcie or hw.peak.nvlink_topology != "mesh":
        return link.bandwidth, link.name
    return intra_node_link(hw, 2).bandwidth, link.name


def _protocols(hw: HardwareCard, link: IntraNodeLink) -> Iterator[tuple[str, CollectiveLatency]]:
    """The protocols the library may pick: the card's enabled ones, less LL128 over PCIe (NCCL
    tuning.cc enables LL128 only where every intra-node hop is NVLink, typeIntra <= PATH_NVB; RCCL
    likewise, <= PATH_NVL)."""
    for name, proto in hw.derates.collective_latency.items():
        if proto.enabled and not (link.over_pcie and name == "LL128"):
            yield name, proto


def _intra_hop(hw: HardwareCard, name: str, proto: CollectiveLatency, link: IntraNodeLink) -> float:
    """NCCL's hwLat of one intra-node step on `link` (Tree values, as the card holds them)."""
    if not link.over_pcie:
        return proto.nvlink_hop
    if proto.pcie_hop is None:
        raise ConfigError(f"hardware card {hw.name}", f"derates.collective_latency.{name}.pcie_hop", MISSING,
                          "needed: this run's GPUs talk over PCIe (NCCL tuning.cc hwLatencies PCI Tree: LL 1.0, "
                          "LL128 1.9, Simple 4.0 us)")
    return proto.pcie_hop


def _refuse_rccl_across_nodes(hw: HardwareCard) -> None:
    if hw.vendor == "amd":
        raise ConfigError(f"hardware card {hw.name}", "vendor", hw.vendor,
                          "collectives across nodes run RCCL, whose multi-node tuning (its own bandwidth ratios and "
                          "per-size corrections, src/graph/tuning.cc) is not modelled: keep the TP/EP groups of this "
                          "GPU within one node")


def _generation(hw: HardwareCard) -> str:
    """NCCL's architecture row (tuning.cc indexes its tables by the lowest compute capability in the
    communicator: >= 10 Blackwell, >= 9 Hopper, >= 8 Ampere, else Volta; Ada's 8.9 is Ampere's row)."""
    cc = hw.compute_capability
    if cc is None:
        raise ConfigError(f"hardware card {hw.name}", "compute_capability", MISSING,
                          "needed for NCCL collectives across nodes (its protocol bandwidth caps depend on the GPU "
                          "architecture); add e.g. compute_capability: 9.0 for Hopper")
    return "blackwell" if cc >= 10 else "hopper" if cc >= 9 else "ampere" if cc >= 8 else "volta"


def _nccl_multinode(shape: CollectiveShape, hw: HardwareCard) -> tuple[float, str]:
    """(seconds, 'Algorithm protocol') of an NCCL all-reduce / all-gather / reduce-scatter whose
    group spans nodes, by NCCL's tuning model (constants.md section 2): the fastest pair wins."""
    _refuse_rccl_across_nodes(hw)
    ranks, nodes = shape.ranks, shape.nodes
    local = min(shape.ranks_per_node, ranks)
    all_reduce = shape.kind == "all_reduce"
    log_nodes = int(math.log2(nodes))  # NCCL log2i: integer floor
    link = intra_node_link(hw, local)
    intra = link.bandwidth if local > 1 else math.inf  # one GPU per node: no intra-node hop
    nics = local * hw.peak.network_bandwidth * hw.derates.network_efficiency  # the node's NICs, one per GPU
    # bus bandwidth of the ring: every GPU forwards 2(n-1)/n of the buffer over NVLink, and each
    # ring leaves every node once, so the node's NICs together carry that much too
    bus = min(intra, nics)
    ll_max = _LL_MAX_BW[_generation(hw)][0 if nodes == 1 else 1 if nodes == 2 else 2]
    nsteps = 2 * (ranks - 1) if all_reduce else ranks - 1
    # the collective ends when its last chunk arrives: a chunk crosses nsteps consecutive ring edges,
    # one in every `local` of them a NIC, so the last one crosses ceil(nsteps / local) NET edges
    # (NCCL counts the best-placed chunk's, 2(nodes-1) / nodes-1; 2.12-2.22 counted 2 x nodes for
    # all-reduce, which is this count from 3 GPUs per node)
    inter_steps = -(-nsteps // local)
    best, best_name = math.inf, ""
    for proto, tree in _protocols(hw, link):
        # Ring
        base, intra_hop, net_hop = _RING_LATENCY[proto]
        if link.over_pcie:
            intra_hop = _RING_PCI_HOP[proto]
        if local == 1:  # NCCL: with one GPU per node the network latency is fully exposed: Tree's NET value
            net_hop = tree.network_hop
        # an intra-node step of a collective that spans nodes: the card's factor (NCCL <= 2.17: LL x 1.8),
        # and no faster than the network proxy posts a step (NCCL >= 2.18: NET_OVERHEAD)
        step = max(intra_hop * tree.nvlink_hop_factor_across_nodes, _NET_OVERHEAD * (3 if proto == "Simple" else 1))
        latency = base + (nsteps - inter_steps) * step + inter_steps * net_hop
        bw = {"LL": min(ll_max, bus * _RING_LL_BW), "LL128": bus * _RING_LL128_BW, "Simple": bus}[proto]
        seconds = latency + shape.bytes_per_rank / (bw * ranks / nsteps)
        if seconds < best:
            best, best_name = seconds, f"Ring {proto}"
        if not all_reduce:
            continue
        # Tree (all-reduce only): the card's collective_latency holds NCCL's Tree values. Data flow:
        # inside the node a chain, whose GPUs send and receive the buffer twice (reduce up, broadcast
        # down): algorithm bandwidth NVLink / 2; across nodes NCCL's double binary tree, where a node
        # sends and receives the buffer once at 2 nodes (root of one tree, leaf of the other) and
        # twice beyond (internal in one tree: two children) over its NICs together. NCCL's own model
        # (tuning.cc) says the same by taking the intra bandwidth at <= 2 nodes.
        intra_hop = _intra_hop(hw, proto, tree, link) * tree.nvlink_hop_factor_across_nodes
        latency = tree.base + 2 * ((local - 1) * intra_hop + log_nodes * tree.network_hop)
        algo = min(intra / 2, nics / (1 if nodes == 2 else 2)) * _TREE_ALLREDUCE_BW
        algo = {"LL": min(algo * _TREE_LL_BW, ll_max * 0.5), "LL128": algo * _TREE_LL128_BW, "Simple": algo}[proto]
        seconds = latency + shape.bytes_per_rank / algo
        if seconds < best:
            best, best_name = seconds, f"Tree {proto}"
    return best, best_name


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


def _bandwidth_time(intra: float, inter: float, link: IntraNodeLink, hw: HardwareCard, efficiency: float) -> float:
    network = hw.peak.network_bandwidth * hw.derates.network_efficiency * efficiency
    t_intra = intra / (link.bandwidth * efficiency) if intra else 0.0
    t_inter = inter / network if inter else 0.0
    return max(t_intra, t_inter)  # the two links run concurrently (pipelined chunks)


def _library(hw: HardwareCard) -> str:
    return "RCCL" if hw.vendor == "amd" else "NCCL"


def _deepep_link(hw: HardwareCard, local: int, intra: float, implementation: str) -> IntraNodeLink:
    """The intra-node link of a DeepEP exchange: DeepEP moves a node's tokens over NVLink (CUDA IPC
    buffers), so a group that would talk over PCIe cannot run it."""
    link = intra_node_link(hw, local)
    if link.over_pcie and intra > 0:
        raise ConfigError(f"hardware card {hw.name}", "deployment.moe_comm", implementation,
                          f"DeepEP exchanges a node's tokens over NVLink, but {local} GPUs of a {hw.name} node talk "
                          "over PCIe: use moe_comm all-to-all or all-gather")
    return link


def token_exchange_cost(shape: TokenExchangeShape, hw: HardwareCard) -> Cost:
    """EP dispatch / combine. NCCL: latency + the busiest link. DeepEP normal mode pipelines its
    stages in chunks (RDMA to one GPU per destination node, NVLink forwarding inside it, copy-out),
    so the slowest stage sets the time: the NIC, NVLink, or the SMs it holds, through which every
    received token passes (internode.cu forwards one token per warp at a time; the same rate caps
    intranode.cu). DeepEP low-latency mode adds its receive pass after the exchange."""
    if shape.ep <= 1 or shape.tokens <= 0:
        return Cost(0.0, 0.0, 0.0, Bound.COMM, Source.ROOFLINE, "no peers")
    intra, inter = shape.traffic()
    local = min(shape.ranks_per_node, shape.ep)
    nodes = f"{shape.nodes} node{'s' if shape.nodes > 1 else ''}"
    where = f"{shape.implementation} {shape.direction} over EP{shape.ep} ({nodes}): "
    if shape.implementation == "nccl":
        link = intra_node_link(hw, local)
        links = f"{intra / 1e6:,.1f} MB {link.name}, {inter / 1e6:,.1f} MB network per GPU"
        proto = hw.derates.collective_latency["Simple"]
        hop = _intra_hop(hw, "Simple", proto, link) if local > 1 else 0.0
        latency = proto.base + (local - 1) * hop + math.log2(shape.nodes) * proto.network_hop
        return Cost(0.0, intra + inter, latency + _bandwidth_time(intra, inter, link, hw, 1.0), Bound.COMM,
                    Source.ROOFLINE, where.replace("nccl", _library(hw), 1) + links)
    link = _deepep_link(hw, local, intra, shape.implementation)
    links = f"{intra / 1e6:,.1f} MB NVLink, {inter / 1e6:,.1f} MB network per GPU"
    if shape.implementation == "deepep-low-latency":
        receive = shape.receive_pass()
        receive_s = receive / (hw.peak.hbm_bandwidth * hw.derates.elementwise_memory_efficiency)
        seconds = hw.derates.deepep_low_latency_latency + _bandwidth_time(intra, inter, link, hw, 1.0) + receive_s
        detail = where + links + f", {receive / 1e6:,.1f} MB receive pass"
        return Cost(0.0, intra + inter + receive, seconds, Bound.COMM, Source.ROOFLINE, detail)
    sms = shape.sms or hw.derates.deepep_normal_sms
    received = shape.received()
    stages = {"NVLink/NIC": _bandwidth_time(intra, inter, link, hw, 1.0)}
    if sms:
        stages[f"{sms} SMs"] = received / (sms * hw.derates.deepep_copy_rate_per_sm)
    bound = max(stages, key=stages.__getitem__)
    seconds = hw.derates.deepep_normal_latency + stages[bound]
    detail = where + links + f", {received / 1e6:,.1f} MB through {sms} SMs; bound: {bound}"
    return Cost(0.0, intra + inter, seconds, Bound.COMM, Source.ROOFLINE, detail)


def comm_cost(shape: CommShape, hw: HardwareCard) -> Cost:
    if isinstance(shape, TokenExchangeShape):
        return token_exchange_cost(shape, hw)
    return collective_cost(shape, hw)


def _nccl_one_level(shape: CollectiveShape, hw: HardwareCard, intra: float, inter: float) -> tuple[float, str]:
    """(seconds, protocol) of an NCCL collective priced with the card's Tree latencies and per-link
    bytes: latency = base + m x ((ranks per node - 1) x intra-node hop + log2(nodes) x NET hop), the
    fastest protocol winning."""
    m = 2.0 if shape.kind == "all_reduce" else 1.0
    local = min(shape.ranks_per_node, shape.ranks)
    link = intra_node_link(hw, local)
    best, best_name = math.inf, ""
    for name, proto in _protocols(hw, link):
        hop = _intra_hop(hw, name, proto, link) if local > 1 else 0.0
        latency = proto.base + m * ((local - 1) * hop + math.log2(shape.nodes) * proto.network_hop)
        total = latency + _bandwidth_time(intra, inter, link, hw, proto.bandwidth_efficiency)
        if total < best:
            best, best_name = total, name
    return best, f"{best_name} protocol" + (" over PCIe" if link.over_pcie and local > 1 else "")


def collective_cost(shape: CollectiveShape, hw: HardwareCard) -> Cost:
    if shape.ranks <= 1 or shape.bytes_per_rank <= 0:
        return Cost(0.0, 0.0, 0.0, Bound.COMM, Source.ROOFLINE, "no peers")
    intra, inter = _traffic(shape)
    nodes = shape.nodes
    library = _library(hw)
    if shape.implementation == "nccl" and nodes > 1 and shape.kind in ("all_reduce", "all_gather", "reduce_scatter"):
        seconds, algo = _nccl_multinode(shape, hw)
        # an NCCL collective is one kernel: it pays the launch gap every kernel pays
        seconds += hw.derates.kernel_launch_overhead
        detail = f"NCCL {shape.kind} over {shape.ranks} GPUs ({nodes} nodes), {algo} (NCCL tuning model)"
        return Cost(0.0, shape.bytes_per_rank, seconds, Bound.COMM, Source.ROOFLINE, detail)
    if shape.implementation == "nccl":
        best, protocol = _nccl_one_level(shape, hw, intra, inter)
        detail = f"{library} {shape.kind} over {shape.ranks} GPUs ({nodes} node{'s' if nodes > 1 else ''}), {protocol}"
        return Cost(0.0, shape.bytes_per_rank, best, Bound.COMM, Source.ROOFLINE, detail)
    local = min(shape.ranks_per_node, shape.ranks)
    if shape.implementation == "deepep-low-latency":
        if nodes > 1:  # IBGDA sends every remote token through the NIC, NVLink peers included
            intra, inter = 0.0, intra + inter
        latency = hw.derates.deepep_low_latency_latency
    else:
        latency = hw.derates.deepep_normal_latency
    link = _deepep_link(hw, local, intra, shape.implementation)
    seconds = latency + _bandwidth_time(intra, inter, link, hw, 1.0)
    detail = f"{shape.implementation} {shape.kind} over {shape.ranks} GPUs ({nodes} node{'s' if nodes > 1 else ''})"
    return Cost(0.0, shape.bytes_per_rank, seconds, Bound.COMM, Source.ROOFLINE, detail)
