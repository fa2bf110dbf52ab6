"""The LM head under attention DP (deployment.lm_head): per rank, or SGLang's default, which gathers
every DP rank's tokens over a vocab split across the whole TP group (layers/logits_processor.py)."""

from __future__ import annotations

import json

import pytest

from infersim.cli.main import main
from infersim.run.config import load_run_config
from infersim.base.errors import InferSimError
from infersim.run.memory import weights_per_gpu
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate

# configs/qwen3-30b.yaml: Qwen3-30B-A3B (hidden 2048, vocab 151,936, untied head), attention DP4, SGLang
H, VOCAB, DP = 2048, 151_936, 4


def per_step(overrides: list[str], batch: int = 8) -> dict:
    cfg = load_run_config("configs/qwen3-30b.yaml", overrides)
    plan = build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, batch, 0)
    return {op.name: op.shape for op in plan.per_step}


def test_sglang_gathers_every_dp_ranks_tokens_over_the_whole_groups_vocab():
    ops = per_step([])
    rows = 8 * DP  # the decode batch of each of the 4 ranks
    assert ops["lm_head_gather"].kind == "all_gather" and ops["lm_head_gather"].ranks == 4
    assert ops["lm_head_gather"].bytes_per_rank == rows * H * 2  # bf16 hidden states, gathered
    gemm = ops["lm_head"]
    assert (gemm.m, gemm.k, gemm.n) == (rows, H, VOCAB // 4)  # 37,984 vocab rows per GPU
    assert ops["logits_all_gather"].bytes_per_rank == rows * VOCAB * 2  # every row's full bf16 logits
    assert ops["logits_scatter"].bytes == 2 * 8 * VOCAB * 2  # read + write of the rank's own rows


def test_per_rank_head_computes_its_own_rows_over_the_whole_vocab():
    ops = per_step(["deployment.lm_head=per-rank"])
    assert "lm_head_gather" not in ops and "logits_all_gather" not in ops
    gemm = ops["lm_head"]
    assert (gemm.m, gemm.n) == (8, VOCAB)


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_other_engines_default_to_per_rank(engine):
    cfg = load_run_config("configs/qwen3-30b.yaml", [f"engine={engine}"])
    assert cfg.deployment.lm_head == "per-rank"
    assert load_run_config("configs/qwen3-30b.yaml").deployment.lm_head == "gathered"


def test_without_attention_dp_or_with_a_tied_head_nothing_is_gathered():
    no_dp = ["deployment.attention.tp=4", "deployment.attention.dp=1", "deployment.ffn.tp=4",
             "deployment.ffn.ep=1", "deployment.moe_comm=all-gather"]
    assert "logits_all_gather" not in per_step(no_dp)
    # a tied head is the replicated embedding under DP attention: nothing to gather
    assert "logits_all_gather" not in per_step(["model.tie_word_embeddings=true"])


def test_gathered_head_holds_a_dp_share_of_its_weights():
    gathered = load_run_config("configs/qwen3-30b.yaml")
    per_rank = load_run_config("configs/qwen3-30b.yaml", ["deployment.lm_head=per-rank"])
    saved = weights_per_gpu(per_rank.model, per_rank.deployment) - weights_per_gpu(gathered.model, gathered.deployment)
    assert saved == pytest.approx(VOCAB * H * 2 * (1 - 1 / DP))  # 0.467 GB of bf16 head


def test_the_gathered_head_costs_its_all_gather_in_the_step():
    gathered = simulate(load_run_config("configs/qwen3-30b.yaml")).decode
    per_rank = simulate(load_run_config("configs/qwen3-30b.yaml", ["deployment.lm_head=per-rank"])).decode
    ops = {op.name: op for op in gathered.operations}
    assert ops["logits_all_gather"].module == "dp_gather" and ops["logits_all_gather"].time_s > 0
    # 100 requests x 4 ranks of 151,936 bf16 logits = 122 MB gathered per step: slower than per rank
    assert gathered.step_time_s > per_rank.step_time_s


def test_a_vocab_that_does_not_split_over_the_group_is_named(capsys):
    # a vocab of 151,937 rows does not split over a DP3 group (attention TP1 x DP3 sharing an FFN TP3 group)
    with pytest.raises(InferSimError, match="deployment.lm_head.*vocab_size"):
        simulate(load_run_config("configs/qwen3-30b.yaml", [
            "deployment.num_gpus=3", "deployment.attention.dp=3", "deployment.ffn.ep=1", "deployment.ffn.tp=3",
            "model.vocab_size=151937"]))
    assert main(["--config", "configs/qwen3-30b.yaml", "--format", "json", "--set", "deployment.lm_head=per-rank"]) == 0
    assert json.loads(capsys.readouterr().out)["deployment"]["lm_head"] == "per-rank"
