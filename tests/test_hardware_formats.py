"""A hardware card's tensor-core formats: known names, a rate and an efficiency for each."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT
from test_hostile_cli import one_line_error, run


@pytest.mark.parametrize(("override", "field", "value"), [
    ("hardware.peak.flops.fp9=1e12", "peak.flops.fp9", "1000000000000.0"),
    ("hardware.derates.compute_efficiency.fp9=0.5", "derates.compute_efficiency.fp9", "0.5"),
])
def test_an_unknown_format_is_refused(capsys, override, field, value) -> None:
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--set", override)
    assert code == 2
    one_line_error(err, f"field '{field}' (value: {value}): unknown format (did you mean fp8?)")


def test_a_rate_without_its_efficiency_is_refused_not_priced_with_another(capsys, tmp_path: Path) -> None:
    card = yaml.safe_load((REPO_ROOT / "hardware" / "h20.yaml").read_text())
    card["derates"]["compute_efficiency"]["fp9"] = card["derates"]["compute_efficiency"].pop("fp8")
    path = tmp_path / "h20-typo.yaml"
    path.write_text(yaml.safe_dump(card))
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--hardware", str(path), "--precision", "fp8")
    assert code == 2
    one_line_error(err, f"{path}: field 'derates.compute_efficiency.fp9'")
    del card["derates"]["compute_efficiency"]["fp9"]
    path.write_text(yaml.safe_dump(card))
    code, _out, err = run(capsys, "--config", "qwen3-30b.yaml", "--hardware", str(path), "--precision", "fp8")
    assert code == 2
    one_line_error(err, f"{path}: field 'derates.compute_efficiency.fp8': peak.flops has a fp8 rate, "
                        "so its GEMM efficiency is needed too")
