"""`infersim calibrate --trace`: kernel-family time scales fitted from a profiler trace's module times,
attributed as `compare --trace` attributes them.

The synthetic trace is the simulator's own prediction of a Llama-3.1-8B TP2 prefill and decode step,
laid out as SGLang launches those kernels (tracegen.synthetic's kernel names), with every kernel's
time multiplied by a known scale of its family: the fit must find those scales again.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_helpers import error_of, run_json
from conftest import shared_reference
from test_calibrate import cli
from tracegen.synthetic import (ACT, ALL_REDUCE, ATTN_FA3, EMBEDDING, FUSED_ADD_RMSNORM, NVJET_LM_HEAD, NVJET_MLP,
                                NVJET_O, NVJET_QKV, RMSNORM, ROPE, KernelSpec, TraceBuilder, metadata_events,
                                write_trace)

from infersim.calibrate.run import calibrate
from infersim.cards.calibration import CONSTANT_BY_NAME, with_constants
from infersim.run.config import load_run_config
from infersim.run.simulate import simulate

# priced on the roofline (no kernel tables to load): the family scales multiply either alike
RUN = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "sglang", "mfu_tables": "none",
       "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}},
       "workload": {"isl": 1024, "osl": 128, "prefill_tokens_per_gpu": 2048, "decode_batch_per_gpu": 32}}
FAMILIES = ("gemm_time_scale", "attention_time_scale", "memory_time_scale", "collective_time_scale")
TRUTH = {"gemm_time_scale": 1.3, "attention_time_scale": 0.8, "memory_time_scale": 1.5, "collective_time_scale": 1.2}

# the simulator's operations of a dense layer, in launch order, as SGLang names their kernels
LAYER_KERNELS = (("input_norm", RMSNORM), ("qkv_proj", NVJET_QKV), ("rope_kv_store", ROPE), ("attn_core", ATTN_FA3),
                 ("o_proj", NVJET_O), ("attn_all_reduce", ALL_REDUCE), ("post_attn_norm", FUSED_ADD_RMSNORM),
                 ("ffn_up_proj", NVJET_MLP), ("ffn_activation", ACT), ("ffn_down_proj", NVJET_MLP),
                 ("ffn_all_reduce", ALL_REDUCE))
STEP_KERNELS = (("final_norm", FUSED_ADD_RMSNORM), ("lm_head", NVJET_LM_HEAD))


def _families(config: object) -> dict[str, str]:
    """Each operation's kernel family: the scale that doubles its time when doubled."""
    base = simulate(config)
    out: dict[str, str] = {}
    for family in FAMILIES:
        hw, eng = with_constants(config.hardware, config.engine, {family: 2.0})  # type: ignore[attr-defined]
        moved = simulate(replace(config, hardware=hw, engine=eng))  # type: ignore[type-var]
        for op, op2 in zip(base.prefill.operations, moved.prefill.operations):
            if op2.time_s == pytest.approx(2 * op.time_s, rel=1e-6):
                out[op.name] = family
    return out


def synthetic_trace(tmp_path: Path, truth: dict[str, float]) -> tuple[Path, Path]:
    """(trace, run config): one prefill and one decode step of RUN, every kernel at its family's
    scale in `truth` times the simulator's time for it."""
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(RUN))
    config = load_run_config(str(config_path))
    families = _families(config)
    result = simulate(config)
    b = TraceBuilder()
    for stage, label in ((result.prefill, "step[EXTEND bs=2 toks=2048]"), (result.decode, "step[DECODE bs=32]")):
        ops = {op.name: op for op in stage.operations}

        def spec(name: str, kernel: str, per_layer: bool = True) -> KernelSpec:
            op = ops[name]  # noqa: B023 - used at once, in this iteration
            seconds = op.time_per_layer_s if per_layer else op.time_s
            return KernelSpec(kernel, seconds * 1e6 * truth.get(families.get(name, ""), 1.0))

        start = b.cpu_us
        b.eager([spec("embedding", EMBEDDING, False)]
                + [spec(name, kernel) for _ in range(stage.num_layers) for name, kernel in LAYER_KERNELS]
                + [spec(name, kernel, False) for name, kernel in STEP_KERNELS])
        b.annotation(label, start, b.cpu_us + 1.0)
        b.idle(100.0)
    trace = write_trace(tmp_path / "run-TP-0.trace.json.gz", metadata_events() + b.drain())
    return trace, config_path


def test_a_trace_at_known_family_scales_gives_them_back_within_their_uncertainty(tmp_path: Path) -> None:
    trace, config = synthetic_trace(tmp_path, TRUTH)
    outcome = calibrate([], traces=[trace], config=str(config), constants=list(FAMILIES))
    fitted = {f.constant.name: f for f in outcome.result.fitted}
    assert set(fitted) == set(TRUTH), outcome.result.refused
    for name, value in TRUTH.items():
        f = fitted[name]
        assert abs(f.value - value) <= 2 * f.sd, (name, f.value, f.sd)
        assert f.sd < 0.5 * CONSTANT_BY_NAME[name].prior_sd * value  # the trace, not the prior, decides
    errors = outcome.profile["errors"]["kernel_ms"]
    # prefill and decode: embedding, attention core, projections, all-reduce, FFN, norms, LM head
    assert errors["points"] == 14
    assert errors["median_abs_before"] > 0.15  # the cards' times against the scaled trace
    assert errors["median_abs_after"] < 0.05 and errors["median_abs_held_out"] < errors["median_abs_before"]


def test_calibrate_trace_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = {"gemm_time_scale": 0.75}
    trace, config = synthetic_trace(tmp_path, truth)
    out = tmp_path / "profile.yaml"
    printed = run_json(capsys, "calibrate", "--trace", str(trace), "--config", str(config),
                       "--constants", "gemm_time_scale", "--out", str(out))
    gemm = printed["constants"]["gemm_time_scale"]
    assert abs(gemm["value"] - 0.75) <= 2 * gemm["uncertainty"] and gemm["uncertainty"] < 0.05
    assert printed["applies_to"] == {"hardware": "h100-sxm", "engine": "sglang",
                                     "engine_version": load_run_config(str(config)).engine.version}
    assert printed["provenance"]["reference"] == [str(trace)]
    assert {p["metric"] for p in printed["points"]} == {"kernel_ms"}
    assert yaml.safe_load(out.read_text())["constants"]["gemm_time_scale"]["value"] == gemm["value"]
    # the one subprocess: `python -m infersim` itself, text output
    text = cli("calibrate", "--trace", str(trace), "--config", str(config), "--constants", "gemm_time_scale")
    assert text.returncode == 0, text.stderr
    assert "kernel_ms" in text.stdout and "gemm_time_scale" in text.stdout
    assert "--config" in error_of(capsys, "calibrate", "--trace", str(trace))
    assert math.isfinite(printed["errors"]["kernel_ms"]["median_abs_held_out"])


@pytest.mark.slow  # reads a 3 MB trace and prices DeepSeek-V3 on H800 kernel tables; the synthetic traces cover the code
def test_the_published_deepseek_trace_fits_what_its_modules_determine(tmp_path: Path) -> None:
    """DeepSeek's EP64 H800 trace (forward of four MoE layers) against an EP64 prefill of 4096 tokens per GPU."""
    trace = shared_reference("traces", "deepseek-v3-train-ep64-h800.json")
    config = tmp_path / "ds.yaml"
    config.write_text(yaml.safe_dump({
        "model": "deepseek-v3", "hardware": "h800", "engine": "sglang",
        "deployment": {"num_gpus": 64, "num_nodes": 8, "attention": {"tp": 1, "dp": 64}, "ffn": {"tp": 1, "ep": 64},
                       "precision": {"gemm": "fp8", "kv_cache": "fp8"}, "moe_comm": "deepep-normal"},
        "workload": {"isl": 4096, "osl": 1, "prefill_tokens_per_gpu": 4096, "decode_batch_per_gpu": 1}}))
    outcome = calibrate([], traces=[trace], config=str(config), constants=list(FAMILIES))
    points = outcome.profile["errors"]["kernel_ms"]["points"]
    assert points >= 6  # attention core and projections, router, experts, shared expert, dispatch, combine, norms
    assert 1 <= len(outcome.result.fitted) <= points // 3
    errors = outcome.profile["errors"]["kernel_ms"]
    assert errors["median_abs_held_out"] < errors["median_abs_before"]
    # modules one side has and the other has not are listed, not fitted
    assert any("not fitted" in why for why in outcome.skipped)
