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

Latencies (us), all-reduce, nsteps = 2(16-1) = 30, nInterSteps = 2(2-1) = 2, NET overhead 1 us
(x3 for Simple) as the floor of each intra ring step:
  Ring LL     6.6 + 28 x max(0.6, 1.0) + 2 x 2.7  = 40.0
  Ring LL128  14.0 + 28 x max(1.9, 1.0) + 2 x 4.0 = 75.2
  Ring Simple 8.4 + 28 x max(3.4, 3.0) + 2 x 14.0 = 131.6
  Tree LL     6.8 + 2 x (7 x 0.6 + log2(2) x 5.0)   = 25.2
  Tree LL128  14.0 + 2 x (7 x 1.25 + 8.5)           = 48.5
  Tree Simple 8.4 + 2 x (7 x 4.0 + 14.0)            = 92.4
Algorithm bandwidths (GB/s), all-reduce:
  Ring LL     min(45, 360 x 0.5) x 16/30            = 24.0
  Ring LL128  360 x 0.92 x 16/30                    = 176.64
  Ring Simple 360 x 16/30                           = 192.0
  Tree LL     min(165.6 / 3.8, 45 x 0.5)            = 22.5
  Tree LL128  165.6 x 120/128                       = 155.25
  Tree Simple                                       = 165.6
All-gather / reduce-scatter (ring only): nsteps = 15, nInterSteps = 1, bandwidth x 16/15:
  Ring LL     6.6 + 14 x 1.0 + 2.7 = 23.3 us,   min(45, 180) x 16/15 = 48.0 GB/s
  Ring LL128  14.0 + 14 x 1.9 + 4.0 = 44.6 us,  331.2 x 16/15 = 353.28 GB/s
  Ring Simple 8.4 + 14 x 3.4 + 14.0 = 70.0 us,  360 x 16/15 = 384.0 GB/s
"""

from __future__ import annotations

import pytest

from infersim.config import config_from_mapping, load_hardware_card
from infersim.comm_shapes import CollectiveShape
from infersim.modules.comm import collective_cost
from infersim.modules.step import build_stage_plan
from infersim.simulate import simulate

H100, _ = load_hardware_card("h100-sxm")
KIB, MIB = 1024, 1024 * 1024


def _t(latency_us: float, size: float, gbps: float) -> float:
    return (latency_us + 4.0) * 1e-6 + size / (gbps * 1e9)  # + the 4 us launch gap


# (kind, bytes, expected seconds, winning pair): each the minimum over the six / three pairs above
HAND = [
    # 16 KiB: Tree LL 25.2 + 16384 / 22.5e9 = 25.93 us (Ring LL 40.68, Tree LL128 48.61)
    ("all_reduce", 16 * KIB, _t(25.2, 16 * KIB, 22.5), "Tree LL"),
    # 1 MiB: Tree LL128 48.5 + 1048576 / 155.25e9 = 55.25 us (Tree LL 71.80, Ring LL128 81.14)
    ("all_reduce", MIB, _t(48.5, MIB, 155.25), "Tree LL128"),
    # 64 MiB: Ring LL128 75.2 + 67108864 / 176.64e9 = 455.1 us (Tree LL128 480.8, Ring Simple 481.1, Tree Simple 497.6)
    ("all_reduce", 64 * MIB, _t(75.2, 64 * MIB, 360 * 0.92 * 16 / 30), "Ring LL128"),
    # all-gather 16 KiB: Ring LL 23.3 + 16384 / 48e9 = 23.64 us
    ("all_gather", 16 * KIB, _t(23.3, 16 * KIB, 48.0), "Ring LL"),
    # 1 MiB: Ring LL 23.3 + 21.85 = 45.15 us (LL128 47.57)
    ("all_gather", MIB, _t(23.3, MIB, 48.0), "Ring LL"),
    # 64 MiB: Ring LL128 44.6 + 190.0 = 234.6 us (Simple 244.8)
    ("reduce_scatter", 64 * MIB, _t(44.6, 64 * MIB, 331.2 * 16 / 15), "Ring LL128"),
]


@pytest.mark.parametrize("kind,size,expected,algo", HAND, ids=[f"{k}-{s}" for k, s, _, _ in HAND])
def test_two_node_tp16_collective_matches_nccl_tuning_model(kind, size, expected, algo):
    cost = collective_cost(CollectiveShape(kind, size, ranks=16, ranks_per_node=8), H100)
    assert cost.seconds == pytest.approx(expected, rel=1e-6)
    assert algo in cost.detail


def test_two_node_all_reduce_is_slower_than_one_node_at_every_size():
    # one node: 6.8 + 2 x 7 x 0.6 = 15.2 us LL latency against 25.2 us across two nodes, and the
    # NIC-bound bus bandwidth (340 GB/s, LL capped at 45) is below NVLink's
    for size in (16 * KIB, 256 * KIB, MIB, 16 * MIB, 64 * MIB):
        one = collective_cost(CollectiveShape("all_reduce", size, 8, 8), H100).seconds
        two = collective_cost(CollectiveShape("all_reduce", size, 16, 8), H100).seconds
        assert two > one, size


def test_ll_bandwidth_is_capped_across_nodes():
    # 256 KiB: the old per-link model gave Tree LL 25.2 us + 2 x 256 KiB x 7/8 / (360e9 x 0.5) = 27.75 us;
    # NCCL caps LL's bus bandwidth at 45 GB/s on two Hopper nodes: 25.2 + 262144 / 22.5e9 = 36.85 us (+ 4 launch)
    cost = collective_cost(CollectiveShape("all_reduce", 256 * KIB, 16, 8), H100)
    assert cost.seconds == pytest.approx(_t(25.2, 256 * KIB, 22.5), rel=1e-6)


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
    for layers, ops in groups:
        assert [o.shape.kind for o in ops] == ["all_reduce", "all_reduce"]
        for op in ops:  # 16 tokens (1 per GPU x TP16) x 7168 x 2 bytes = 229,376 bytes over 16 ranks, 8 per node
            assert (op.shape.bytes_per_rank, op.shape.ranks, op.shape.ranks_per_node) == (16 * 7168 * 2, 16, 8)
    # each: Tree LL 25.2 us + 229376 / 22.5e9 = 35.39 us, + the 4 us launch gap; the step pays 122 of them
    result = simulate(config)
    assert result.decode.module_times()["all_reduce"] == pytest.approx(122 * _t(25.2, 229376, 22.5), rel=1e-6)


def test_dense_tp16_decode_runs_two_all_reduces_per_layer():
    config = _config("llama-3.1-8b", 16, 2, 1)
    _, groups = _collectives(config, 1)
    assert [(layers, [o.name for o in ops]) for layers, ops in groups] == [(32, ["attn_all_reduce", "ffn_all_reduce"])]


def test_two_node_tp16_decode_slower_per_token_than_one_node_tp8_for_a_small_dense_model():
    # Llama-3.1-8B, 16 requests either way (TP8: 2 per GPU, TP16: 1 per GPU). TP16 halves each GPU's
    # weight reads (16 GB bf16 / 8 -> / 16: 2.0 -> 1.0 GB, about 0.33 ms at 3.08 TB/s) but its 64
    # all-reduces of 16 x 4096 x 2 = 131,072 bytes cross the NIC: 64 x (25.2 us + 131072 / 22.5e9 + 4 us
    # launch) = 2.24 ms against 64 x (15.2 us + 2 x 131072 x 7/8 / 180e9) = 1.0 ms on one node: +1.2 ms > 0.33 ms saved
    tp8, tp16 = _config("llama-3.1-8b", 8, 1, 2), _config("llama-3.1-8b", 16, 2, 1)
    r8, r16 = simulate(tp8).decode, simulate(tp16).decode
    assert r16.module_times()["all_reduce"] == pytest.approx(64 * _t(25.2, 131072, 22.5), rel=1e-6)
    assert r8.module_times()["all_reduce"] == pytest.approx(64 * (15.2e-6 + 2 * 131072 * 7 / 8 / 180e9), rel=1e-6)
    assert r16.tpot_s > r8.tpot_s


def test_measured_multinode_collectives_are_reproduced():
    """benchmarks/collectives_multinode.yaml: nccl-tests-style measurements on 2-4 nodes (A100 over HDR
    IB, H100 over 200 Gb/s NICs, B200 over EFA). Large messages, where NCCL's algorithm and the NICs
    decide, within 15%; the two 2x8 A100 1 KiB latencies (NCCL 2.17.1) stay 18-19% under: NCCL's own
    model of that version puts them 8-16 us under too."""
    import importlib.util

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("validate_collectives", REPO_ROOT / "benchmarks" / "validate_collectives.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [r for r in bench.evaluate() if r["check"]]
    assert len(rows) == 17
    for r in rows:
        bound = 0.15 if r["unit"].startswith("GB/s") or r["ranks_per_node"] == 1 else 0.20
        assert abs(r["error"]) <= bound, r
    # two nodes: the tree's inter-node hop carries the buffer once per node, so 8 x 200 Gb/s NICs
    # (25 GB/s per GPU) still give ~310 GB/s of bus bandwidth, as measured (298-339), not the ring's 180
    a3 = [r for r in rows if r["series"] == "a3mega-h100-2x8-all-reduce"]
    assert all(r["algorithm"] == "Tree Simple" and r["predicted"] > 300 for r in a3)
