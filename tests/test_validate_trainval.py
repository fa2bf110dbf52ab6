"""The public vLLM 0.15 serving runs (infersim/validate/public/vllm_serving_trainval.yaml) as a
`validate` source: each experiment x load stage a point of TTFT/ITL/E2E sub-metrics, mapped through
the trainval converter to a serving run.

Facts used (the file, experiment 62): Mistral-Nemo-Instruct-2407 on 2 x H100 SXM, TP 2; vLLM
max_num_seqs 128, max_num_batched_tokens 1024, 48,009 KV blocks of 16 tokens, 6,553 CPU offload
blocks; general-lite: 9 system prompts of 100 tokens x 5 users, questions of 447, outputs of 248
tokens, stages 2.5/s then 6/s of 600 s each; max_position_embeddings 131,072; stage 0 measured
mean TTFT 22.00 ms, mean ITL 6.00 ms, mean E2E 1,497 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, shared_reference

from infersim.cli.main import main

from infersim.cards.deployment import Workload
from infersim.engine.stage import run_stage
from infersim.modules.step import build_step_plan
from infersim.run.config import config_from_mapping
from infersim.run.simulate import run_prefill
from infersim.serve.api import simulate_serving
from infersim.shapes.plan import SequenceBatch
from infersim.validate.evaluate import evaluate
from infersim.serve.trainval import STAGE_WINDOW_S
from infersim.validate.trainval import experiment_options, experiment_run, load_trainval, shipped_file


def _experiment(exp_id: str) -> dict:
    data = yaml.safe_load(shipped_file().read_text())
    return next(e for e in data["experiments"] if e.get("exp_id") == exp_id)


def test_the_shipped_copy_equals_the_reference() -> None:
    reference = shared_reference("vllm_serving_trainval.yaml")
    assert shipped_file().read_bytes() == reference.read_bytes(), \
        f"cp {reference} infersim/validate/public/ (the shipped copy is stale)"


def test_one_experiment_mapped_by_hand() -> None:
    points = load_trainval()
    # 13 runs: 8 of two stages, 5 of one; and the KV pool of each of their 9 distinct servers
    assert len(points.reference) == 21 + 9 and not points.not_expressed
    pid = "trainval-62-general-lite-stage0"
    point, entry = points.reference[pid], points.mapping[pid]
    assert point.source == "TRAINVAL_VLLM" and point.unit == "ms"
    assert point.value["ttft_mean"] == pytest.approx(22.00, abs=0.01)
    assert point.value["itl_mean"] == pytest.approx(6.00, abs=0.01)
    assert point.value["e2e_mean"] == pytest.approx(1497, abs=1)
    assert set(point.value) == {"ttft_mean", "ttft_p90", "ttft_p99", "itl_mean", "e2e_mean", "e2e_p90", "e2e_p99"}
    assert entry.kind == "serving" and entry.metrics["itl_mean"].source == "itl_of_means_ms"
    assert entry.run == {"model": "mistralai/Mistral-Nemo-Instruct-2407", "hardware": "h100-sxm",
                         "engine": "vllm@0.15", "deployment": {"num_gpus": 2, "attention": {"tp": 2}, "ffn": {"tp": 2}},
                         "workload": {"isl": 1024, "osl": 256}}
    serving = entry.serving
    assert serving["stage"] == 0 and serving["seed"] == 0
    assert (serving["max_running_requests"], serving["max_num_tokens"]) == (128, 1024)
    assert serving["kv_capacity_tokens"] == 48009 * 16 and serving["host_kv_tokens"] == 6553 * 16
    workload = serving["workload"]
    assert workload["load"]["timer"] == "constant"
    # each cut stage is the middle of one twice as long: half as long again before and after, not counted
    margins = {"lead_s": STAGE_WINDOW_S / 2, "tail_s": STAGE_WINDOW_S / 2}
    assert workload["load"]["stages"] == [{"rate": 2.5, "duration_s": STAGE_WINDOW_S, **margins},
                                          {"rate": 6, "duration_s": STAGE_WINDOW_S, **margins}]
    assert workload["data"] == {"type": "shared_prefix", "num_groups": 9, "prompts_per_group": 5,
                                "system_prompt_len": 100, "question_len": 447, "output_len": 248,
                                "multi_turn": False, "order": "fresh"}
    assert workload["max_model_len"] == 131072  # below the 768,144-token pool
    assert any("stages cut to at most 120 s" in n for n in workload["notes"])
    assert any("fixed-length" in n for n in workload["notes"])
    assert points.mapping["trainval-62-general-lite-stage1"].serving["stage"] == 1


def test_a_missing_hardware_card_is_refused_not_guessed(tmp_path) -> None:
    experiment = _experiment("62")
    experiment["hardware"] = {"gpu": "NVIDIA L40S", "count": 2}
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"experiments": [experiment]}))
    points = load_trainval(path)
    assert not points.reference
    assert [n.id for n in points.not_expressed] == ["trainval-62-general-lite-stage0", "trainval-62-general-lite-stage1",
                                                    "trainval-62-kv-pool"]
    assert "no hardware card for GPU 'NVIDIA L40S'" in points.not_expressed[0].reason


def test_one_stage_against_its_steps_by_hand() -> None:
    """Qwen2.5-7B on one H100, 1 request/s of 100 + 934 prompt tokens and 1,448 output tokens (run
    66): a steady batch of about rate x E2E requests decodes; its mean ITL is one decode step of
    that batch at the mean context (1,034 + 1,448 / 2), within 5% (one prefill step a second joins
    ~150 decode steps). TTFT: the prefill of the 934-token question (the system prompt's 96 tokens
    of whole blocks come from the cache) after the decode step the async scheduler had formed,
    behind at most one step in flight: prefill(938) + step < TTFT < prefill(1,034) + 3 steps."""
    experiment = _experiment("66")
    config = config_from_mapping(experiment_run(experiment), "test")
    out = simulate_serving(config, experiment_options(experiment, max_stage_s=60))
    stage = out["stages"][0]
    batch = round(1.0 * stage["mean_e2el_ms"] / 1e3)
    assert 9 <= batch <= 11
    step = run_stage(build_step_plan(config.model, config.deployment, (SequenceBatch(batch, 1, 1034 + 724),), 0),
                     config.hardware, config.tables, config.engine).step_time_s
    assert stage["itl_of_means_ms"] == pytest.approx(step * 1e3, rel=0.05)
    assert stage["itl_of_means_ms"] == pytest.approx(stage["mean_tpot_ms"], rel=1e-9)  # fixed output lengths
    low = run_prefill(config.model, config.hardware, config.deployment, Workload(isl=938, osl=1), config.tables,
                      config.engine).step_time_s
    high = run_prefill(config.model, config.hardware, config.deployment, Workload(isl=1034, osl=1), config.tables,
                       config.engine).step_time_s
    assert (low + step) * 1e3 < stage["mean_ttft_ms"] < (high + 3 * step) * 1e3
    # 60 counted requests; the 30 s lead-in's 30 requests have sent each of the 23 system prompts once,
    # so every counted request finds its 96 tokens of whole blocks cached
    assert stage["num_prompts"] == 60
    assert stage["prefix_cache_hit_rate"] == pytest.approx(96 / 1034, rel=1e-9)


def test_validate_compares_the_stage_and_reports_overload(monkeypatch) -> None:
    """Every sub-metric of a stage is compared from one serving run; a stage the simulator overloads
    while the measured one shows no queue keeps its TTFT and E2E out of the statistics, with the reason."""
    import infersim.validate.evaluate as ev

    points = load_trainval()
    pid = "trainval-66-reasoning-lite-stage0"
    reference, mapping = {pid: points.reference[pid]}, {pid: points.mapping[pid]}
    calls = []
    real = ev._Evaluator._serving_result

    def counted(self, entry):
        calls.append(entry.id)
        return real(self, entry)

    monkeypatch.setattr(ev._Evaluator, "_serving_result", counted)
    result = evaluate(reference, mapping)
    assert {c.id.split("/")[1] for c in result.comparisons} == set(points.reference[pid].value)
    assert not any(c.accepted_outlier for c in result.comparisons)
    stats = result.stats()["by_metric"]
    assert stats["itl_mean"].n == 1 and stats["ttft_mean"].n == 1

    def overloaded(self, entry):
        out, grade, notes = real(self, entry)
        rows = [{**row, "overloaded": True, "saturated_capacity_rps": 0.5} for row in out["stages"]]
        return {**out, "stages": rows}, grade, notes

    monkeypatch.setattr(ev._Evaluator, "_serving_result", overloaded)
    result = evaluate(reference, mapping)
    excluded = {c.id.split("/")[1] for c in result.comparisons if c.accepted_outlier}
    assert excluded == {"ttft_mean", "ttft_p90", "ttft_p99", "e2e_mean", "e2e_p90", "e2e_p99"}
    reason = next(c.accepted_outlier for c in result.comparisons if c.accepted_outlier)
    assert "simulated stage overloaded at 1 req/s (served 0.50 req/s)" in reason and "measured stage is not" in reason
    assert result.stats()["by_metric"].keys() == {"itl_mean"}


def test_the_source_is_opt_in_on_the_command_line(tmp_path) -> None:
    """`--source trainval-vllm` compares these points (and only these); the default run does not."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # the session's table cache (INFERSIM_CACHE_DIR)
    point = "trainval-66-reasoning-lite-stage0/itl_mean"
    proc = subprocess.run([sys.executable, "-m", "infersim", "validate", "--source", "trainval-vllm", "--point", point,
                           "--format", "json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["reference"] == "infersim/validate/public/vllm_serving_trainval.yaml (shipped)"
    assert [p["id"] for p in data["points"]] == [point]
    assert data["points"][0]["measured"] == pytest.approx(7.446, abs=0.001)
    assert set(data["summary"]["by_serving_metric"]) == {"itl_mean"}
    default = subprocess.run([sys.executable, "-m", "infersim", "validate", "--point", point], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert default.returncode == 2 and "unknown point id(s) trainval-66" in default.stderr


def test_a_calibration_profile_applies_to_the_points_of_its_gpu_and_engine(tmp_path: Path, capsys) -> None:
    """validate --calibration: the trainval points (vLLM 0.15.1 on the H100) run with the profile's
    constants, said in each point's note; a slower GEMM makes the same stage's E2E longer."""
    profile = {"kind": "infersim-calibration",
               "applies_to": {"hardware": "h100-sxm", "engine": "vllm", "engine_version": "0.15.1"},
               "constants": {"gemm_time_scale": {"value": 1.5, "uncertainty": 0.02, "prior": 1.0}}}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    point = "trainval-62-general-lite-stage0"

    def e2e(*extra: str) -> dict:
        assert main(["validate", "--source", "trainval-vllm", "--point", f"{point}/e2e_mean", "--format", "json",
                     *extra]) == 0
        rows = json.loads(capsys.readouterr().out)["points"]
        return next(r for r in rows if r["id"] == f"{point}/e2e_mean")

    plain, calibrated = e2e(), e2e("--calibration", str(path))
    assert "calibrated" not in plain["note"] and "calibrated: calibration" in calibrated["note"]
    assert "gemm_time_scale 1.5" in calibrated["note"]
    assert calibrated["predicted"] > plain["predicted"] * 1.05
    assert main(["validate", "--source", "trainval-vllm", "--point", point,
                 "--calibration", str(tmp_path / "none.yaml")]) != 0
    assert "none.yaml: no such file" in capsys.readouterr().err


def test_validate_under_a_profile_sets_the_statistics_on_the_cards_beside_the_calibrated(capsys) -> None:
    """One trainval point under a profile: the summary carries the calibrated statistics
    and, beside them, those of the same point on the cards (what validate prints without it)."""
    import json

    from infersim.cli.main import main

    profile = REPO_ROOT / "tests" / "data" / "h100-vllm-gemm-profile.yaml"
    args = ["validate", "--source", "trainval-vllm", "--point", "trainval-62-general-lite-stage0", "--format", "json"]
    assert main([*args, "--calibration", str(profile)]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert calibrated["summary_on_the_cards"] == plain["summary"]
    assert calibrated["summary"]["overall"] != plain["summary"]["overall"]
    assert "summary_on_the_cards" not in plain


def test_a_file_of_serving_runs_is_a_reference_of_its_own(tmp_path: Path, capsys) -> None:
    """`--reference FILE` in this format compares FILE's runs (only them: no shipped points), with its
    own measurements: run 66 with its stage-0 mean ITL written as 10.0 ms instead of 7.446 ms. Given
    beside the shipped copy (`--source trainval-vllm`) its ids clash, which is refused, not merged."""
    experiment = _experiment("66")
    experiment["measured"]["stage_0"]["itl_mean_ms"] = 10.0
    path = tmp_path / "my_runs.yaml"
    path.write_text(yaml.safe_dump({"experiments": [experiment]}))
    point = "trainval-66-reasoning-lite-stage0/itl_mean"
    assert main(["validate", "--reference", str(path), "--point", point, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reference"] == str(path)
    assert [(p["id"], p["measured"]) for p in data["points"]] == [(point, 10.0)]
    assert main(["validate", "--reference", str(path), "--source", "trainval-vllm", "--point", point]) != 0
    err = capsys.readouterr().err  # the first of its points (a stage's, or its server's KV pool) named
    assert "point id trainval-66-" in err and f" of {path} is also in another file compared" in err
