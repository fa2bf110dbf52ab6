"""deployment.weight_offload: weights that do not fit in HBM stay in host memory and stream over the
host link one layer ahead of compute (infersim.costing.weight_offload)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, TEST_CACHE_DIR, public_reference
from infersim.cli.main import main
from infersim.run.config import load_hardware_card, load_model_card, load_run_config
from infersim.cards.deployment import Deployment, Workload
from infersim.engine.stage import run_stage
from infersim.shapes.kernels import NoTables
from infersim.run.memory import activation_bytes, kv_bytes_per_token, memory_budget, weights_per_gpu
from infersim.modules.step import build_stage_plan
from infersim.cli.report import to_json_data, to_text
from infersim.run.simulate import simulate
from infersim.costing.weight_offload import LAYER_WEIGHTS, ROUTED_EXPERTS, offload_cost

GB = 1e9
MS = 1e-3

# H20 with 25 GB of HBM and 8 requests per GPU (4.8 GB of KV): the 17.58 GB of weights overflow by ~1.5 GB
SMALL_HBM = ["--set", "hardware.peak.hbm_bytes=25e9", "--set", "workload.decode_batch_per_gpu=8",
             "--set", "deployment.weight_offload=auto"]


@pytest.fixture(scope="module")
def gb200():
    return load_hardware_card("gb200")[0]


def link_rate(hw) -> float:
    return hw.peak.pcie_bandwidth * hw.derates.pcie_efficiency


# -- the transfer schedule, by hand ------------------------------------------------------------


def test_gb200_host_link_rate_comes_from_the_card(gb200):
    # hardware/gb200.yaml: NVLink-C2C 225e9 B/s per GPU per direction, pcie_efficiency 0.8
    assert link_rate(gb200) == pytest.approx(180e9)


def test_per_layer_transfer_is_bytes_over_bandwidth_times_efficiency(gb200):
    # 0.18 GB per layer at 180 GB/s = 1 ms per layer; 4 layers: the link is busy 4 ms
    cost = offload_cost([(2 * MS, 0.18 * GB, 4)], link_rate(gb200))
    assert cost.transfer_s == pytest.approx(4 * MS)
    assert cost.bytes == pytest.approx(0.72 * GB)
    assert cost.layers == 4


def test_transfer_dominates_each_layer_costs_its_transfer(gb200):
    # transfer 1 ms, compute 0.5 ms, 4 layers: the link never idles (4 x 1 ms), the last layer's
    # compute follows its transfer (+0.5 ms): 4.5 ms against 2 ms of compute, 2.5 ms exposed
    cost = offload_cost([(0.5 * MS, 0.18 * GB, 4)], link_rate(gb200))
    assert cost.exposed_s == pytest.approx(2.5 * MS)


def test_compute_hides_every_transfer_but_the_first(gb200):
    # transfer 1 ms, compute 2 ms: only the first layer's fetch waits; 1 + 4 x 2 = 9 ms, 1 ms exposed
    cost = offload_cost([(2 * MS, 0.18 * GB, 4)], link_rate(gb200))
    assert cost.exposed_s == pytest.approx(1 * MS)


def test_resident_layers_hide_the_first_offloaded_layers_prefetch(gb200):
    # a dense layer of 2 ms (nothing offloaded) before MoE layers: their first fetch (1 ms) runs
    # under it, so nothing is exposed (DeepSeek-V3's first three layers are dense)
    cost = offload_cost([(2 * MS, 0.0, 1), (2 * MS, 0.18 * GB, 4)], link_rate(gb200))
    assert cost.exposed_s == pytest.approx(0.0, abs=1e-12)
    assert cost.layers == 4


# -- the stage engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_plan():
    model = load_model_card("qwen3-8b")[0]
    dep = Deployment(num_gpus=1)
    return build_stage_plan("prefill", model, dep, Workload(isl=2048, osl=1), 2048, 0)


def _layer_seconds(result) -> float:
    """One layer's kernel time of a single-group plan."""
    return sum(op.time_per_layer_s for op in result.operations if op.group not in ("per step", "offloaded layers"))


@pytest.mark.parametrize("ratio, exposed_layers", [(2.0, None), (0.5, 0)])
def test_stage_step_is_the_max_composition_per_layer(gb200, dense_plan, ratio, exposed_layers):
    """transfer = ratio x a layer's compute; engine without a card, so no software overhead."""
    base = run_stage(dense_plan, gb200, NoTables())
    compute = _layer_seconds(base)
    n = dense_plan.num_layers
    per_layer = ratio * compute * link_rate(gb200)
    offloaded = run_stage(replace(dense_plan, offload_bytes_per_layer=(per_layer,)), gb200, NoTables())
    transfer = ratio * compute
    if ratio > 1:  # the link sets the pace: n transfers then the last layer's compute
        expected = n * transfer + compute - n * compute
    else:  # compute hides all but the first transfer
        expected = transfer
    assert offloaded.step_time_s - base.step_time_s == pytest.approx(expected, rel=1e-9)
    line = [op for op in offloaded.operations if op.module == "weight_offload"]
    assert len(line) == 1 and line[0].bound.value == "host link" and line[0].source.value == "roofline"
    assert line[0].time_s == pytest.approx(expected, rel=1e-9)
    assert line[0].bytes == pytest.approx(n * per_layer)


@settings(max_examples=25, deadline=None)
@given(slower=st.floats(0.05, 1.0), factor=st.floats(1.0, 20.0), scale=st.floats(0.01, 5.0))
def test_faster_link_never_slows_and_more_bytes_never_speed(gb200, dense_plan, slower, factor, scale):
    per_layer = scale * GB / dense_plan.num_layers
    plan = replace(dense_plan, offload_bytes_per_layer=(per_layer,))
    slow_hw = replace(gb200, peak=replace(gb200.peak, pcie_bandwidth=gb200.peak.pcie_bandwidth * slower))
    slow = run_stage(plan, slow_hw, NoTables()).step_time_s
    fast = run_stage(plan, gb200, NoTables()).step_time_s
    assert fast <= slow * (1 + 1e-12)
    more = run_stage(replace(plan, offload_bytes_per_layer=(per_layer * factor,)), gb200, NoTables()).step_time_s
    assert more >= fast * (1 - 1e-12)


@settings(max_examples=50, deadline=None)
@given(layers=st.lists(st.tuples(st.floats(0, 1e-2), st.floats(0, 1e9), st.integers(1, 8)), min_size=1, max_size=4),
       rate=st.floats(1e9, 1e12), faster=st.floats(1.0, 10.0), more=st.floats(1.0, 10.0))
def test_offload_cost_is_monotone(layers, rate, faster, more):
    base = offload_cost(layers, rate).exposed_s
    assert offload_cost(layers, rate * faster).exposed_s <= base * (1 + 1e-9) + 1e-15
    bigger = [(c, b * more, n) for c, b, n in layers]
    assert offload_cost(bigger, rate).exposed_s >= base * (1 - 1e-9) - 1e-15


# -- memory: how much is offloaded ----------------------------------------------------------------


def test_offloaded_bytes_are_the_shortfall_for_a_dense_model(gb200):
    """HBM set so that weights exceed what is left beside the activations and one request's KV by
    exactly 2 GB (no engine card: the reserve is the activations alone)."""
    model = load_model_card("qwen3-8b")[0]
    dep = Deployment(num_gpus=1, weight_offload="auto")
    work = Workload(isl=1024, osl=1024, decode_batch_per_gpu=3)
    weights = weights_per_gpu(model, dep)
    need = 3 * 2048 * kv_bytes_per_token(model, "bf16")
    hbm = weights + activation_bytes(model, dep, 1024) + need - 2 * GB
    hw = replace(gb200, peak=replace(gb200.peak, hbm_bytes=hbm))
    mem = memory_budget(model, hw, dep, work, offload=True)
    off = mem.weight_offload
    assert off is not None and off.pool == LAYER_WEIGHTS
    assert off.bytes_per_gpu == pytest.approx(2 * GB, rel=1e-9)  # plus the one-byte rounding margin
    assert mem.resident_weights_bytes == pytest.approx(weights - 2 * GB, rel=1e-9)
    assert mem.kv_capacity_bytes == pytest.approx(need, abs=2.0) and mem.kv_capacity_bytes >= need
    assert mem.max_batch_per_gpu == 3 and mem.fits
    # one kind of layer: every layer streams the same share
    assert off.bytes_per_layer[0] * model.num_hidden_layers == pytest.approx(2 * GB, rel=1e-9)
    assert off.link_bytes_per_s == pytest.approx(180e9)
    # without offload (or with the flag off) the same HBM does not hold the weights and the KV
    plain = memory_budget(model, hw, replace(dep, weight_offload="none"), work, offload=True)
    assert plain.weight_offload is None and plain.max_batch_per_gpu < 3
    assert memory_budget(model, hw, dep, work, offload=False) == plain


def test_moe_model_offloads_an_equal_share_of_every_moe_layers_routed_experts():
    config = load_run_config("qwen3-30b.yaml", [a for a in SMALL_HBM if a != "--set"])
    mem = simulate(config).memory
    off = mem.weight_offload
    assert off is not None and off.pool == ROUTED_EXPERTS and 0 < off.fraction < 1
    assert len(set(off.bytes_per_layer)) == 1  # Qwen3-30B-A3B: every layer is MoE
    assert sum(off.bytes_per_layer) * config.model.num_hidden_layers == pytest.approx(off.bytes_per_gpu, rel=1e-9)


# -- runs: none unchanged, auto reported, clear refusals -------------------------------------------


def test_none_is_identical_to_a_config_without_the_field():
    plain = simulate(load_run_config("qwen3-30b.yaml"))
    explicit = simulate(load_run_config("qwen3-30b.yaml", ["deployment.weight_offload=none"]))
    assert to_text(explicit, detail=True) == to_text(plain, detail=True)
    assert json.dumps(to_json_data(explicit)) == json.dumps(to_json_data(plain))
    assert "weight_offload" not in json.dumps(to_json_data(plain))


def test_auto_with_nothing_to_offload_keeps_the_times():
    plain = simulate(load_run_config("qwen3-30b.yaml"))
    auto = simulate(load_run_config("qwen3-30b.yaml", ["deployment.weight_offload=auto"]))
    assert auto.memory.weight_offload is None
    assert auto.prefill.step_time_s == plain.prefill.step_time_s and auto.decode.step_time_s == plain.decode.step_time_s
    assert "nothing offloaded" in to_text(auto)




def test_cli_run_shows_the_offload_line_and_memory(capsys):
    assert main(["--config", "qwen3-30b.yaml", *SMALL_HBM]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("weight_offload ")]
    assert len(rows) == 2  # prefill and decode module tables
    assert all("host" in row and "link" in row for row in rows)
    assert "weight offload auto:" in out and "GB per GPU in host memory" in out and "GB/s (pcie_bandwidth" in out
    assert "DOES NOT FIT" not in out


def test_cli_json_has_the_offload_operation_and_memory(capsys):
    assert main(["--config", "qwen3-30b.yaml", *SMALL_HBM, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    off = data["memory"]["weight_offload"]
    assert off["offloaded_gb"] > 0 and off["host_link_gb_per_s"] > 0 and data["fits"]
    assert data["deployment"]["weight_offload"] == "auto"
    for stage in ("prefill", "decode"):
        ops = [m for m in data[stage]["modules"] if m["module"] == "weight_offload"]
        assert len(ops) == 1 and ops[0]["bound"] == "host link" and ops[0]["bytes"] == pytest.approx(off["offloaded_gb"] * GB)


def test_without_offload_the_same_run_does_not_fit(capsys):
    assert main(["--config", "qwen3-30b.yaml", *SMALL_HBM[:4]]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_host_memory_too_small_is_a_clear_does_not_fit(capsys):
    code = main(["--config", "qwen3-30b.yaml", *SMALL_HBM, "--set", "hardware.host_memory_bytes=1e9"])
    captured = capsys.readouterr()
    assert code == 1
    assert "host memory" in captured.out and "host_memory_bytes" in captured.out
    assert "Traceback" not in captured.out + captured.err


def test_pool_too_small_is_a_clear_does_not_fit(capsys):
    # 20 GB of HBM: the sglang reserve and the non-expert weights leave no room even with every
    # routed expert on the host
    code = main(["--config", "qwen3-30b.yaml", "--set", "hardware.peak.hbm_bytes=20e9",
                 "--set", "deployment.weight_offload=auto", "--set", "workload.decode_batch_per_gpu=100"])
    captured = capsys.readouterr()
    assert code == 1 and "routed-expert weights in host memory" in captured.out
    assert "Traceback" not in captured.out + captured.err


def test_bad_value_names_field_and_value(capsys):
    assert main(["--config", "qwen3-30b.yaml", "--set", "deployment.weight_offload=all"]) == 2
    err = capsys.readouterr().err
    assert "deployment.weight_offload" in err and "'all'" in err and "none, auto" in err


def test_speculative_decoding_with_offload_is_refused(capsys):
    assert main(["--config", "qwen3-8b-speculative.yaml", "--set", "deployment.weight_offload=auto"]) == 2
    err = capsys.readouterr().err
    assert "deployment.weight_offload" in err and "speculative" in err


def test_cli_end_to_end_subprocess():
    """The documented command line, in a fresh interpreter (no traceback, offload line printed)."""
    proc = subprocess.run([sys.executable, "-m", "infersim", "--config", "qwen3-30b.yaml", *SMALL_HBM],
                          cwd=REPO_ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(REPO_ROOT), "INFERSIM_CACHE_DIR": TEST_CACHE_DIR},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "weight_offload" in proc.stdout and "host link" in proc.stdout and "Traceback" not in proc.stderr


def test_gb200_lowprec_prefill_point_fits_with_offload(capsys):
    public_reference("validation.yaml")
    assert main(["validate", "--point", "sgl-gb200-prefill-p2-lowprec"]) == 0
    out = capsys.readouterr().out
    assert "sgl-gb200-prefill-p2-lowprec" in out and "does not fit" not in out


def test_generate_subcommand_refuses_the_stage_engines_offload(tmp_path, capsys):
    import yaml

    from test_generate_metrics import mapping

    path = tmp_path / "tiny-generate.yaml"
    path.write_text(yaml.safe_dump(mapping(batch=4, prompt_len=32, gen_len=8)))
    assert main(["generate", "--config", str(path), "--set", "deployment.weight_offload=auto"]) == 2
    err = capsys.readouterr().err
    assert "deployment.weight_offload" in err and "generate.offload" in err
