"""Multi-node NCCL collectives against NCCL's tuning model, derived by hand.

Setting: 2 nodes x 8 H100 SXM (hardware/h100-sxm.yaml), TP16: nRanks = 16, nNodes = 2, 8 ranks per
node, NVLink inside the node, one 400 Gb/s ConnectX-7 NIC per GPU across nodes.

NCCL's model (../shared/reference/constants.md section 2, NVIDIA/nccl src/graph/tuning.cc): time =
latency + bytes / algorithm bandwidth, the fastest (algorithm, protocol) pair wins.

Bus bandwidth of the ring, per GPU: the slower of NVLink (450e9 x 0.8 = 360 GB/s) and the node's 8
NICs together (8 x 50e9 x 0.9 = 360 GB/s): 360 GB/s. llMaxBw Hopper, 2 nodes: 45 GB/s. The tree by
its data flow: a chain inside the node sends the buffer twice over NVLink (360 / 2 = 180 GB/s); at
two nodes each node sends it once over its NICs (360 GB/s): min 180, x 0.92 = 165.6 GB/s algorithm
bandwidth. Every collective is one kernel and pays the card's 4 us launch gap on top.

Latencies (us), all-reduce, nsteps = 2(16-1) = 30. The ring's last chunk crosses ceil(30 / 8) = 4
NET edges (NCCL counts the best-placed chunk's 2(2-1) = 2), so 26 intra steps; an intra step of a
collective that spans nodes costs the card's factor (LL: x 1.8, NCCL <= 2.17) and no less than the
NET overhead, 1 us (x3 for Simple):
  Ring LL     6.6 + 26 x max(0.6 x 1.8, 1.0) + 4 x 2.7  = 45.48
  Ring LL128  14.0 + 26 x max(1.9, 1.0) + 4 x 4.0       = 79.4
  Ring Simple 8.4 + 26 x max(3.4, 3.0) + 4 x 14.0       = 152.8
  Tree LL     6.8 + 2 x (7 x 0.6 x 1.8 + log2(2) x 5.0) = 31.92
  Tree LL128  14.0 + 2 x (7 x 1.25 + 8.5)               = 48.5
  Tree Simple 8.4 + 2 x (7 x 4.0 + 14.0)                = 92.4
Algorithm bandwidths (GB/s), all-reduce:
  Ring LL     min(45, 360 x 0.5) x 16/30            = 24.0
  Ring LL128  360 x 0.92 x 16/30                    = 176.64
  Ring Simple 360 x 16/30                           = 192.0
  Tree LL     min(165.6 / 3.8, 45 x 0.5)            = 22.5
  Tree LL128  165.6 x 120/128                       = 155.25
  Tree Simple                                       = 165.6
All-gather / reduce-scatter (ring only): nsteps = 15, ceil(15 / 8) = 2 NET edges, 13 intra steps,
bandwidth x 16/15:
  Ring LL     6.6 + 13 x 1.08 + 2 x 2.7 = 26.04 us,  min(45, 180) x 16/15 = 48.0 GB/s
  Ring LL128  14.0 + 13 x 1.9 + 2 x 4.0 = 46.7 us,   331.2 x 16/15 = 353.28 GB/s
  Ring Simple 8.4 + 13 x 3.4 + 2 x 14.0 = 80.6 us,   360 x 16/15 = 384.0 GB/s
"""

from __future__ import annotations

import pytest

from infersim.run.config import config_from_mapping, load_hardware_card
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.modules.comm import collective_cost
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate

H100, _ = load_hardware_card("h100-sxm")
KIB, MIB = 1024, 1024 * 1024


def _t(latency_us: float, size: float, gbps: float) -> float:
    return (latency_us + 4.0) * 1e-6 + size / (gbps * 1e9)  # + the 4 us launch gap


# (kind, bytes, expected seconds, winning pair): each the minimum over the six / three pairs above
HAND = [
    # 16 KiB: Tree LL 31.92 + 16384 / 22.5e9 = 32.65 us (Ring LL 46.16, Tree LL128 48.61)
    ("all_reduce", 16 * KIB, _t(31.92, 16 * KIB, 22.5), "Tree LL"),
    # 1 MiB: Tree LL128 48.5 + 1048576 / 155.25e9 = 55.25 us (Tree LL 78.52, Ring LL128 85.34)
    ("all_reduce", MIB, _t(48.5, MIB, 155.25), "Tree LL128"),
    # 64 MiB: Ring LL128 79.4 + 67108864 / 176.64e9 = 459.3 us (Tree LL128 480.8, Tree Simple 497.6, Ring Simple 502.3)
    ("all_reduce", 64 * MIB, _t(79.4, 64 * MIB, 360 * 0.92 * 16 / 30), "Ring LL128"),
    # all-gather 16 KiB: Ring LL 26.04 + 16384 / 48e9 = 26.38 us
    ("all_gather", 16 * KIB, _t(26.04, 16 * KIB, 48.0), "Ring LL"),
    # 1 MiB: Ring LL 26.04 + 21.85 = 47.89 us (LL128 49.67)
    ("all_gather", MIB, _t(26.04, MIB, 48.0), "Ring LL"),
    # 64 MiB: Ring LL128 46.7 + 190.0 = 236.7 us (Simple 255.4)
    ("reduce_scatter", 64 * MIB, _t(46.7, 64 * MIB, 331.2 * 16 / 15), "Ring LL128"),
]


@pytest.mark.parametrize("kind,size,expected,algo", HAND, ids=[f"{k}-{s}" for k, s, _, _ in HAND])
def test_two_node_tp16_collective_matches_nccl_tuning_model(kind, size, expected, algo):
    cost = collective_cost(CollectiveShape(kind, size, ranks=16, ranks_per_node=8), H100)
    assert cost.seconds == pytest.approx(expected, rel=1e-6)
    assert algo in cost.detail


def test_two_node_all_reduce_is_slower_than_one_node_at_every_size():
    # one node: 6.8 + 2 x 7 x 0.6 = 15.2 us LL latency against 31.92 us across two nodes, and the
    # NIC-bound bus bandwidth (340 GB/s, LL capped at 45) is below NVLink's
    for size in (16 * KIB, 256 * KIB, MIB, 16 * MIB, 64 * MIB):
        one = collective_cost(CollectiveShape("all_reduce", size, 8, 8), H100).seconds
        two = collective_cost(CollectiveShape("all_reduce", size, 16, 8), H100).seconds
        assert two > one, size


def test_ll_bandwidth_is_capped_across_nodes():
    # 256 KiB: the old per-link model gave Tree LL 31.92 us + 2 x 256 KiB x 7/8 / (360e9 x 0.5) = 34.47 us;
    # NCCL caps LL's bus bandwidth at 45 GB/s on two Hopper nodes: 31.92 + 262144 / 22.5e9 = 43.57 us (+ 4 launch)
    cost = collective_cost(CollectiveShape("all_reduce", 256 * KIB, 16, 8), H100)
    assert cost.seconds == pytest.approx(_t(31.92, 256 * KIB, 22.5), rel=1e-6)


def _config(model: str, gpus: int, nodes: int, batch: int, **dep):
    deployment = {"num_gpus": gpus, "num_nodes": nodes, "attention": {"tp": gpus}, "ffn": {"tp": gpus}, **dep}
    return config_from_mapping({"model": model, "hardware": "h100-sxm", "engine": "sglang", "deployment": deployment,
                                "workload": {"isl": 1000, "osl": 1000, "prefill_tokens_per_gpu": 1000,
                                             "decode_batch_per_gpu": batch}}, "test", mfu_tables="none")


def _collectives(config, batch):
    plan = build_stage_plan("decode", config.model, config.deployment, config.workload, batch,
                            config.hardware.derates.deepep_normal_sms)
    return plan, [(g.layers, [o for o in g.operations if isinstance(o.shape, CollectiveShape)]) for g in plan.groups]


def test_deepseek_v3_tp16_decode_runs_two_all_reduces_per_layer():
    # SGLang/vLLM TP16 without EP: the O projection and the (TP-sliced) experts + shared expert each
    # end in one all-reduce of the group's tokens: 2 per layer, 61 layers, 122 per step
    config = _config("deepseek-v3", 16, 2, 1, moe_comm="all-gather", precision={"gemm": "fp8"})
    plan, groups = _collectives(config, 1)
    assert sum(layers for layers, _ in groups) == 61
    for _layers, ops in groups:
        assert [o.shape.kind for o in ops] == ["all_reduce", "all_reduce"]
        for op in ops:  # 16 tokens (1 per GPU x TP16) x 7168 x 2 bytes = 229,376 bytes over 16 ranks, 8 per node
            assert (op.shape.bytes_per_rank, op.shape.ranks, op.shape.ranks_per_node) == (16 * 7168 * 2, 16, 8)
    # each: Tree LL 31.92 us + 229376 / 22.5e9 = 42.11 us, + the 4 us launch gap; the step pays 122 of them
    result = simulate(config)
    assert result.decode.module_times()["all_reduce"] == pytest.approx(122 * _t(31.92, 229376, 22.5), rel=1e-6)


def test_dense_tp16_decode_runs_two_all_reduces_per_layer():
    config = _config("llama-3.1-8b", 16, 2, 1)
    _, groups = _collectives(config, 1)
    assert [(layers, [o.name for o in ops]) for layers, ops in groups] == [(32, ["attn_all_reduce", "ffn_all_reduce"])]


def test_two_node_tp16_decode_slower_per_token_than_one_node_tp8_for_a_small_dense_model():
    # Llama-3.1-8B, 16 requests either way (TP8: 2 per GPU, TP16: 1 per GPU). TP16 halves each GPU's
    # weight reads (16 GB bf16 / 8 -> / 16: 2.0 -> 1.0 GB, about 0.33 ms at 3.08 TB/s) but its 64
    # all-reduces of 16 x 4096 x 2 = 131,072 bytes cross the NIC: 64 x (31.92 us + 131072 / 22.5e9 + 4 us
    # launch) = 2.67 ms against 64 x (15.2 us + 2 x 131072 x 7/8 / 180e9) = 1.0 ms on one node: +1.7 ms > 0.33 ms saved
    tp8, tp16 = _config("llama-3.1-8b", 8, 1, 2), _config("llama-3.1-8b", 16, 2, 1)
    r8, r16 = simulate(tp8).decode, simulate(tp16).decode
    assert r16.module_times()["all_reduce"] == pytest.approx(64 * _t(31.92, 131072, 22.5), rel=1e-6)
    assert r8.module_times()["all_reduce"] == pytest.approx(64 * (15.2e-6 + 2 * 131072 * 7 / 8 / 180e9), rel=1e-6)
    assert r16.tpot_s > r8.tpot_s


A100, _ = load_hardware_card("a100-sxm-80g")


def test_a100_two_node_1kib_latencies_by_hand():
    """2 x 8 A100 (NDmv4: HDR 200 Gb/s per GPU), 1 KiB, the measured rows' case.
    All-gather, Ring LL: nsteps 15; the last chunk crosses ceil(15 / 8) = 2 of the ring's NET edges
    and 13 NVLink edges, each 0.6 x 1.8 = 1.08 us (above the 1 us NET overhead):
    6.6 + 13 x 1.08 + 2 x 2.7 = 26.04 us. LL bus bandwidth: min(llMaxBw Ampere at 2 nodes 22.5,
    min(NVLink 300 x 0.8, 8 NICs x 25 x 0.85) x 0.5 = 85) = 22.5 GB/s, x 16/15 = 24 GB/s algorithm
    bandwidth: 1024 / 24e9 = 0.043 us; + 4 us launch = 30.08 us (measured 33.74).
    All-reduce, Tree LL: 6.8 + 2 x (7 x 1.08 + 5.0) = 31.92 us; bandwidth min(240 / 2, 170) x 0.92 =
    110.4 GB/s, LL: min(110.4 / 3.8, 22.5 x 0.5) = 11.25 GB/s: 0.091 us; + 4 = 36.01 us (measured 35.85).
    Before the LL factor and the last chunk's NET count: 6.6 + 14 x 1.0 + 2.7 and 6.8 + 2 x (7 x 0.6 + 5.0)."""
    gather = collective_cost(CollectiveShape("all_gather", 1024, 16, 8), A100)
    assert gather.seconds == pytest.approx((26.04 + 4.0) * 1e-6 + 1024 / 24e9, rel=1e-9)
    assert "Ring LL " in gather.detail
    reduce = collective_cost(CollectiveShape("all_reduce", 1024, 16, 8), A100)
    assert reduce.seconds == pytest.approx((31.92 + 4.0) * 1e-6 + 1024 / 11.25e9, rel=1e-9)
    assert "Tree LL " in reduce.detail
    # one GPU per node: no intra step, every ring edge a NET edge at Tree's exposed 5.0 us: unchanged
    pair = collective_cost(CollectiveShape("all_gather", 1024, 2, 1), A100)
    assert pair.seconds == pytest.approx((6.6 + 5.0 + 4.0) * 1e-6 + 1024 / (min(22.5e9, 25e9 * 0.85 * 0.5) * 2), rel=1e-9)


def test_the_ll_factor_is_a_card_value_and_only_across_nodes():
    # a card without the factor prices the 2x8 tree at NCCL's single-node hop; one node never pays it
    from dataclasses import replace

    plain_ll = replace(A100.derates.collective_latency["LL"], nvlink_hop_factor_across_nodes=1.0)
    plain = replace(A100, derates=replace(A100.derates, collective_latency={
        **A100.derates.collective_latency, "LL": plain_ll}))
    tree = collective_cost(CollectiveShape("all_reduce", 1024, 16, 8), plain)
    assert tree.seconds == pytest.approx((6.8 + 2 * (7 * 0.6 + 5.0) + 4.0) * 1e-6 + 1024 / 11.25e9, rel=1e-9)
    one_node = [collective_cost(CollectiveShape("all_reduce", 1024, 8, 8), card).seconds for card in (A100, plain)]
    assert one_node[0] == one_node[1]


def test_measured_multinode_collectives_are_reproduced():
    """benchmarks/collectives_multinode.yaml: nccl-tests-style measurements on 2-4 nodes (A100 over HDR
    IB, H100 over 200 Gb/s NICs, B200 over EFA), every checked point within 15%: large messages, where
    NCCL's algorithm and the NICs decide, and the A100 1 KiB latencies (NCCL 2.17.1), where the 2x8
    rows pay 1.8x NVLink LL hops and the ring's last chunk crosses both NET edges."""
    import importlib.util

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("validate_collectives", REPO_ROOT / "benchmarks" / "validate_collectives.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [r for r in bench.evaluate() if r["check"]]
    assert len(rows) == 17
    for r in rows:
        assert abs(r["error"]) <= 0.15, r
    small = {r["series"]: r for r in rows if r["bytes"] == 1024 and r["ranks_per_node"] == 8}
    assert small["ndmv4-a100-2x8-all-reduce"]["error"] == pytest.approx(0.0045, abs=0.001)
    assert small["ndmv4-a100-2x8-all-gather"]["error"] == pytest.approx(-0.108, abs=0.001)
    # two nodes: the tree's inter-node hop carries the buffer once per node, so 8 x 200 Gb/s NICs
    # (25 GB/s per GPU) still give ~310 GB/s of bus bandwidth, as measured (298-339), not the ring's 180
    a3 = [r for r in rows if r["series"] == "a3mega-h100-2x8-all-reduce"]
    assert all(r["algorithm"] == "Tree Simple" and r["predicted"] > 300 for r in a3)
