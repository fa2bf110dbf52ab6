"""The model's context length (max_position_embeddings): imported from HF configs, refused beyond it
by the engines whose server refuses it, and SGLang's running-request cap derived from its KV pool
and that context (model_runner.py: min(pool // 2, min(max(pool / context x 512, 2048), 4096)))."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infersim.cards.engine_scheduler import RunningCapFromPool
from infersim.cards.hf_import import card_fields_from_hf
from infersim.cards.deployment import Workload
from infersim.cli.main import main
from infersim.run.config import config_from_mapping, load_engine_card, load_model_card
from infersim.run.memory import memory_budget
from infersim.serve.settings import settings_from_engine

SGLANG_RULE = RunningCapFromPool(requests_per_context=512, min_requests=2048, max_requests=4096,
                                 pool_tokens_per_request=2, unstated_context_tokens=2048)
ONE_GPU = {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1}}
TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 128}


def test_importer_reads_the_context_length_under_its_names():
    assert card_fields_from_hf({**TINY_HF, "max_position_embeddings": 8192}, "t.json", "t")[
        "max_position_embeddings"] == 8192
    assert card_fields_from_hf({**TINY_HF, "n_positions": 1024}, "t.json", "t")["max_position_embeddings"] == 1024
    assert "max_position_embeddings" not in card_fields_from_hf(TINY_HF, "t.json", "t")  # not stated: not guessed


def test_bundled_cards_carry_their_context():
    assert load_model_card("qwen3-8b")[0].max_position_embeddings == 40960
    assert load_model_card("llama-2-7b")[0].max_position_embeddings == 4096
    assert load_model_card("bloom-176b")[0].max_position_embeddings == 0  # its HF config states none


@pytest.mark.parametrize(("pool", "context", "cap"), [
    (500_000, 40960, 4096),   # 500,000 / 40,960 x 512 = 6,250: clamped to 4,096
    (100_000, 131072, 2048),  # 390: raised to 2,048
    (3_000, 40960, 1500),     # 2,048, but never more than half the pool
    (10_000, 0, 2500),        # context not stated: 2,048 tokens, 10,000 / 2,048 x 512 = 2,500
])
def test_sglang_running_cap_by_hand(pool, context, cap):
    assert SGLANG_RULE.cap(pool, context) == cap


@given(st.integers(2, 10**8), st.integers(2, 10**8), st.integers(0, 10**7))
def test_sglang_running_cap_is_bounded_and_grows_with_the_pool(pool, more, context):
    cap = SGLANG_RULE.cap(pool, context)
    assert 1 <= cap <= 4096 and cap <= pool // 2
    assert SGLANG_RULE.cap(pool + more, context) >= cap


def test_sglang_cards_cap_running_requests_by_their_pool_but_vllm_by_its_tier():
    sglang = load_engine_card("sglang")[0]
    assert sglang.running_cap(141e9, 500_000, 40960) == 4096
    vllm = load_engine_card("vllm")[0]
    assert vllm.running_cap(141e9, 500_000, 40960) == 1024  # max_num_seqs; no pool rule


def test_the_largest_batch_of_a_small_model_under_sglang_is_its_cap():
    config = config_from_mapping({"model": "qwen3-0.6b", "hardware": "h200", "engine": "sglang", "deployment": ONE_GPU,
                                  "workload": {"isl": 16, "osl": 16}}, "test", mfu_tables="none")
    model, hw, dep = config.model, config.hardware, config.deployment
    memory = memory_budget(model, hw, dep, Workload(isl=16, osl=16, decode_batch_per_gpu="max"), None,
                           config.engine, 8192)
    assert memory.kv_fit_batch_per_gpu > 4096  # ~1.2 M tokens of pool: 37,000 such requests would fit
    assert (memory.running_cap_per_gpu, memory.max_batch_per_gpu, memory.binding_limit) == \
        (4096, 4096, "running-request cap")


def test_serving_under_sglang_caps_each_instance():
    config = config_from_mapping({"model": "qwen3-8b", "hardware": "h100", "engine": "sglang", "deployment": ONE_GPU,
                                  "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")
    settings = settings_from_engine(config, 1000, 200, offline=False)
    pool = settings.kv_capacity_tokens
    assert pool > 2 * 4096 and settings.max_running == min(max(pool * 512 // 40960, 2048), 4096)


def test_a_request_beyond_the_context_is_refused_where_the_server_refuses_it(capsys):
    args = ["--model", "qwen3-8b", "--hardware", "h100", "--isl", "40000", "--osl", "2000"]
    assert main([*args, "--engine", "vllm@0.15"]) == 1  # engine/serving.py:1083: prompt + max_tokens > max_model_len
    captured = capsys.readouterr()
    assert "a request of 42,000 tokens (ISL 40,000 + OSL 2,000) is longer than model qwen3-8b's context of 40,960 " \
           "tokens (max_position_embeddings): vllm 0.15.1 refuses such requests (refused: prompt + output above " \
           "40,960 tokens, at the context its server defaults to, the model's); fix: shorter requests" in captured.out
    assert "does not fit" in captured.err
    assert main([*args, "--engine", "huggingface"]) == 0
    out = capsys.readouterr().out
    assert "huggingface runs it, but the model was not trained on positions that far" in out
    assert main(["--model", "qwen3-8b", "--hardware", "h100", "--engine", "vllm@0.15", "--isl", "38960",
                 "--osl", "2000"]) == 0  # exactly the context
    assert "context of" not in capsys.readouterr().out


def test_a_vllm_pool_is_whole_blocks_of_16_tokens():
    config = config_from_mapping({"model": "qwen3-8b", "hardware": "h100", "engine": "vllm", "deployment": ONE_GPU,
                                  "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")
    settings = settings_from_engine(config, 1000, 200, offline=False)
    memory = memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine,
                           8192)
    tokens = int(memory.kv_capacity_bytes / memory.kv_bytes_per_token_per_gpu)
    assert settings.page_size == 16 and settings.kv_capacity_tokens == tokens // 16 * 16


def test_a_given_pool_gives_sglang_its_own_cap_and_a_launch_leaves_the_cap_to_it():
    from infersim.launch.assumed import assumed_for_pool
    from infersim.serve.settings import derived_running_cap

    config = config_from_mapping({"model": "qwen3-8b", "hardware": "h100", "engine": "sglang", "deployment": ONE_GPU,
                                  "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")
    assert derived_running_cap(config, 3000) == 1500  # half the pool: below the 2,048 floor
    settings = settings_from_engine(config, 1000, 200, offline=False)
    assert settings.cap_derived_by_engine and assumed_for_pool(config, settings, "server", 1).running_cap == 0
    vllm = config_from_mapping({"model": "qwen3-8b", "hardware": "h100", "engine": "vllm", "deployment": ONE_GPU,
                                "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")
    vllm_settings = settings_from_engine(vllm, 1000, 200, offline=False)
    assert not vllm_settings.cap_derived_by_engine
    assert assumed_for_pool(vllm, vllm_settings, "server", 1).running_cap == 1024


def test_serve_rejects_requests_beyond_the_context_as_the_server_does(capsys):
    import json

    args = ["serve", "--model", "qwen3-8b", "--hardware", "h100", "--engine", "vllm@0.15", "--rate", "2",
            "--num-requests", "6", "--osl", "2000", "--isl", "40000", "--format", "json"]
    main(args)
    out = json.loads(capsys.readouterr().out)
    assert (out["rejected"], out["completed"]) == (6, 0)
    assert "6 requests longer (prompt + output) than model qwen3-8b's context of 40,960 tokens were rejected on " \
           "arrival: max_model_len not given, vllm defaults it to the model's max_position_embeddings" in out["notes"]
    assert main([*args, "--max-model-len", "50000"]) == 0  # a longer max_model_len given: taken
    out = json.loads(capsys.readouterr().out)
    assert (out.get("rejected", 0), out["completed"]) == (0, 6)
    assert [n for n in out["notes"] if "context of" in n] == [
        "max_model_len 50,000 is above model qwen3-8b's context of 40,960 tokens (max_position_embeddings): vllm "
        "starts with it only when VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set, and the model's output quality past its "
        "trained context is not assured; 6 requests longer than that (prompt + output) were served"]


def test_sglang_0_5_2_refuses_a_request_that_fills_the_context_but_vllm_takes_it(capsys):
    args = ["--model", "llama-2-7b", "--hardware", "h100", "--isl", "3996", "--osl", "100"]
    assert main([*args, "--engine", "vllm@0.15"]) == 0  # 4,096 tokens: vLLM refuses only longer ones
    capsys.readouterr()
    assert main([*args, "--engine", "sglang@0.5"]) == 1  # tokenizer_manager: input + max_new_tokens >= context_len
    assert "a request of 4,096 tokens (ISL 3,996 + OSL 100) fills model llama-2-7b's context of 4,096 tokens " \
           "(max_position_embeddings): sglang 0.5 refuses such requests (refused: prompt + output above 4,095 tokens" \
        in capsys.readouterr().out
    assert load_engine_card("sglang@0.5")[0].longest_request(4096) == 4094  # and the scheduler keeps 2 free
    assert load_engine_card("sglang")[0].longest_request(4096) == 4094
    assert load_engine_card("vllm")[0].longest_request(4096) == 4096


def test_generate_refuses_beyond_the_context_where_the_server_does(capsys):
    args = ["generate", "--model", "llama-2-7b", "--hardware", "h100", "--prompt-len", "8000", "--gen-len", "200",
            "--batch", "1"]
    assert main([*args, "--engine", "vllm@0.15"]) == 1
    err = capsys.readouterr().err
    assert "a request of 8,200 tokens (ISL 8,000 + OSL 200) is longer than model llama-2-7b's context of 4,096 " \
           "tokens (max_position_embeddings): vllm 0.15.1 refuses such requests (refused: a prompt of 4,096 tokens or " \
           "more, at the context its server defaults to, the model's). Try: shorter prompts or generations" in err
    assert main([*args, "--engine", "huggingface"]) == 0
    assert "huggingface runs it, but the model was not trained on positions that far" in capsys.readouterr().out


def test_a_rope_scaling_factor_stretches_the_imported_context():
    linear = {**TINY_HF, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}}
    assert card_fields_from_hf(linear, "t.json", "t")["max_position_embeddings"] == 16384
    yarn = {**TINY_HF, "max_position_embeddings": 40960,
            "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}}
    fields = card_fields_from_hf(yarn, "t.json", "t")
    assert fields["max_position_embeddings"] == 40960  # the engines disagree, and the card's source says so
    assert fields["source"].endswith("; context: the config's max_position_embeddings 40,960, as SGLang takes it; "
                                     "vLLM takes YaRN's original_max_position_embeddings x factor = 131,072 "
                                     "(--set model.max_position_embeddings=N for a vLLM run that relies on it)")
    agreed = {**TINY_HF, "max_position_embeddings": 163840,
              "rope_scaling": {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}
    fields = card_fields_from_hf(agreed, "t.json", "t")  # DeepSeek-V3's: both engines take 163,840
    assert fields["max_position_embeddings"] == 163840 and "context" not in fields["source"]
    llama3 = {**TINY_HF, "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8}}
    assert card_fields_from_hf(llama3, "t.json", "t")["max_position_embeddings"] == 131072


def test_a_clamp_whose_ends_cross_is_refused(capsys):
    code = main(["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "sglang",
                 "--set", "engine.scheduler.running_cap_from_pool.min_requests=5000"])
    err = capsys.readouterr().err
    assert code == 2 and "running_cap_from_pool.min_requests" in err and "above max_requests (4096)" in err


def test_a_batch_above_the_default_cap_fits_and_says_the_cap_to_raise(capsys):
    args = ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--isl", "100", "--osl", "100"]
    # max_num_seqs 1,024 by default; the KV cache holds 2,318 (60.78 GB after the activations of vLLM's
    # profiled 8,192-token step, over 200 tokens x 131,072 bytes)
    assert main([*args, "--batch-per-gpu", "1100"]) == 0
    assert ("decode batch 1,100 per GPU is above vllm's default running-request cap (1,024 per GPU): a server runs "
            "it only with a larger cap (--max-num-seqs; --emit-launch sets it)") in capsys.readouterr().out
    assert main([*args, "--batch-per-gpu", "3000"]) == 1
    assert "at most 2,318 requests per GPU fit" in capsys.readouterr().out


def test_a_model_card_without_a_context_is_said(capsys):
    assert main(["--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm",
                 "--set", "model.max_position_embeddings=0"]) == 0
    assert "model card llama-2-7b states no context length (max_position_embeddings)" in capsys.readouterr().out


def test_a_max_model_len_is_sglangs_context_for_its_cap(capsys):
    import json

    args = ["serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "sglang", "--rate", "2",
            "--num-requests", "4", "--isl", "1000", "--osl", "100", "--format", "json"]
    main(args)
    default = json.loads(capsys.readouterr().out)["pools"][0]
    main([*args, "--max-model-len", "8192"])
    given = json.loads(capsys.readouterr().out)["pools"][0]
    pool = default["kv_capacity_tokens"]
    assert default["max_running_requests"] == min(max(pool * 512 // 131072, 2048), 4096) < 4096
    assert given["max_running_requests"] == 4096  # pool / 8,192 x 512 is far above the clamp


def test_sglangs_cap_is_of_a_given_pool_and_a_max_model_len_together():
    from infersim.serve.api import simulate_serving

    config = config_from_mapping({"model": "qwen3-8b", "hardware": "h100", "engine": "sglang", "deployment": ONE_GPU,
                                  "workload": {"isl": 1000, "osl": 100}}, "test", mfu_tables="none")
    load = {"rate": 2, "num_requests": 2, "isl": 1000, "osl": 100}
    caps = [simulate_serving(config, {**load, **given})["pools"][0]["max_running_requests"]
            for given in ({"kv_capacity_tokens": 20_000}, {"kv_capacity_tokens": 20_000, "max_model_len": 4000})]
    # 20,000 / 40,960 (the model's context) x 512 = 250, raised to 2,048; at max_model_len 4,000 the server
    # runs at a context of 4,002 (SGLang 0.5.23 keeps 2 tokens free: context_limit.output_margin, the value
    # --emit-launch gives --context-length): 20,000 / 4,002 x 512 = 2,558
    assert caps == [2048, 2558]


def test_sweeps_reject_variants_whose_requests_the_server_refuses(capsys, tmp_path):
    import json

    out = tmp_path / "sweep.json"
    assert main(["sweep", "--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm@0.15", "--num-gpus", "1",
                 "--grid", "workload.isl=1000,3900", "--osl", "200", "--workers", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["fits"] and rows[1]["status"] == "rejected"
    assert rows[1]["problem"] == ("a request of 4,100 tokens (ISL 3,900 + OSL 200) is longer than model llama-2-7b's "
                                 "context of 4,096 tokens (max_position_embeddings): vllm 0.15.1 refuses such requests "
                                 "(refused: prompt + output above 4,096 tokens, at the context its server defaults "
                                 "to, the model's)")
    capsys.readouterr()
    code = main(["pareto", "--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm", "--gpus", "1,2",
                 "--isl", "8000", "--osl", "200", "--batch", "1,8", "--workers", "1"])
    assert code != 0 and "longer than model llama-2-7b's context of 4,096 tokens" in capsys.readouterr().err
