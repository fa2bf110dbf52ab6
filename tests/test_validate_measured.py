"""GPU validation files (benchmarks/gpu/measure_e2e.py's format) read by `infersim validate`: each
self-contained point becomes a run of its cut model, mode's engine card, batch and lengths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, TEST_CACHE_DIR

from infersim.base.errors import ConfigError
from infersim.validate.evaluate import evaluate
from infersim.validate.measured import bundled_files, load_measured

FIXTURE = Path(__file__).resolve().parent / "data" / "gpu_validation_fixture.yaml"


def test_points_map_to_runs_of_their_cut_model_engine_and_lengths() -> None:
    measured = load_measured([FIXTURE])
    assert sorted(measured.reference) == ["fx-llama-2-7b-2l-compiled-decode-b1-p1024",
                                          "fx-llama-2-7b-2l-eager-decode-b16-p1024",
                                          "fx-llama-2-7b-2l-eager-ttft-b1-p1024",
                                          "fx-mixtral-8x7b-2l-eager-decode-b1-p1024"]
    ttft = measured.mapping["fx-llama-2-7b-2l-eager-ttft-b1-p1024"]
    assert ttft.kind == "stage_prefill" and ttft.metrics[""].source == "prefill.ttft_ms"
    assert ttft.run["model"]["num_hidden_layers"] == 2 and ttft.run["model"]["hidden_size"] == 4096
    assert ttft.run["workload"] == {"isl": 1024, "osl": 1, "prefill_tokens_per_gpu": 1024, "decode_batch_per_gpu": 1}
    # eager decode over steps 8..40: mean context 1024 + 24 = isl + osl / 2 with osl 48
    eager = measured.mapping["fx-llama-2-7b-2l-eager-decode-b16-p1024"]
    assert eager.run["engine"] == "huggingface" and eager.metrics[""].source == "decode.tpot_ms"
    assert eager.run["workload"] == {"isl": 1024, "osl": 48, "decode_batch_per_gpu": 16}
    # compiled: a static cache of 1064 positions is what every step attends over: osl = 1064 - 1024
    compiled = measured.mapping["fx-llama-2-7b-2l-compiled-decode-b1-p1024"]
    assert compiled.run["engine"] == "huggingface-compiled" and compiled.run["workload"]["osl"] == 40
    point = measured.reference["fx-mixtral-8x7b-2l-eager-decode-b1-p1024"]
    assert (point.value, point.unit, point.source) == (4.5, "ms", "GPU h100-sxm eager")


def test_measured_points_are_priced_by_the_simulator() -> None:
    measured = load_measured([FIXTURE])
    result = evaluate(measured.reference, measured.mapping)
    assert len(result.comparisons) == 4 and not result.not_expressed
    by_id = {c.id: c for c in result.comparisons}
    compiled = by_id["fx-llama-2-7b-2l-compiled-decode-b1-p1024"]
    eager = by_id["fx-llama-2-7b-2l-eager-decode-b16-p1024"]
    assert compiled.predicted > 0 and eager.predicted > compiled.predicted  # graphs remove the launches
    assert {c.family for c in result.comparisons} == {"stage"}
    assert result.stats()["by_source"].keys() == {"GPU h100-sxm eager", "GPU h100-sxm compiled"}


def test_smoke_points_are_listed_not_compared(tmp_path: Path) -> None:
    data = yaml.safe_load(FIXTURE.read_text())
    data["provenance"]["smoke"] = True
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    measured = load_measured([path])
    assert not measured.reference and len(measured.not_expressed) == 4
    assert measured.not_expressed[0].reason.startswith("smoke run on a CPU")


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="other"), "expected a validation file of format infersim-gpu-validation-1"),
    (lambda d: d["points"][0].update(value=-1.0), "value.*must be greater than 0"),
    (lambda d: d["points"][0].update(metric="tpot"), "expected one of ttft_ms, decode_step_ms"),
    (lambda d: d["points"][1].pop("new_tokens"), "every measured point names it"),
    (lambda d: d["points"][2].update(kv_capacity=512), "kv_capacity.*must exceed prompt_tokens"),
])
def test_a_broken_file_is_one_clear_error(tmp_path: Path, change, message: str) -> None:
    data = yaml.safe_load(FIXTURE.read_text())
    change(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_measured([path])


def test_validate_command_reads_a_measured_file_beside_the_reference(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "infersim", "validate", "--measured", str(FIXTURE),
                           "--point", "fx-llama-2-7b-2l-eager-decode-b16-p1024", "--format", "json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "INFERSIM_CACHE_DIR": TEST_CACHE_DIR})
    assert done.returncode == 0, done.stderr
    import json

    data = json.loads(done.stdout)
    assert [p["id"] for p in data["points"]] == ["fx-llama-2-7b-2l-eager-decode-b16-p1024"]
    assert str(FIXTURE) in data["reference"]


def test_no_measured_file_is_bundled_yet() -> None:
    assert bundled_files() == []  # docs/measuring-on-gpus.md: the next GPU session writes them
