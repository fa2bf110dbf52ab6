"""A sweep says what its command line does not: a field the grid varies given again by a flag or
--set is refused (it would not be used), a hardware axis times every point on the roofline with a
note, and a layout search names the MoE path its expert-TP layouts take."""

from __future__ import annotations

import pytest
from test_hostile_cli import one_line_error, run

SWEEP = ("sweep", "--workers", "1")


@pytest.mark.parametrize("given, axis", [
    (("--isl", "300"), "workload.isl=100,200"),
    (("--set", "workload.isl=300"), "workload.isl=100,200"),
    (("--tp", "2"), "deployment.attention.tp=1,2"),
    (("--set", "deployment.attention={tp: 2}"), "deployment.attention.tp=1,2"),
    (("--osl", "8"), "workload.osl=16,32"),
])
def test_a_field_on_the_grid_and_given_again_is_refused(capsys, given, axis) -> None:
    code, out, err = run(capsys, *SWEEP, "--config", "qwen3-30b.yaml", *given, "--grid", axis)
    assert code == 2 and not out
    field = axis.split("=")[0]
    one_line_error(err, f"and --grid {field}=...", f"the grid sets {field} at every point", "give the values once")


def test_a_card_and_the_fields_inside_it_go_together(capsys) -> None:
    code, out, err = run(capsys, *SWEEP, "--model", "qwen3-8b", "--hardware", "h100", "--grid",
                         "model.num_key_value_heads=2,4", "--grid", "workload.decode_batch_per_gpu=8")
    assert code == 0 and "error" not in err
    code, _out, err = run(capsys, *SWEEP, "--model", "qwen3-8b", "--hardware", "h100", "--grid", "hardware=h200")
    assert code == 2
    one_line_error(err, "--hardware h100 and --grid hardware=...")


def test_a_hardware_axis_says_it_times_on_the_roofline(capsys) -> None:
    code, out, err = run(capsys, *SWEEP, "--model", "qwen3-8b", "--hardware", "h100,h200", "--grid",
                         "workload.decode_batch_per_gpu=8")
    assert code == 0
    assert "note: --grid hardware: every point is timed on the roofline, without measured kernel tables" in err
    assert "aiconfigurator/h100-sxm/sglang-0.5.14 for h100-sxm" in err
    code, out, err = run(capsys, *SWEEP, "--model", "qwen3-8b", "--hardware", "h100", "--grid",
                         "workload.decode_batch_per_gpu=8,16")
    assert code == 0 and "roofline" not in err  # one device: its tables, nothing to say


def test_a_layout_search_names_the_moe_path_of_expert_tp(capsys) -> None:
    code, _out, err = run(capsys, "pareto", "--config", "qwen3-30b.yaml", "--set", "deployment.moe_comm=deepep-low-latency",
                          "--gpus", "1..2", "--workers", "1")
    assert code == 0
    assert ("note: layout search: layouts with expert TP (FFN TP > 1) run moe_comm all-gather (tokens gathered onto "
            "every shard), the others the config's deepep-low-latency") in err


def test_a_card_the_grid_cannot_load_is_refused_before_the_run(capsys) -> None:
    code, out, err = run(capsys, *SWEEP, "--config", "qwen3-30b.yaml", "--grid", "hardware=h20,nonexist")
    assert code == 2 and not out
    one_line_error(err, "--grid hardware=nonexist: hardware 'nonexist' not found")


def test_a_batch_above_the_default_running_cap_fits_where_the_kv_cache_holds_it(capsys, tmp_path) -> None:
    """As the main run: SGLang's default cap for qwen3-30b on four H20s at 64 + 64 tokens is 4,096
    requests per GPU, the KV cache holds 5,740: 5,000 fits (a launch raises the cap), 6,000 does not."""
    import json

    out_file = tmp_path / "cap.json"
    code, out, err = run(capsys, *SWEEP, "--config", "qwen3-30b.yaml", "--isl", "64", "--osl", "64", "--grid",
                         "workload.decode_batch_per_gpu=4000,5000,6000", "--out", str(out_file))
    assert code == 0
    rows = {r["workload.decode_batch_per_gpu"]: r for r in json.loads(out_file.read_text())["rows"]}
    assert [(rows[b]["fits"], rows[b]["max_batch_per_gpu"], rows[b]["default_running_cap_per_gpu"])
            for b in (4000, 5000, 6000)] == [(True, 5740, 4096), (True, 5740, 4096), (False, 5740, 4096)]
    assert ("note: 2 configurations run a decode batch above sglang's default running-request cap (4,096 per GPU): "
            "they fit where the KV cache holds the batch, and a server runs them only with a larger cap "
            "(--max-running-requests; --emit-launch sets it)") in err
    assert "no (max 5740)" in out and "KV capacity" in out
    # the largest batch the run itself allows ("max") stays at the engine's default cap
    code, out, err = run(capsys, *SWEEP, "--config", "qwen3-30b.yaml", "--isl", "64", "--osl", "64", "--grid",
                         "workload.decode_batch_per_gpu=max")
    assert code == 0 and " 4096 " in out and "above sglang's default" not in err


def test_a_tpot_that_falls_as_the_batch_grows_is_explained(capsys) -> None:
    """vLLM's H100 GEMM table times ffn_up_proj of Qwen3-8B at 40 rows (batch 33, padded to the
    captured size 40) faster than at 32: the note names the operation, its two times and sources."""
    code, out, err = run(capsys, *SWEEP, "--model", "qwen3-8b", "--hardware", "h100", "--engine", "vllm",
                         "--grid", "workload.decode_batch_per_gpu=31,32,33")
    assert code == 0
    assert ("note: TPOT falls as the batch grows at 1 place (on one layout, from one batch to the next); the "
            "largest: 11.02 ms at batch 32, 10.67 ms at 33, mostly ffn_up_proj (dense layers): 2.934 ms per step "
            "at batch 32, interpolated from vllm-0.24.0/gemm_bf16.csv.gz; 2.538 ms at batch 33 (computed as 40, a "
            "captured CUDA-graph size), interpolated from vllm-0.24.0/gemm_bf16.csv.gz (measured times need not "
            "grow with the size") in err  # 1 place: 31 -> 32 rises
