"""The GPUs people own run from the command line, named as their makers name them: AMD Instinct
MI300X/MI325X/MI355X, NVIDIA L4, A10G, RTX 4090/5090, H100 PCIe and NVL. PCIe-only GPUs run tensor
parallel over PCIe; a fact a run needs and a card lacks, or a vendor it does not know, is one line."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO_ROOT

from infersim.cards.hardware import HardwareCard, validate_hardware
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.config import load_hardware_card
from infersim.base.errors import ConfigError

NEW_CARDS = ["mi300x", "mi325x", "mi355x", "l4", "a10g", "rtx-4090", "rtx-5090", "h100-pcie", "h100-nvl"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("card", NEW_CARDS)
def test_every_new_card_runs_a_small_model_on_one_gpu(card, capsys):
    hw, _ = load_hardware_card(card)
    report = run_json(capsys, "--model", "qwen3-0.6b", "--hardware", card, "--isl", "512", "--osl", "128")
    assert report["hardware"] == card
    assert report["memory"]["hbm_gb"] * 1e9 == pytest.approx(hw.peak.hbm_bytes)
    # a decode step reads every weight once: never faster than HBM streams them
    assert report["decode"]["step_time_ms"] / 1e3 >= report["memory"]["weights_gb"] * 1e9 / hw.peak.hbm_bandwidth
    assert any("roofline" in warning for warning in report["warnings"])  # no tables of these GPUs are bundled


@pytest.mark.parametrize(("name", "card"), [
    ("MI300X", "mi300x"), ("AMD Instinct MI300X", "mi300x"), ("mi355x", "mi355x"), ("AMD Instinct MI325X", "mi325x"),
    ("NVIDIA L4", "l4"), ("A10G", "a10g"), ("RTX 4090", "rtx-4090"), ("GeForce RTX 5090", "rtx-5090"),
    ("H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"), ("h100", "h100-sxm"),
])
def test_product_names_resolve(name, card, capsys):
    report = run_json(capsys, "--model", "qwen3-0.6b", "--hardware", name, "--isl", "128", "--osl", "16")
    assert report["hardware"] == card


def test_llama_8b_runs_on_the_gpus_people_own(capsys):
    for card in ("mi300x", "mi355x", "l4", "a10g", "rtx-4090", "h100-pcie"):
        report = run_json(capsys, "--model", "llama-3.1-8b", "--hardware", card, "--engine", "vllm",
                          "--isl", "1000", "--osl", "200")
        assert report["fits"], card


def test_tp2_on_a_pcie_gpu_prices_its_all_reduce_over_pcie(capsys):
    """llama-3.1-8b TP2 on two L4s: a 1,000-token prefill step all-reduces 1000 x 4096 x 2 bytes
    twice a layer; NCCL Simple over PCIe: 8.4 + 2 x 4.0 us + 8,192,000 B / (32e9 x 0.62) per
    all-reduce (tests/test_pcie_collectives.py derives the model)."""
    report = run_json(capsys, "--model", "llama-3.1-8b", "--hardware", "l4", "--engine", "vllm", "--tp", "2",
                      "--isl", "1000", "--osl", "200")
    reduces = [m for m in report["prefill"]["modules"] if m["module"] == "all_reduce"]
    assert len(reduces) == 2
    for op in reduces:
        assert op["detail"] == "NCCL all_reduce over 2 GPUs (1 node), Simple protocol over PCIe"
        assert op["time_per_layer_us"] == pytest.approx(16.4 + 1000 * 4096 * 2 / (32e9 * 0.62) * 1e6, rel=1e-9)


def test_a_card_without_fp8_says_so_when_the_run_asks(capsys):
    err = error_of(capsys, "--model", "llama-3.1-8b", "--hardware", "a10g", "--precision", "fp8")
    assert "a10g has no fp8 tensor-core rate (it has: bf16, fp16)" in err


def _l4_data() -> dict:
    return yaml.safe_load((REPO_ROOT / "hardware" / "l4.yaml").read_text())


@pytest.mark.parametrize(("vendor", "problem"), [
    ("intel", "must be one of nvidia, amd"),
    ("NVIDIA", "must be one of nvidia, amd (did you mean nvidia?)"),
    ("amdd", "(did you mean amd?)"),
])
def test_an_unknown_vendor_is_one_clear_message(vendor, problem):
    data = {**_l4_data(), "vendor": vendor}
    with pytest.raises(ConfigError) as err:
        validate_hardware(build(HardwareCard, data, "my-gpu.yaml"), "my-gpu.yaml")
    assert err.value.field == "vendor" and problem in str(err.value)


def test_a_card_must_name_its_vendor():
    data = _l4_data()
    del data["vendor"]
    with pytest.raises(ConfigError, match="field 'vendor': required field is missing"):
        build(HardwareCard, data, "my-gpu.yaml")


def test_vendor_from_the_command_line(capsys):
    err = error_of(capsys, "--model", "qwen3-0.6b", "--hardware", "l4", "--set", "hardware.vendor=intel")
    assert "field 'vendor'" in err and "must be one of nvidia, amd" in err
    # an AMD card has no CUDA compute capability
    err = error_of(capsys, "--model", "qwen3-0.6b", "--hardware", "l4", "--set", "hardware.vendor=amd")
    assert "field 'compute_capability'" in err


def test_pcie_tiers_and_nvlink_domains_are_checked():
    data = _l4_data()
    data["derates"]["pcie_collective"] = [{"gpus": 4, "efficiency": 0.2}, {"gpus": 2, "efficiency": 0.5}]
    with pytest.raises(ConfigError, match="smallest group to the largest"):
        validate_hardware(build(HardwareCard, data, "x.yaml"), "x.yaml")
    data["derates"]["pcie_collective"] = [{"gpus": 16, "efficiency": 0.2}]
    with pytest.raises(ConfigError, match="more GPUs than a node holds"):
        validate_hardware(build(HardwareCard, data, "x.yaml"), "x.yaml")
    data = _l4_data()
    data["peak"]["nvlink_domain"] = 1
    with pytest.raises(ConfigError, match="peak.nvlink_domain"):
        validate_hardware(build(HardwareCard, data, "x.yaml"), "x.yaml")
