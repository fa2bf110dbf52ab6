"""generate's offload flags that contradict each other, and pareto --all without a file to shape,
are refused in one line rather than ignored."""

from __future__ import annotations

import json

import pytest
from test_hostile_cli import one_line_error, run

GENERATE = ("generate", "--config", "benchmarks/offload/opt-30b.yaml", "--batch", "2", "--prompt-len", "8",
            "--gen-len", "2")


@pytest.mark.parametrize("offload, offloaded", [(None, "nothing"), ("none", "nothing"),
                                                ("kv", "only the KV cache")])
@pytest.mark.parametrize("device", ["nvme", "cpu"])
def test_offload_device_without_offloaded_weights_is_refused(capsys, offload, offloaded, device) -> None:
    """benchmarks/offload/opt-30b.yaml offloads weights itself: --offload decides here."""
    argv = [*GENERATE, "--offload-device", device] + (["--offload", offload] if offload else [])
    if offload is None:
        argv += ["--set", "generate.offload=none"]
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out
    one_line_error(err, f"--offload-device {device}", "says where offloaded weights live",
                   f"the run offloads {offloaded}", "add weights to --offload")


def test_offload_device_with_offloaded_weights_runs(capsys) -> None:
    code, out, err = run(capsys, *GENERATE, "--offload", "weights,kv", "--offload-device", "nvme", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["offload"]["weights_device"] == "nvme"


@pytest.mark.parametrize("value", ["none,kv", "weights,none", "none,weights,kv"])
def test_none_listed_with_offload_targets_is_refused(capsys, value) -> None:
    code, _out, err = run(capsys, *GENERATE, "--offload", value)
    assert code == 2
    one_line_error(err, "field 'generate.offload'", "'none' (everything on the GPU) listed with what to offload")


def test_none_in_a_set_override_listed_with_a_target_is_refused(capsys) -> None:
    code, _out, err = run(capsys, *GENERATE, "--set", "generate.offload=[none, weights]")
    assert code == 2
    one_line_error(err, "field 'generate.offload'", "['none', 'weights']")


def test_none_alone_offloads_nothing(capsys) -> None:
    code, out, err = run(capsys, *GENERATE, "--offload", "none", "--weights", "int4", "--format", "json")
    assert code == 0, err
    offload = json.loads(out)["offload"]
    assert offload["weights"] is False and offload["kv"] is False and offload["weights_device"] is None


# -- pareto --all


def test_pareto_all_without_out_is_refused_before_the_search(capsys) -> None:
    code, out, err = run(capsys, "pareto", "--config", "qwen3-30b.yaml", "--gpus", "4", "--all")
    assert code == 2 and not out
    one_line_error(err, "--all", "no --out is given", "add --out FILE.csv")


def test_pareto_all_with_out_writes_every_feasible_point(capsys, tmp_path) -> None:
    files = {}
    for name, extra in (("front", ()), ("all", ("--all",))):
        files[name] = tmp_path / f"{name}.json"
        code, _out, err = run(capsys, "pareto", "--config", "qwen3-30b.yaml", "--gpus", "4", "--batch", "16..128",
                              "--workers", "1", "--out", str(files[name]), *extra)
        assert code == 0, err
    front = json.loads(files["front"].read_text())["rows"]
    every = json.loads(files["all"].read_text())["rows"]
    assert len(every) > len(front) and all(r["on_frontier"] for r in front)
    assert sorted(r["tpot_ms"] for r in every if r["on_frontier"]) == sorted(r["tpot_ms"] for r in front)


def test_a_file_naming_nvme_without_weights_offloaded_says_it_is_not_used() -> None:
    from test_generate_metrics import TINY, generate, gpu, mapping

    hardware = gpu(flops=100e12, hbm_bandwidth=1e12, peak__hbm_bytes=80e9, host_memory_bytes=1e12, nvme_bandwidth=5e9)
    common = dict(model=TINY, hardware=hardware, batch=2, prompt_len=8, gen_len=2)
    kv_only = generate(mapping(**common, offload="kv", offload_device="nvme"))
    assert "offload_device nvme not used: no weights are offloaded (the KV cache is offloaded to CPU memory)" \
        in kv_only.notes
    weights = generate(mapping(**common, offload="weights", offload_device="nvme"))
    assert not any("offload_device" in note for note in weights.notes)
