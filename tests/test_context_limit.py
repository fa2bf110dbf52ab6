"""An engine's context limit (engine card section context_limit): what its server does with a request
(prompt + output) longer than its context length. vLLM 0.11 and 0.15 refuse it; vLLM 0.33 cuts its
output to what fits (get_max_tokens) and refuses only a prompt that leaves no room, or more output
tokens than the context; SGLang refuses prompt + output above the context, cuts the output 2 tokens
short of it and refuses a prompt within 6 tokens of it; TensorRT-LLM 1.0 (PyTorch backend) cuts the
output at the context and checks no prompt + output; HF generate() runs past it. The serving
simulation admits such a request with the cut output and says how many were cut; the main run, sweeps
and generate simulate the cut OSL and say so."""

from __future__ import annotations

import copy
import json

import pytest

from cli_helpers import run_json
from core_fixtures import FREE_ENGINE
from infersim.base.errors import ConfigError
from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.config import config_from_mapping, load_engine_card
from infersim.serve.api import simulate_serving

ONE_GPU = {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1}}


def _card(**context_limit: object) -> EngineCard:
    data = copy.deepcopy(FREE_ENGINE)
    data["context_limit"] = context_limit
    return validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")


# -- the card section ---------------------------------------------------------------------------------


def test_a_bad_beyond_value_is_one_message_naming_file_key_and_value():
    with pytest.raises(ConfigError) as caught:
        _card(beyond="truncate")
    assert str(caught.value) == ("e.yaml: field 'context_limit.beyond' (value: 'truncate'): must be one of refuse, "
                                 "shorten_output, run")


@pytest.mark.parametrize("section, field, problem", [
    ({"beyond": "refuse", "refuse_beyond": 1}, "context_limit.refuse_beyond", "unknown key"),
    ({"beyond": "refuse", "output_margin": "two"}, "context_limit.output_margin", "expected a whole number"),
    ({"beyond": "refuse", "refuses_long_output": 1}, "context_limit.refuses_long_output", "expected true or false"),
    ({"beyond": "run", "output_margin": 2}, "context_limit.output_margin", "beyond run: the engine runs every"),
    ({"beyond": "shorten_output", "reserved_tokens": 1}, "context_limit.reserved_tokens", "applies to beyond refuse"),
    ({"beyond": "refuse", "output_margin": 3, "prompt_margin": 2}, "context_limit.output_margin",
     "above prompt_margin (2)"),
    ({"beyond": "refuse", "override": "VLLM_ALLOW_LONG_MAX_MODEL_LEN"}, "context_limit.override",
     "expected VARIABLE=VALUE"),
])
def test_the_section_is_validated_strictly(section, field, problem):
    with pytest.raises(ConfigError) as caught:
        _card(**section)
    assert caught.value.field == field and problem in caught.value.problem


def test_a_card_without_the_section_is_refused():
    data = copy.deepcopy(FREE_ENGINE)
    del data["context_limit"]
    with pytest.raises(ConfigError, match="'context_limit'.*required field is missing"):
        build(EngineCard, data, "e.yaml")


def test_each_bundled_engine_states_what_its_server_does():
    rules = {name: load_engine_card(name)[0].context_limit
             for name in ("vllm@0.11", "vllm@0.15", "vllm@0.33", "sglang@0.5", "sglang", "trtllm", "huggingface")}
    # a context of 4,096 tokens: a 3,000-token prompt asking for 2,000 tokens; then edge cases
    assert {name: rule.output_run(4096, 3000, 2000) for name, rule in rules.items()} == {
        "vllm@0.11": 0, "vllm@0.15": 0, "vllm@0.33": 1096, "sglang@0.5": 0, "sglang": 0, "trtllm": 1096,
        "huggingface": 2000}
    vllm, sglang, older = rules["vllm@0.33"], rules["sglang"], rules["sglang@0.5"]
    assert (vllm.output_run(4096, 4095, 10), vllm.output_run(4096, 4096, 1), vllm.output_run(4096, 10, 4097)) == \
        (1, 0, 0)  # a prompt must leave room for one token; more output tokens than the context are refused
    assert (sglang.output_run(4096, 3996, 100), sglang.output_run(4096, 3996, 101)) == (98, 0)
    assert (sglang.output_run(4096, 4089, 7), sglang.output_run(4096, 4090, 1)) == (5, 0)  # prompts of 4,090+ refused
    assert (older.output_run(4096, 3996, 99), older.output_run(4096, 3996, 100)) == (98, 0)  # >= the context refused
    assert rules["vllm@0.15"].output_run(4096, 3000, 1096) == 1096 and vllm.output_run(0, 90_000, 90_000) == 90_000


# -- serve ---------------------------------------------------------------------------------------------


def _config(engine: str, model: str = "qwen3-8b") -> object:
    return config_from_mapping({"model": model, "hardware": "h100", "engine": engine, "deployment": ONE_GPU,
                                "workload": {"isl": 1000, "osl": 100}}, "test", mfu_tables="none")


LONGER = {"mode": "poisson", "rate": 2, "num_requests": 6, "isl": 3000, "osl": 2000, "max_model_len": 4096}


def test_vllm_0_33_serves_requests_longer_than_max_model_len_with_their_output_cut():
    summary = simulate_serving(_config("vllm@0.33"), LONGER)
    # each request: 3,000 + 2,000 tokens against 4,096: 1,096 output tokens run, 904 cut
    assert (summary["completed"], summary["failed"], summary["total_output_tokens"]) == (6, 0, 6 * 1096)
    assert (summary["shortened"], summary["shortened_output_tokens"]) == (6, 6 * 904)
    assert summary["notes"] == [
        "6 requests longer (prompt + output) than vllm 0.33.0 runs whole at a context of 4,096 tokens (max_model_len "
        "4,096) were admitted with their output cut to the context less the prompt: 5,424 output tokens fewer in all "
        "(engine card context_limit.beyond shorten_output)"]


def test_vllm_0_15_rejects_them_and_0_33_rejects_a_prompt_that_leaves_no_room():
    refused = simulate_serving(_config("vllm@0.15"), LONGER)
    assert (refused["completed"], refused["rejected"], refused.get("shortened")) == (0, 6, None)
    assert refused["rejected_as_longer_than"] == "max_model_len 4,096"
    prompt = simulate_serving(_config("vllm@0.33"), {**LONGER, "isl": 4096, "osl": 10})
    assert (prompt["completed"], prompt["rejected"], prompt.get("shortened")) == (0, 6, None)


def test_sglang_cuts_the_output_two_tokens_short_of_the_context_and_refuses_prompts_within_six():
    # llama-2-7b's context is 4,096 tokens, SGLang's context_len when none is given
    config = _config("sglang", "llama-2-7b")
    cut = simulate_serving(config, {"mode": "poisson", "rate": 2, "num_requests": 4, "isl": 3996, "osl": 100})
    assert (cut["completed"], cut["total_output_tokens"], cut["shortened_output_tokens"]) == (4, 4 * 98, 4 * 2)
    assert cut["notes"] == [
        "4 requests longer (prompt + output) than sglang 0.5.23 runs whole at a context of 4,096 tokens (model "
        "llama-2-7b's context of 4,096 tokens (max_position_embeddings), the max_model_len sglang defaults to, or "
        "with a prompt of 4,090 tokens or more) were admitted with their output cut to the context less the prompt "
        "and the 2 tokens it keeps free: 8 output tokens fewer in all (engine card context_limit.beyond refuse)"]
    near = simulate_serving(config, {"mode": "poisson", "rate": 2, "num_requests": 4, "isl": 4090, "osl": 1})
    assert (near["completed"], near["rejected"]) == (0, 4)
    assert near["notes"][0] == (
        "4 requests longer (prompt + output) than model llama-2-7b's context of 4,096 tokens, or with a prompt of "
        "4,090 tokens or more, were rejected on arrival: max_model_len not given, sglang defaults it to the model's "
        "max_position_embeddings")


def test_trtllm_serves_them_with_their_output_cut_at_max_seq_len_and_refuses_no_long_output():
    summary = simulate_serving(_config("trtllm"), LONGER)
    # each request: 3,000 + 2,000 tokens against 4,096: the sampler ends it at 4,096, after 1,096 output tokens
    assert (summary["completed"], summary["failed"], summary["total_output_tokens"]) == (6, 0, 6 * 1096)
    assert (summary["shortened"], summary["shortened_output_tokens"], summary.get("rejected", 0)) == (6, 6 * 904, 0)
    assert summary["notes"] == [
        "6 requests longer (prompt + output) than trtllm 1.0 runs whole at a context of 4,096 tokens (max_model_len "
        "4,096) were admitted with their output cut to the context less the prompt: 5,424 output tokens fewer in all "
        "(engine card context_limit.beyond shorten_output)"]
    rule = load_engine_card("trtllm")[0].context_limit
    assert (rule.output_run(4096, 4095, 10), rule.output_run(4096, 10, 5000), rule.output_run(4096, 4096, 1)) == \
        (1, 4086, 0)  # more output tokens than the context are cut, not refused; a prompt of the context is not run


def test_a_workloads_requests_are_cut_as_they_arrive():
    workload = {"data": {"type": "random", "input": 3000, "output": 2000}, "max_model_len": 4096,
                "load": {"stages": [{"rate": 2, "num_requests": 4}]}}
    summary = simulate_serving(_config("vllm@0.33"), {"workload": workload})
    assert (summary["completed"], summary["total_output_tokens"], summary["shortened"]) == (4, 4 * 1096, 4)
    assert any(n.startswith("4 requests longer (prompt + output) than vllm 0.33.0 runs whole") for n in summary["notes"])


# -- run, sweep, generate ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine, said", [("vllm@0.33", "vllm 0.33.0"), ("trtllm", "trtllm 1.0")])
def test_the_main_run_simulates_the_output_the_engine_runs(capsys, engine, said):
    data = run_json(capsys, "--model", "llama-2-7b", "--hardware", "h100", "--engine", engine, "--isl", "3900",
                    "--osl", "200")
    assert data["fits"] and data["workload"]["osl"] == 196  # 4,096 - 3,900
    assert data["warnings"][0] == (
        "a request of 4,100 tokens (ISL 3,900 + OSL 200) is longer than model llama-2-7b's context of 4,096 tokens "
        f"(max_position_embeddings): {said} cuts its output to 196 tokens, what fits (prompt + output up to the "
        "context its server defaults to, the model's; engine card context_limit.beyond shorten_output): OSL 196 "
        "simulated, not the 200 asked for")


def test_the_main_run_with_the_cut_output_asked_for_is_the_same_run(capsys):
    data = run_json(capsys, "--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm@0.33", "--isl", "3900",
                    "--osl", "200")
    asked = run_json(capsys, "--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm@0.33", "--isl", "3900",
                     "--osl", "196")
    assert asked["decode"] == data["decode"] and asked["memory"] == data["memory"]
    assert main(["--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm@0.33", "--isl", "4096",
                 "--osl", "10"]) == 1  # no room for an output token: refused
    assert "vllm 0.33.0 refuses such requests (refused: a prompt of 4,096 tokens or more, at the context its server " \
           "defaults to, the model's)" in capsys.readouterr().out


def test_a_sweep_times_the_cut_output_and_says_so(capsys, tmp_path):
    rows = {}
    for osl in ("200", "196"):
        out = tmp_path / f"sweep{osl}.json"
        assert main(["sweep", "--model", "llama-2-7b", "--hardware", "h100", "--engine", "vllm@0.33", "--num-gpus",
                     "1", "--grid", "workload.isl=1000,3900", "--osl", osl, "--workers", "1", "--out", str(out)]) == 0
        rows[osl] = json.loads(out.read_text())
    err = capsys.readouterr().err
    asked, cut = rows["200"], rows["196"]
    assert [r["status"] for r in asked["rows"]] == ["ok", "ok"]
    assert asked["rows"][1]["tpot_ms"] == cut["rows"][1]["tpot_ms"] and \
        asked["rows"][1]["batch_per_gpu"] == cut["rows"][1]["batch_per_gpu"]
    said = ("a request of 4,100 tokens (ISL 3,900 + OSL 200) is longer than model llama-2-7b's context of 4,096 "
            "tokens (max_position_embeddings): vllm 0.33.0 cuts its output to 196 tokens, what fits (prompt + output up "
            "to the context its server defaults to, the model's; engine card context_limit.beyond shorten_output)")
    assert asked["shortened_output"] == {said: 1} and cut["shortened_output"] == {}
    assert (f"infersim: note: 1 grid point asks for requests longer than the engine's server runs whole: its rows are "
            f"timed with the output it cuts them to, not the OSL of the grid: 1 x {said}") in err


def test_generate_runs_the_generation_the_engine_runs(capsys):
    args = ["generate", "--model", "llama-2-7b", "--hardware", "h100", "--prompt-len", "3900", "--gen-len", "200",
            "--batch", "1", "--engine"]
    assert main([*args, "vllm@0.33"]) == 0
    out = capsys.readouterr().out
    assert "vllm 0.33.0 cuts its output to 196 tokens" in out and "gen_len 196 simulated, not the 200 asked for" in out
    assert "decode timed step by step: 195 steps at KV length 3901..4095" in out
    assert main([*args, "vllm@0.15"]) == 1
