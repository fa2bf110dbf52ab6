"""SGLang DeepSeek large-EP decode on GB200 NVL72 (LMSYS GB200 Part I / Part II points): the
standard-precision runs keep a bf16 MLA cache, so their KV-bound batch is what the low-precision
run's reported KV pool holds at 2 bytes per latent element, not the low-precision run's 1,408.

Facts used (../shared/reference/validation.yaml): sgl-gb200-decode-p2-lowprec ran 1,408 requests
per GPU with FP8 KV, 'KV cache roughly full'; sgl-gb200-decode-p2-std is 'BF16 attention + FP8
MoE'; the low-precision prefill point names its format 'FP8 attention (FP8 KV)'. The bundled
TensorRT-LLM GB200 MLA decode table shows why an fp8 cache means fp8 attention math: its fp8-KV
rows run above the bf16 dense peak."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest
import yaml

from infersim.run.config import config_from_mapping
from infersim.run.memory import kv_bytes_per_token, weights_per_gpu
from infersim.run.simulate import simulate
from infersim.validate import POINTS_FILE

ROOT = Path(__file__).resolve().parents[1]
MLA_DECODE = ROOT / "mfu_tables/aiconfigurator/gb200/trtllm-1.3.0rc20/attention_decode_mla.csv.gz"
GB200_BF16_PEAK = 2.5e15  # hardware/gb200.yaml peak.flops.bf16


def _entries() -> dict[str, dict]:
    return {p["id"]: p for p in yaml.safe_load(Path(POINTS_FILE).read_text())["points"]}


def _config(entry: dict):
    return config_from_mapping(entry["run"], f"points.yaml: {entry['id']}")


def test_fp8_kv_mla_decode_rows_compute_in_fp8():
    """The fp8-KV MLA decode rows (TensorRT-LLM on GB200, 128 heads, latent 576/512) at b=1024,
    kv=16384 do 2 x (576 + 512) x kv x 128 x b FLOPs in 1,625.8 us: 1.15 x the bf16 dense peak, so the
    kernel's math is fp8; the bf16-KV row at the same shape takes 3,136.9 us (0.60 of the bf16 peak).
    A run with bf16 attention therefore did not keep an fp8 cache."""
    rows = {(r["dtype"], r["kv_dtype"]): float(r["latency_us"]) for r in csv.DictReader(gzip.open(MLA_DECODE, "rt"))
            if r["num_heads"] == "128" and r["batch"] == "1024" and r["kv_len"] == "16384"}
    flops = 2 * (576 + 512) * 16384 * 128 * 1024
    assert flops / (rows["bf16", "fp8"] * 1e-6) / GB200_BF16_PEAK == pytest.approx(1.150, abs=0.005)
    assert flops / (rows["bf16", "bf16"] * 1e-6) / GB200_BF16_PEAK == pytest.approx(0.596, abs=0.005)


def test_standard_precision_batch_is_what_the_reported_kv_pool_holds_in_bf16():
    entries = _entries()
    low, std, p1 = (entries[f"sgl-gb200-decode-{k}"] for k in ("p2-lowprec", "p2-std", "p1"))
    for entry in (std, p1):
        prec = entry["run"]["deployment"]["precision"]
        assert (prec["attention"], prec["kv_cache"]) == ("bf16", "bf16")
    low_cfg, std_cfg = _config(low), _config(std)
    assert low_cfg.deployment.precision.kv_cache == "fp8"
    context = 2000 + 100  # ISL + OSL, each request's cache at its end
    fp8_token = kv_bytes_per_token(low_cfg.model, "fp8")
    bf16_token = kv_bytes_per_token(std_cfg.model, "bf16")
    assert (fp8_token, bf16_token) == (35136, 70272)  # 61 layers x 576 latent elements x 1 or 2 bytes
    pool_low = 1408 * context * fp8_token  # 'KV cache roughly full' at 1,408 requests
    assert pool_low == pytest.approx(103.89e9, rel=1e-3)
    extra_weights = weights_per_gpu(std_cfg.model, std_cfg.deployment) - weights_per_gpu(low_cfg.model, low_cfg.deployment)
    assert extra_weights == pytest.approx(7.67e9, rel=2e-3)  # fp8 vs NVFP4 routed experts, 34.30 vs 26.63 GB
    batch = int((pool_low - extra_weights) // (context * bf16_token))
    assert batch == 652
    assert std["run"]["workload"]["decode_batch_per_gpu"] == batch
    assert p1["run"]["workload"]["decode_batch_per_gpu"] == batch
    # 1,408 requests cannot hold a bf16 cache at all: 208 GB, more than the GPU's HBM
    assert 1408 * context * bf16_token > std_cfg.hardware.peak.hbm_bytes


def test_standard_precision_decode_prediction():
    """With the bf16 cache and the batch it allows, the standard run predicts 7,914 tok/s/GPU
    (measured 9,087: -13%); mapped as fp8 KV at 1,408 it predicted 13,197 (+45%). (10,460, +15%, before
    the EPLB deployment's experts were timed by the de-skewed MoE table instead of the roofline, and
    before DeepEP low-latency's receive pass.)"""
    result = simulate(_config(_entries()["sgl-gb200-decode-p2-std"]))
    assert result.fits
    assert result.decode.tokens_per_gpu == 652
    assert result.decode.tgs == pytest.approx(7914, rel=0.01)
    assert abs(result.decode.tgs - 9087) / 9087 < 0.15


def test_points_naming_their_tables_keep_them_under_auto():
    """The SGLang GB200 points ran DeepEP + DeepGEMM, which TensorRT-LLM's aiconfigurator collection
    times and SGLang 0.5.14's does not: they name the TensorRT-LLM tables, and `validate` (auto: each
    run's own tables) keeps them; --mfu-tables none still means the roofline."""
    from pathlib import Path as _Path

    from infersim.validate.evaluate import _Evaluator
    from infersim.validate.mapping import load_mapping

    entry = load_mapping(_Path(POINTS_FILE))["sgl-gb200-decode-p2-std"]
    config, _ = _Evaluator(str(POINTS_FILE), "auto").config(entry)
    software = config.tables.provenance.software
    assert (software["framework"], software["framework_version"], software["system"]) == ("trtllm", "1.3.0rc20", "gb200")
    roofline, _ = _Evaluator(str(POINTS_FILE), "none").config(entry)
    assert not hasattr(roofline.tables, "provenance")
