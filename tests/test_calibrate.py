"""`infersim calibrate`: constants fitted to measured runs, refused when the data do not determine
them, written as a profile that every command and the Python API apply the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any
from pathlib import Path

import pytest
import yaml
from cli_helpers import error_of, run_json
from conftest import REPO_ROOT, TEST_CACHE_DIR, shared_reference

from infersim.base.errors import InferSimError
from infersim.calibrate.fit import FitSettings, Observation, fit_constants
from infersim.calibrate.run import Calibration, calibrate, median_abs, relative_errors
from infersim.cli.main import main
from infersim.cards.calibration import (
    CONSTANT_BY_NAME,
    CONSTANTS,
    load_profile,
    profile_from_mapping,
)

EXAMPLE = REPO_ROOT / "infersim" / "calibrate" / "examples" / "vllm-h100-runs.yaml"
GEMM_PROFILE = REPO_ROOT / "tests" / "data" / "h100-vllm-gemm-profile.yaml"  # hand-written: GEMMs 0.95, attention 1.04
ENV = {"INFERSIM_CACHE_DIR": TEST_CACHE_DIR, "PATH": ""}  # the session's table cache: a cold index costs ~5 s a run


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infersim", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=ENV, check=False)


# -- the fit on a known model -----------------------------------------------------------------------


def _toy(gemm: float, lag: float, k: int) -> dict[tuple[str, str], float]:
    """A serving run k whose TTFT is a prefill of k ms scaled by the GEMM time plus the API-server
    time, and whose ITL scales with the GEMM time only."""
    prefill, step = 10.0 * (k + 1), 5.0 + k
    return {("stage_0", "ttft_mean_ms"): prefill * gemm + lag * 1e3, ("stage_0", "itl_mean_ms"): step * gemm}


def test_a_known_pair_of_constants_is_recovered_and_an_idle_one_refused() -> None:
    names = ("gemm_time_scale", "api_server_latency", "step_cpu")
    constants = [CONSTANT_BY_NAME[n] for n in names]
    truth = {"gemm_time_scale": 1.3, "api_server_latency": 6e-3}
    observations = [Observation(k, stage, metric, value)
                    for k in range(4) for (stage, metric), value in _toy(truth["gemm_time_scale"],
                                                                          truth["api_server_latency"], k).items()]
    priors = {"gemm_time_scale": 1.0, "api_server_latency": 0.0, "step_cpu": 1e-3}
    result = fit_constants(constants, priors, observations,
                           lambda values, k: _toy(values["gemm_time_scale"], values["api_server_latency"], k),
                           FitSettings(iterations=4))
    fitted = {f.constant.name: f for f in result.fitted}
    assert set(fitted) == {"gemm_time_scale", "api_server_latency"}
    for name, value in truth.items():
        assert abs(fitted[name].value - value) <= 2 * fitted[name].sd, (name, fitted[name])
        assert fitted[name].shrink < 0.5
    assert [(c.name, "no measured metric" in why) for c, why in result.refused] == [("step_cpu", True)]
    assert median_abs(relative_errors(result, result.after)["ttft_mean_ms"]) < 0.05  # the prior pulls a little
    assert median_abs(relative_errors(result, result.before)["ttft_mean_ms"]) > 0.2
    assert result.held_out is not None and len(result.held_out) == len(observations)


def test_a_fit_the_linearisation_keeps_but_the_simulation_finds_worse_held_out_is_refused() -> None:
    """A GEMM scale whose every move away from the card slows the runs (a V: the forward difference
    sees a slope of +1, the runs do not have one): the data determine it and the linearised gate
    keeps it, but each run simulated with the fit on the others is predicted slower than on the
    cards, so the constant is refused and the cards stand."""
    def predict(values: Mapping[str, float], k: int) -> dict[tuple[str, str], float]:
        scale = values["gemm_time_scale"]
        return {("stage_0", "itl_mean_ms"): (5.0 + k) * (scale if scale >= 1.0 else 2.0 - scale)}

    observations = [Observation(k, "stage_0", "itl_mean_ms", (5.0 + k) * 0.9) for k in range(4)]
    result = fit_constants([CONSTANT_BY_NAME["gemm_time_scale"]], {"gemm_time_scale": 1.0}, observations, predict)
    assert not result.fitted
    [(constant, why)] = result.refused
    assert constant.name == "gemm_time_scale"
    assert why.startswith("held out (each experiment simulated with a fit without it), a fit with it predicts "
                          "worse than the cards: itl_mean_ms")
    assert result.held_out == result.after == result.before


def test_with_one_run_of_three_points_at_most_one_constant_is_fitted_and_the_rest_refused_by_name() -> None:
    constants = [CONSTANT_BY_NAME[n] for n in ("gemm_time_scale", "api_server_latency")]
    observations = [Observation(0, s, m, v) for (s, m), v in _toy(1.3, 6e-3, 0).items()]
    observations.append(Observation(0, "stage_0", "e2e_mean_ms", 1000.0))

    def predict(values: dict, k: int) -> dict:
        out = _toy(values["gemm_time_scale"], values["api_server_latency"], k)
        return {**out, ("stage_0", "e2e_mean_ms"): 900.0 * values["gemm_time_scale"]}

    result = fit_constants(constants, {"gemm_time_scale": 1.0, "api_server_latency": 0.0}, observations, predict)
    assert len(result.fitted) <= 1
    refused = {c.name: why for c, why in result.refused}
    assert len(refused) >= 1
    assert any("more constants than the data determine" in why or "narrow its prior" in why for why in refused.values())
    assert result.held_out is None  # one experiment: nothing to hold out


# -- the simulator: synthetic runs at known constants -----------------------------------------------


def _synthetic_reference(tmp_path: Path, truth: dict[str, float], max_stage_s: float) -> Path:
    """The example runs with their measurements replaced by the simulator's own predictions at `truth`."""
    from dataclasses import replace

    from infersim.calibrate.data import load_reference, predict_experiment, run_mapping
    from infersim.cards.calibration import with_constants
    from infersim.run.config import config_from_mapping

    data = yaml.safe_load(EXAMPLE.read_text())
    reference = load_reference([EXAMPLE], "h100-sxm", "vllm@0.15", max_stage_s)
    for raw, experiment in zip(data["experiments"], reference.experiments):
        config = config_from_mapping(run_mapping(experiment, "h100-sxm", "vllm@0.15"), "synthetic")
        hw, eng = with_constants(config.hardware, config.engine, truth)
        predicted = predict_experiment(replace(config, hardware=hw, engine=eng), experiment)
        raw["measured"] = {}
        for (stage, metric), value in predicted.items():
            raw["measured"].setdefault(stage, {})[metric] = value
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_constants_that_generated_the_runs_are_recovered_within_their_stated_uncertainty(tmp_path: Path) -> None:
    truth = {"gemm_time_scale": 1.25, "api_server_latency": 4e-3}
    path = _synthetic_reference(tmp_path, truth, 5)
    outcome = calibrate([path], "h100-sxm", "vllm@0.15", list(truth), max_stage_s=5)
    fitted = {f.constant.name: f for f in outcome.result.fitted}
    assert set(fitted) == set(truth)
    for name, value in truth.items():
        assert abs(fitted[name].value - value) <= 2 * fitted[name].sd, (name, fitted[name].value, fitted[name].sd)
    errors = outcome.profile["errors"]
    for metric in ("ttft_mean_ms", "itl_mean_ms", "e2e_mean_ms"):
        # the runs' own constants reproduce them but for the prior's pull toward the cards
        assert errors[metric]["median_abs_after"] < min(0.05, errors[metric]["median_abs_before"] / 3), errors[metric]


# -- the command line, the profile and its use ------------------------------------------------------


def test_calibrate_writes_a_profile_that_serve_run_and_the_api_apply_alike(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # the command line in this process: the kernel tables are loaded once for all its commands
    # windows of 10 s: 25 requests a stage at 2.5/s, enough for held-out TTFTs that the two constants move
    reference = _synthetic_reference(tmp_path, {"gemm_time_scale": 0.9, "api_server_latency": 3e-3}, 10)
    out = tmp_path / "h100-vllm.yaml"
    printed = run_json(capsys, "calibrate", "--reference", str(reference), "--hardware", "h100-sxm", "--engine",
                       "vllm@0.15", "--max-stage-s", "10", "--constants", "gemm_time_scale,api_server_latency,step_cpu",
                       "--out", str(out))
    profile = load_profile(out)
    assert (profile.hardware, profile.engine, profile.engine_version) == ("h100-sxm", "vllm", "0.15.1")
    assert {c.name for c in profile.constants} == set(printed["constants"]) == {"gemm_time_scale", "api_server_latency"}
    assert "step_cpu" in printed["refused"]
    assert len(printed["points"]) == 15 and printed["provenance"]["reference"] == [str(reference)]
    # runs made at those constants: the fit lowers every metric's error, in sample and held out
    for metric in ("ttft_mean_ms", "itl_mean_ms", "e2e_mean_ms"):
        e = printed["errors"][metric]
        assert e["median_abs_after"] < e["median_abs_before"] and e["median_abs_held_out"] < e["median_abs_before"], e

    serve = ["serve", "--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15", "--rate", "4",
             "--num-requests", "100", "--isl", "1000", "--osl", "100"]
    by_flag = run_json(capsys, *serve, "--calibration", str(out))
    by_set = run_json(capsys, *serve, "--set", f"calibration={out}")
    assert by_flag["mean_ttft_ms"] == by_set["mean_ttft_ms"]
    rows = {row["metric"]: row for row in by_flag["calibration"]["headline"]}
    assert rows["mean_ttft_ms"]["calibrated"] == by_flag["mean_ttft_ms"] != rows["mean_ttft_ms"]["uncalibrated"]
    low, high = profile.interval("ttft_mean_ms")[:2]
    assert rows["mean_ttft_ms"]["interval_low"] == pytest.approx(by_flag["mean_ttft_ms"] * low)
    assert rows["mean_ttft_ms"]["interval_high"] == pytest.approx(by_flag["mean_ttft_ms"] * high)

    from infersim.run.config import config_from_mapping, without_calibration
    from infersim.serve.api import simulate_serving

    config = config_from_mapping({"model": "qwen2.5-7b", "hardware": "h100-sxm", "engine": "vllm@0.15",
                                  "deployment": {"num_gpus": 1}, "workload": {"isl": 1000, "osl": 100},
                                  "calibration": str(out)}, "api")
    gemm = next(c.value for c in profile.constants if c.name == "gemm_time_scale")
    assert config.hardware.derates.kernel_time_scale.gemm == gemm
    assert config.uncalibrated[0].derates.kernel_time_scale.gemm == 1.0
    options = {"mode": "poisson", "rate": 4, "num_requests": 100, "isl": 1000, "osl": 100}
    assert simulate_serving(config, options)["mean_ttft_ms"] == by_flag["mean_ttft_ms"]
    plain = simulate_serving(without_calibration(config), options)
    assert plain["mean_ttft_ms"] == pytest.approx(rows["mean_ttft_ms"]["uncalibrated"])

    assert main(["--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15",
                 "--calibration", str(out)]) == 0
    assert "CALIBRATION" in (text := capsys.readouterr().out) and "on the cards" in text


def test_a_profile_for_another_gpu_or_a_bad_profile_is_refused_in_one_line(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    good = {"kind": "infersim-calibration",
            "applies_to": {"hardware": "h100-sxm", "engine": "vllm", "engine_version": "0.15.1"},
            "constants": {"gemm_time_scale": {"value": 1.1, "uncertainty": 0.02, "prior": 1.0}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(good))
    other = error_of(capsys, "--model", "qwen2.5-7b", "--hardware", "h200", "--engine", "vllm@0.15",
                     "--mfu-tables", "none", "--calibration", str(path))  # the refusal needs no kernel tables
    assert "fitted on h100-sxm" in other and "h200" in other
    with pytest.raises(InferSimError, match="unknown constant 'gemm_speed'"):
        profile_from_mapping({**good, "constants": {"gemm_speed": {"value": 1.0}}}, "p.yaml")
    with pytest.raises(InferSimError, match="outside the plausible range"):
        profile_from_mapping({**good, "constants": {"gemm_time_scale": {"value": 9.0}}}, "p.yaml")
    with pytest.raises(InferSimError, match="not a calibration profile"):
        profile_from_mapping({"constants": {}}, "p.yaml")
    missing = cli("calibrate", "--reference", str(tmp_path / "none.yaml"), "--hardware", "h100-sxm")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_the_kernel_time_scale_multiplies_each_family_it_names() -> None:
    from dataclasses import replace

    from infersim.costing.timing import kernel_cost
    from infersim.run.config import load_hardware_card
    from infersim.shapes.kernels import GemmShape, NoTables

    hw = load_hardware_card("h100-sxm")[0]
    shape = GemmShape(512, 4096, 4096, "bf16")
    base = kernel_cost(shape, hw, NoTables())
    scaled_hw = replace(hw, derates=replace(hw.derates, kernel_time_scale=replace(
        hw.derates.kernel_time_scale, gemm=1.5, attention=3.0)))
    assert kernel_cost(shape, scaled_hw, NoTables()).seconds == pytest.approx(base.seconds * 1.5)


def test_every_kernel_shape_has_a_time_scale_family() -> None:
    """Each shape type kernel_cost prices names the KernelTimeScale field that scales it."""
    import typing
    from dataclasses import fields

    from infersim.cards.hardware import KernelTimeScale
    from infersim.costing.timing import _SCALE_FAMILY
    from infersim.shapes.kernels import AnyShape

    families = {f.name for f in fields(KernelTimeScale)}
    assert set(_SCALE_FAMILY) == set(typing.get_args(AnyShape))
    assert set(_SCALE_FAMILY.values()) == families


# -- the trainval runs (../shared) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def trainval() -> Calibration:
    return calibrate([shared_reference("vllm_serving_trainval.yaml")], "h100-sxm", "vllm@0.15")


@pytest.mark.slow  # a full fit and its held-out gate on 13 serving runs: minutes; the toy and small fits cover the code
def test_calibrating_on_the_trainval_runs_never_predicts_a_metric_worse_held_out(trainval: Calibration) -> None:
    errors = trainval.profile["errors"]
    for metric in ("ttft_mean_ms", "itl_mean_ms", "e2e_mean_ms"):
        assert errors[metric]["points"] == 21
        assert errors[metric]["median_abs_held_out"] <= errors[metric]["median_abs_before"], (metric, errors[metric])
    refused = dict(trainval.profile["refused"])
    fitted = set(trainval.profile["constants"])
    # every constant the runs exercise is fitted, refused as undetermined, or refused held out
    assert fitted | set(refused) == {c.name for c in CONSTANTS}
    assert fitted or any("held out" in why for why in refused.values())


@pytest.mark.slow
def test_on_the_trainval_runs_no_constant_beats_the_cards_held_out(trainval: Calibration) -> None:
    """The cards (with aiconfigurator's whole rule for elementwise kernels beside its tables) predict
    mean TTFT within 8.9%, ITL within 4.6% and E2E within 4.9% (median |error|, docs/calibration.md);
    each experiment predicted by constants fitted on the other twelve does no better, so the profile
    keeps none, each refused with its reason."""
    errors = trainval.profile["errors"]
    assert {metric: errors[metric]["median_abs_before"] for metric in errors} == \
        pytest.approx({"ttft_mean_ms": 0.089, "itl_mean_ms": 0.046, "e2e_mean_ms": 0.049}, abs=0.0015)
    assert trainval.profile["constants"] == {}
    refused = dict(trainval.profile["refused"])
    assert all("held out" in refused[name] for name in ("gemm_time_scale", "attention_time_scale", "step_fixed"))


# -- benchmark results as input -------------------------------------------------------------------------


def test_benchmark_results_on_a_run_config_calibrate_and_recover_their_constants(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vllm bench serve results at three rates, their latencies simulated at known constants."""
    from dataclasses import replace

    from infersim.calibrate.data import load_bench_results, predict_experiment
    from infersim.cards.calibration import with_constants
    from infersim.run.config import load_run_config

    truth = {"gemm_time_scale": 0.8, "api_server_latency": 3e-3}
    # the config runs SGLang: the runs are that engine's (a result of another engine is refused)
    lines = [{"backend": "sglang", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "request_rate": rate,
              "burstiness": 1.0, "max_concurrency": None, "num_prompts": 60, "completed": 60,
              "total_input_tokens": 60 * 1000, "total_output_tokens": 60 * 100, "mean_ttft_ms": 1.0,
              "mean_itl_ms": 1.0, "mean_e2el_ms": 1.0} for rate in (2.0, 8.0, 16.0)]
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = load_run_config("serve-llama-8b-h100.yaml")
    hw, eng = with_constants(config.hardware, config.engine, truth)
    for line, experiment in zip(lines, load_bench_results([path], "serve-llama-8b-h100.yaml")):
        predicted = predict_experiment(replace(config, hardware=hw, engine=eng), experiment)
        for (_stage, metric), value in predicted.items():
            line[{"ttft_mean_ms": "mean_ttft_ms", "itl_mean_ms": "mean_itl_ms", "e2e_mean_ms": "mean_e2el_ms"}[metric]] = value
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    printed = run_json(capsys, "calibrate", "--bench-result", str(path), "--config", "serve-llama-8b-h100.yaml",
                       "--constants", "gemm_time_scale,api_server_latency")
    assert printed["applies_to"]["hardware"] == "h100-sxm" and len(printed["points"]) == 9
    for name, value in truth.items():
        fitted = printed["constants"][name]
        assert abs(fitted["value"] - value) <= 2 * fitted["uncertainty"], (name, fitted)


def test_the_shipped_trainval_profile_keeps_the_cards_and_their_error_interval(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The profile fitted on the 13 public vLLM 0.15 runs (docs/calibration.md) ships with the package:
    no constant beat the cards held out, so it changes no card; what it carries is the interval of
    measured / predicted over those runs."""
    from infersim.run.config import config_from_mapping

    shipped = REPO_ROOT / "infersim" / "calibrate" / "examples" / "trainval-h100-vllm.yaml"
    profile = load_profile(shipped)
    assert (profile.hardware, profile.engine, profile.engine_version) == ("h100-sxm", "vllm", "0.15.1")
    assert profile.constants == ()
    assert {metric for metric, *_ in profile.prediction_interval} == {"ttft_mean_ms", "itl_mean_ms", "e2e_mean_ms"}
    mapping = {"model": "qwen2.5-7b", "hardware": "h100-sxm", "engine": "vllm@0.15",
               "deployment": {"num_gpus": 1}, "workload": {"isl": 1000, "osl": 100}}
    calibrated = config_from_mapping({**mapping, "calibration": str(shipped)}, "api")
    plain = config_from_mapping(mapping, "api")
    assert (calibrated.hardware, calibrated.engine) == (plain.hardware, plain.engine)
    assert main(["--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15",
                 "--calibration", str(shipped)]) == 0
    text = capsys.readouterr().out
    assert f"CALIBRATION  {shipped} (no constant fitted: the cards stand)" in text and "90% interval" in text


def test_a_profile_reaches_the_cards_of_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    """A profile's GEMM scale reaches the hardware card, and a run prints the calibrated headline
    beside the cards'."""
    from infersim.run.config import config_from_mapping

    config = config_from_mapping({"model": "qwen2.5-7b", "hardware": "h100-sxm", "engine": "vllm@0.15",
                                  "deployment": {"num_gpus": 1}, "workload": {"isl": 1000, "osl": 100},
                                  "calibration": str(GEMM_PROFILE)}, "api")
    assert config.hardware.derates.kernel_time_scale.gemm == 0.95
    assert config.hardware.derates.kernel_time_scale.attention == 1.04
    assert main(["--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15",
                 "--calibration", str(GEMM_PROFILE)]) == 0
    assert "CALIBRATION" in (text := capsys.readouterr().out) and "on the cards" in text


def test_a_calibrated_sweep_shows_each_configuration_on_the_cards_beside_it(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Every row of a sweep under a profile carries the TPOT (and TTFT) of the same configuration
    simulated without it: the numbers a sweep without the profile prints."""
    sweep = ["sweep", "--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15",
             "--grid", "workload.decode_batch_per_gpu=8,64", "--prefill"]
    out = tmp_path / "calibrated.json"
    assert main([*sweep, "--calibration", str(GEMM_PROFILE), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:8] == ["decode_batch_per_gpu", "GPUs", "layout", "batch", "TPOT", "ms", "on",
                                                  "the"]
    plain = tmp_path / "plain.json"
    assert main([*sweep, "--out", str(plain)]) == 0
    capsys.readouterr()
    calibrated_rows, plain_rows = (json.loads(p.read_text())["rows"] for p in (out, plain))
    assert [r["tpot_ms_on_the_cards"] for r in calibrated_rows] == [r["tpot_ms"] for r in plain_rows]
    assert [r["ttft_ms_on_the_cards"] for r in calibrated_rows] == [r["ttft_ms"] for r in plain_rows]
    assert calibrated_rows[0]["tpot_ms"] != plain_rows[0]["tpot_ms"]  # the profile moves a batch-8 step
    assert "tpot_ms_on_the_cards" not in plain_rows[0]


def test_a_calibrated_frontier_shows_each_row_on_the_cards_beside_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """pareto under a profile: each feasible row's TPOT on the cards is the TPOT a pareto run
    without the profile finds for the same layout and batch."""
    pareto = ["pareto", "--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine", "vllm@0.15", "--gpus", "1",
              "--all"]
    calibrated, plain = tmp_path / "calibrated.json", tmp_path / "plain.json"
    assert main([*pareto, "--calibration", str(GEMM_PROFILE), "--out", str(calibrated)]) == 0
    assert "TPOT ms    on the cards" in capsys.readouterr().out
    assert main([*pareto, "--out", str(plain)]) == 0
    capsys.readouterr()

    def by_layout(path: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {(r["pp"], r["attention_tp"], r["ffn_tp"], r["batch_per_gpu"]): r
                for r in json.loads(path.read_text())["rows"]}

    with_profile, without = by_layout(calibrated), by_layout(plain)
    assert with_profile.keys() == without.keys()
    assert all(r["tpot_ms_on_the_cards"] == without[k]["tpot_ms"] for k, r in with_profile.items())
    assert any(r["tpot_ms"] != without[k]["tpot_ms"] for k, r in with_profile.items())


def test_a_run_given_twice_is_refused_not_counted_twice(tmp_path: Path) -> None:
    from infersim.calibrate.data import load_reference

    data = yaml.safe_load(EXAMPLE.read_text())
    first = data["experiments"][0]
    with pytest.raises(InferSimError, match=f"--reference {EXAMPLE}: experiment id {first['id']} is given twice "
                                            f"\\(also in {EXAMPLE}\\); each measured run counts once in a fit"):
        load_reference([EXAMPLE, EXAMPLE], "h100-sxm", "vllm@0.15", 60.0)
    data["experiments"].append(dict(first))
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InferSimError, match=f"experiment id {first['id']} is given twice \\(also in {path}\\)"):
        load_reference([path], "h100-sxm", "vllm@0.15", 60.0)
    assert len(load_reference([EXAMPLE], "h100-sxm", "vllm@0.15", 60.0).experiments) == len(data["experiments"]) - 1


def test_a_bench_result_of_another_engine_than_the_config_is_refused(tmp_path: Path) -> None:
    from infersim.calibrate.data import load_bench_results

    result = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"
    with pytest.raises(InferSimError, match="the result's backend 'vllm' ran vllm, but --config serve-llama-8b-h100.yaml "
                                            "runs sglang: give a config of the engine the benchmark ran"):
        load_bench_results([result], "serve-llama-8b-h100.yaml")
    config = yaml.safe_load((REPO_ROOT / "configs" / "serve-llama-8b-h100.yaml").read_text())
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump({**config, "engine": "vllm@0.15"}))
    assert len(load_bench_results([result], str(path))) == 1
