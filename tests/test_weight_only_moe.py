"""Weight-only quantised routed experts (GPT-OSS's MXFP4 experts run as bf16 x fp4 on Hopper):
the tables' optional weight_dtype column, the run config's precision.expert_gemm, the plan's expert
shapes and dispatch bytes, and trtllm-bench's bytes-per-weight rule for such checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.run.config import config_from_mapping
from infersim.base.errors import ConfigError
from infersim.shapes.kernels import GroupedGemmShape
from infersim.tables.format import GroupedGemmRow
from infersim.tables.table_files import read_table_csv, table_csv_text
from infersim.modules.step import build_step_plan
from infersim.shapes.plan import SequenceBatch
from infersim.serve.settings import checkpoint_bytes_per_weight, offline_limits

H200_BF16 = 989.4e12  # hardware/h200.yaml peak.flops.bf16

GPT_OSS_PRECISION = {"gemm": "fp8", "weights": "fp8", "expert_weights": "fp4", "expert_gemm": "bf16",
                     "kv_cache": "fp8"}


def gpt_oss(precision: dict, mfu_tables: str | None = "none"):
    return config_from_mapping({
        "model": "gpt-oss-120b", "hardware": "h200", "engine": "trtllm",
        # all-to-all named: TensorRT-LLM's own choice at EP2 <= top-4 is all-gather, which sends no dispatch
        "deployment": {"num_gpus": 2, "attention": {"tp": 1, "dp": 2}, "ffn": {"tp": 1, "ep": 2},
                       "moe_comm": "all-to-all", "precision": precision},
        "workload": {"isl": 1024, "osl": 1024, "decode_batch_per_gpu": 64}}, "test", mfu_tables=mfu_tables)


def row(**changes) -> GroupedGemmRow:
    fields = dict(dtype="bf16", stage="decode", projection="up", num_experts=128, ep=2, topk=4, hidden=2880,
                  intermediate=2880, gated=True, tokens_per_gpu=256, latency_us=400.0)
    return GroupedGemmRow(**{**fields, **changes})


def test_weight_dtype_column_is_written_only_when_a_row_has_one(tmp_path: Path) -> None:
    plain = table_csv_text("grouped_gemm", [row()], lambda dtype: H200_BF16)
    assert plain.splitlines()[0] == ("dtype,stage,projection,num_experts,ep,topk,hidden,intermediate,gated,"
                                     "tokens_per_gpu,latency_us,efficiency,source_mfu")
    mixed = table_csv_text("grouped_gemm", [row(weight_dtype="fp4")], lambda dtype: H200_BF16)
    header, line = mixed.splitlines()
    assert header.endswith(",source_mfu,weight_dtype")
    # 2 x 256 tokens x 4 (top-k) x 2880 x 5760 (gate+up) FLOPs / (400e-6 s x 989.4e12) = 0.0858446
    assert 2 * 256 * 4 * 2880 * 5760 / (400e-6 * H200_BF16) == pytest.approx(0.0858446, rel=1e-6)
    assert line == "bf16,decode,up,128,2,4,2880,2880,true,256,400,0.0858446,,fp4"
    path = tmp_path / "grouped.csv"
    path.write_text(mixed)
    (back,) = read_table_csv(path, "grouped_gemm", lambda dtype: H200_BF16)
    assert back == row(weight_dtype="fp4")
    assert back.shape().weight_dtype == "fp4" and back.shape().dtype == "bf16"
    # bytes follow the stored format: 64 local experts x 2880 x 5760 x 0.5 B of up-projection weights
    assert back.shape().bytes >= 64 * 2880 * 5760 * 0.5
    path.write_text(plain)
    (old,) = read_table_csv(path, "grouped_gemm", lambda dtype: H200_BF16)
    assert old.weight_dtype is None and old.shape().weight_dtype == "bf16"


def test_an_unknown_weight_dtype_is_named_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "grouped.csv"
    path.write_text(table_csv_text("grouped_gemm", [row(weight_dtype="fp4")], lambda dtype: H200_BF16)
                    .replace(",fp4\n", ",fp5\n"))
    with pytest.raises(ConfigError) as err:
        read_table_csv(path, "grouped_gemm", lambda dtype: H200_BF16)
    message = str(err.value)
    assert f"{path}:2" in message and "weight_dtype" in message and "fp5" in message


def test_expert_gemm_sets_the_expert_kernels_format_and_dispatch_bytes() -> None:
    def experts_and_dispatch(precision: dict):
        cfg = gpt_oss(precision)
        plan = build_step_plan(cfg.model, cfg.deployment, (SequenceBatch(64, 1, 1024),), 0)
        ops = {op.name: op for group in plan.groups for op in group.operations}
        return ops["experts_up"].shape, ops["dispatch"].shape

    up, dispatch = experts_and_dispatch(GPT_OSS_PRECISION)
    assert isinstance(up, GroupedGemmShape) and (up.dtype, up.weight_dtype) == ("bf16", "fp4")
    assert dispatch.token_bytes == 2880 * 2  # bf16 activations travel to bf16 expert GEMMs
    fp8_experts = {**GPT_OSS_PRECISION, "expert_gemm": None}
    up, dispatch = experts_and_dispatch(fp8_experts)
    assert (up.dtype, up.weight_dtype) == ("fp8", "fp4")  # default: the deployment's GEMM format
    assert dispatch.token_bytes == 2880 * 1


def test_expert_gemm_without_a_tensor_core_rate_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        gpt_oss({**GPT_OSS_PRECISION, "expert_gemm": "fp4"})
    message = str(err.value)
    assert "deployment.precision.expert_gemm" in message and "fp4" in message and "tensor-core rate" in message


def test_bundled_h200_tables_time_gpt_oss_experts_as_w4a16() -> None:
    from infersim.run.simulate import simulate

    result = simulate(gpt_oss(GPT_OSS_PRECISION, mfu_tables=None))
    experts = [op for op in result.decode.operations if op.name == "experts_up"]
    assert experts and all("grouped_gemm_w4a16_mxfp4_power_law_1.2.csv" in op.detail for op in experts)


def test_trtllm_bench_counts_a_weight_only_checkpoint_at_two_bytes_per_weight() -> None:
    gpt = gpt_oss(GPT_OSS_PRECISION)
    assert checkpoint_bytes_per_weight(gpt.model, gpt.deployment, gpt.engine.offline_limits) == 2.0  # MXFP4 W4A16: neither FP8 nor NVFP4
    fp8 = gpt_oss({"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"})
    assert checkpoint_bytes_per_weight(fp8.model, fp8.deployment, fp8.engine.offline_limits) == 1.0
    # GPT-OSS-120B (116.79e9 parameters) on 2 x H200 (150.75e9 B each, 143,771 MiB): KV memory
    # (301.51e9 - 116.79e9 x 2 B) x 0.95 = 64.53e9 B; KV per token 2 x 36 layers x 8 heads x 64 x 1 B = 36,864 B;
    # 64.53e9 / 36,864 / 2048 tokens = 854.8 requests -> next multiple of 128 = 896; tokens 854.8 x 2 = 1,710
    # -> max(2048, multiple of 256) = 2048
    assert offline_limits(gpt, 1024, 1024) == (896, 2048)
    # counted at 1 B per weight (an FP8 checkpoint): (301.51e9 - 116.79e9) x 0.95 / 36,864 / 2048 = 2,324.4
    # -> next multiple of 256 = 2,560; tokens 4,648.7 -> next multiple of 512 = 5,120
    assert offline_limits(fp8, 1024, 1024) == (2560, 5120)
