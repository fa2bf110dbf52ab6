"""The shapes of communication kernels: collectives over a group of GPUs and the EP token exchange
(MoE dispatch and combine), with the bytes each GPU moves over NVLink and over its NIC.

Like the compute shapes (infersim.shapes.kernels) they are frozen descriptions of one launch, their
bytes pure functions of the shape (and slotted, as they are: cheaper to build); infersim.modules.comm
turns them into seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from infersim.base.records import cheap_init

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
CommImplementation = Literal["nccl", "deepep-normal", "deepep-low-latency"]


@cheap_init
@dataclass(frozen=True, slots=True)
class CollectiveShape:
    """A collective over `ranks` GPUs, `ranks_per_node` of them in each node.

    bytes_per_rank is the payload each rank holds: the full buffer for all-reduce, the gathered
    output for all-gather, the input for reduce-scatter, what each rank sends in total for
    all-to-all (EP dispatch/combine) and p2p.
    """

    kind: CollectiveKind
    bytes_per_rank: float
    ranks: int
    ranks_per_node: int
    implementation: CommImplementation = "nccl"

    @property
    def nodes(self) -> int:
        return max(1, -(-self.ranks // self.ranks_per_node))

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return self.bytes_per_rank


def prob_group_hit(num_experts: int, experts_in_group: float, topk: int) -> float:
    """Probability that a token's topk distinct experts (uniform over num_experts) include at least
    one of the experts_in_group experts a GPU or node holds (hypergeometric complement)."""
    miss = 1.0
    for i in range(topk):
        miss *= max(0.0, (num_experts - experts_in_group - i) / (num_experts - i))
    return 1.0 - miss


@cheap_init
@dataclass(frozen=True, slots=True)
class TokenExchangeShape:
    """EP dispatch (tokens to their experts' GPUs) or combine (expert outputs back), per GPU.

    Each of `tokens` tokens goes once to every GPU holding at least one of its top-k experts
    (copies to the same GPU are merged). DeepEP normal mode also merges across a node: one RDMA
    copy per destination node, forwarded over NVLink inside it (DeepEP's internode kernels: RDMA to
    the same local rank on the target node, then NVLink to the expert's GPU), so across n nodes a
    GPU forwards n times its own node-local share. DeepEP low-latency mode merges
    nothing: it writes one message per (token, expert) straight into the receiving expert's buffer
    (DeepEP README: the low-latency layout is per expert, so CUDA graphs see fixed shapes), to
    same-node peers over NVLink and to other nodes through the NIC (or every peer through the NIC
    where NVLink is not allowed: `allow_nvlink_for_low_latency`). With its published byte count
    (tokens x top-k x hidden bytes / time) this reproduces DeepEP's own EP8-EP256 latencies, with
    NVLink (EP8-64, re-measured in June 2025) and without (EP128-256, from the first release).
    DeepEP normal mode moves every token a GPU receives through the SMs it holds (`sms`; 0 = the
    hardware card's deepep_normal_sms): `received()` is that byte count. Low-latency mode lands
    messages straight in a receive buffer, then copies (dispatch) or reduces (combine) them once
    every sender's count or flag has arrived: `receive_pass()` is that pass's HBM traffic.
    `load_factor` (>= 1, infersim.modules.load_balance) is the most loaded GPU's share of the
    routed tokens over the mean: that GPU receives (dispatch) and returns (combine) that many
    times the mean traffic, and the exchange waits for it, so the per-GPU bytes scale with it.
    """

    direction: Literal["dispatch", "combine"]
    tokens: float
    token_bytes: float  # hidden size x bytes per element
    num_experts: int
    topk: int
    ep: int
    ranks_per_node: int
    implementation: Literal["nccl", "deepep-normal", "deepep-low-latency"] = "nccl"
    load_factor: float = 1.0
    # group-limited routing (DeepSeek-V3: experts in n_group groups, a token picks topk_group of
    # them, then its top-k experts inside those): it bounds the nodes a token reaches
    expert_groups: int = 1
    groups_per_token: int = 0  # 0 = no limit
    sms: int = 0  # SMs DeepEP normal mode runs on (its Buffer.num_sms); 0 = the hardware card's deepep_normal_sms
    # DeepEP's Buffer(allow_nvlink_for_low_latency_mode=...): True (its default since PR #173, June
    # 2025) sends low-latency messages to same-node peers over NVLink; False sends every peer's
    # through the NIC, as DeepEP's low-latency kernels did before (its README's "pure RDMA" rows)
    allow_nvlink_for_low_latency: bool = True

    @property
    def nodes(self) -> int:
        return max(1, -(-self.ep // self.ranks_per_node))

    @property
    def gpu_hit(self) -> float:
        # a GPU carries 1/ep of the expert load (E/ep experts' worth, redundant replicas included)
        return prob_group_hit(self.num_experts, self.num_experts / self.ep, self.topk)

    @property
    def node_hit(self) -> float:
        """Probability that a token has at least one expert on a given node. Under group-limited
        routing with whole groups per node, a node is reached when one of its groups is among the
        token's topk_group groups (each chosen group holds at least one of its experts: groups are
        ranked by their best experts' scores); otherwise experts are drawn uniformly."""
        per_node = self.num_experts / self.ep * min(self.ranks_per_node, self.ep)
        groups, chosen = self.expert_groups, self.groups_per_token
        if chosen and chosen < groups and self.nodes > 1 and groups % self.nodes == 0:
            on_node = groups // self.nodes
            return 1.0 - math.comb(groups - on_node, chosen) / math.comb(groups, chosen)
        return prob_group_hit(self.num_experts, per_node, self.topk)

    def traffic(self) -> tuple[float, float]:
        """(bytes the most loaded GPU moves over NVLink, bytes it moves over its NIC)."""
        local = min(self.ranks_per_node, self.ep)
        tokens = self.tokens * self.load_factor
        if self.implementation == "deepep-low-latency":
            copies = tokens * self.topk * self.token_bytes  # one per (token, expert), experts spread evenly
            if not self.allow_nvlink_for_low_latency:
                return 0.0, copies * (self.ep - 1) / self.ep
            return copies * (local - 1) / self.ep, copies * (self.ep - local) / self.ep
        per_gpu = tokens * self.gpu_hit * self.token_bytes
        intra = per_gpu * (local - 1)
        if self.nodes == 1:
            return intra, 0.0
        if self.implementation == "deepep-normal":
            # every token reaches a node through the RDMA buffer of the GPU with the sender's local
            # rank there, which forwards it over NVLink: each GPU forwards the copies that all
            # `nodes` senders of its local rank (itself included) addressed to its node
            return intra * self.nodes, tokens * self.node_hit * self.token_bytes * (self.nodes - 1)
        return intra, per_gpu * (self.ep - local)

    def received(self) -> float:
        """Bytes the most loaded GPU takes in from all EP ranks, its own copies included (DeepEP's
        test_intranode / test_internode "NVL" byte count): every rank sends it the tokens that
        hit one of its experts."""
        return self.tokens * self.load_factor * self.gpu_hit * self.token_bytes * self.ep

    def receive_pass(self) -> float:
        """HBM bytes of DeepEP low-latency mode's receive pass (internode_ll.cu), which starts when
        the senders' counts (dispatch) or flags (combine) arrive, after their data: dispatch
        copies each received (token, expert) message into the per-expert layout (read + write);
        combine reads the top-k expert outputs of each of the GPU's own tokens and writes one sum."""
        if self.implementation != "deepep-low-latency":
            return 0.0
        if self.direction == "dispatch":
            return 2.0 * self.tokens * self.load_factor * self.topk * self.token_bytes
        return self.tokens * (self.topk + 1) * self.token_bytes

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return sum(self.traffic())


CommShape = CollectiveShape | TokenExchangeShape
