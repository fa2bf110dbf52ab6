"""kernel_libraries: tables that timed another library than the run's engine runs are not used."""

from __future__ import annotations

import pytest

from infersim.run.config import load_run_config
from infersim.base.errors import ConfigError
from infersim.shapes.kernels import Source
from infersim.tables.libraries import library_matches
from infersim.run.simulate import simulate

# DeepSeek-V3 decode on H800 with the bundled imported tables (attention: FlashInfer / FlashAttention-3,
# GEMMs and grouped GEMMs: DeepGEMM)
CONFIG = "benchmarks/published/deepseek-v3-h800-decode.yaml"


def sources(overrides: list[str]) -> tuple[dict[str, Source], list[str]]:
    result = simulate(load_run_config(CONFIG, ["workload.decode_batch_per_gpu=64", *overrides]))
    return {op.name: op.source for op in result.decode.operations}, result.warnings


def test_library_names_match_whatever_their_spelling():
    assert library_matches("FlashInfer / FlashAttention-3", "flashinfer")
    assert library_matches("FlashInfer / FlashAttention-3", "FlashAttention3")
    assert not library_matches("FlashInfer / FlashAttention-3", "FlashMLA")
    assert library_matches("DeepGEMM", "deep_gemm")


def test_another_attention_library_leaves_attention_to_the_roofline_and_says_so():
    ops, warnings = sources(["kernel_libraries.attention=FlashMLA"])
    assert ops["attn_core"] == Source.ROOFLINE
    assert ops["experts_up"] == Source.TABLE  # DeepGEMM tables still time the experts
    assert any("attention tables ran FlashInfer / FlashAttention-3, the run's engine runs FlashMLA" in w
               for w in warnings)


def test_a_matching_library_keeps_the_tables():
    ops, warnings = sources(["kernel_libraries.attention=FlashInfer", "kernel_libraries.grouped_gemm=DeepGEMM"])
    assert ops["attn_core"] == Source.TABLE and ops["experts_up"] == Source.TABLE
    assert not any("not used" in w for w in warnings)
    # the published decode case names FlashMLA (DeepSeek's kernel): its attention is the roofline's
    assert sources([])[0]["attn_core"] == Source.ROOFLINE


def test_a_family_the_tables_do_not_have_is_refused_by_name():
    with pytest.raises(ConfigError, match="kernel_libraries.*moe"):
        load_run_config(CONFIG, ["kernel_libraries.moe=Triton"])


def test_without_tables_nothing_is_said():
    result = simulate(load_run_config(CONFIG, ["workload.decode_batch_per_gpu=64"], mfu_tables="none"))
    assert not any("not used" in w for w in result.warnings)
