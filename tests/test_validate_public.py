"""The public measurements ship with the package: `infersim validate` and the validation scripts
answer without ../shared, from any working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import PUBLIC_REFERENCE, REPO_ROOT, SHARED_REFERENCE

from infersim.validate import DEFAULT_REFERENCES, PUBLIC_DIR, public_file

SHIPPED = ("validation.yaml", "published.yaml")


def test_the_shipped_files_are_in_the_package_with_their_sources() -> None:
    assert PUBLIC_DIR == PUBLIC_REFERENCE and DEFAULT_REFERENCES == (PUBLIC_DIR / "validation.yaml",
                                                                         PUBLIC_DIR / "energy.yaml")
    for name in SHIPPED:
        assert public_file(name).is_file()
    validation = yaml.safe_load(public_file("validation.yaml").read_text())
    sources = validation["sources"]
    assert len(validation["data_points"]) == 75
    assert all(point["source"] in sources for point in validation["data_points"])  # every value names its source
    assert {case["id"] for case in yaml.safe_load(public_file("published.yaml").read_text())["cases"]} == {
        path.stem for path in (REPO_ROOT / "benchmarks" / "published").glob("*.yaml")}
    readme = (PUBLIC_DIR / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in (*SHIPPED, "energy.yaml"))
    energy = yaml.safe_load(public_file("energy.yaml").read_text())  # the energy measurements, their sources
    assert all(point["source"] in energy["sources"] for point in energy["data_points"])


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_copies_equal_the_reference_set(name: str) -> None:
    reference = SHARED_REFERENCE / name
    if not reference.exists():
        pytest.skip(f"{reference} not available (a user's clone has no ../shared): nothing to keep in step with")
    assert public_file(name).read_bytes() == reference.read_bytes(), \
        f"cp {reference} infersim/validate/public/ (the shipped copy is stale)"


def test_validate_runs_from_another_directory(tmp_path) -> None:
    """From a directory with nothing beside it, as an installed package runs."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "INFERSIM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "infersim", "validate", "--format", "json",
                           "--point", "deepgemm-dense-m64-n7168-k16384", "--point", "sgl-h20-decode-base"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["reference"] == ("infersim/validate/public/validation.yaml (shipped), "
                                 "infersim/validate/public/energy.yaml (shipped)")
    assert {p["id"] for p in data["points"]} >= {"deepgemm-dense-m64-n7168-k16384/tflops", "sgl-h20-decode-base"}


def test_validate_published_runs_without_shared(tmp_path) -> None:
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "validate_published.py"), "--format", "json",
                           "--mfu-tables", "none"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "INFERSIM_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [case["id"] for case in report["cases"]] == [
        "deepseek-v3-h800-prefill", "deepseek-v3-h800-decode", "qwen3-30b-a3b-h20-prefill", "qwen3-30b-a3b-h20-decode",
        "qwen3-8b-h20-prefill", "qwen3-8b-h20-decode"]
    assert report["cases"][0]["actual_tgs"] == 7839  # published.yaml: DeepSeek-V3 prefill on 32 H800s
