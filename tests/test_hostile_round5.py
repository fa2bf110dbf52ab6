"""Hostile and careless use of the engine card's running_cap_flag and context_limit.kv_pool: user
cards with wrong values, --emit-launch with a flag the parser lacks or one InferSim sets for another
setting, KV pools of a token, of none per attention-DP rank and of part of a page, and main runs
whose request fits the KV cache but not SGLang's pool. Every failure is one message naming the
file, key and value; every request the pool cuts or refuses is counted and said."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import yaml

from infersim.base.errors import ConfigError, NotPossible
from infersim.cli.main import main
from infersim.run.config import config_from_mapping, load_engine_card
from infersim.serve.api import simulate_serving
from infersim.serve.settings import SchedulerSettings

ENGINES = Path(__file__).resolve().parent.parent / "engines"
ONE_GPU = {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1}}
DP2 = {"num_gpus": 2, "attention": {"tp": 1, "dp": 2}, "ffn": {"tp": 2}}


def _user_card(tmp_path: Path, bundled: str, **changes: object) -> str:
    """A copy of a bundled engine card with dotted fields changed, written to a user's file."""
    data = yaml.safe_load((ENGINES / f"{bundled}.yaml").read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return str(path)


@cache
def _config(engine: str, deployment: str = "one") -> object:
    dep = ONE_GPU if deployment == "one" else DP2
    return config_from_mapping({"model": "llama-2-7b", "hardware": "h100", "engine": engine, "deployment": dep,
                                "workload": {"isl": 1000, "osl": 100}}, "test", mfu_tables="none")


def _trace(tmp_path: Path, rows: list[tuple[int, int]]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": 5.0 * i, "input_tokens": isl, "output_tokens": osl}) + "\n"
                            for i, (isl, osl) in enumerate(rows)))
    return str(path)


def _counts(summary: dict) -> tuple:
    return tuple(summary.get(key) for key in ("completed", "rejected", "rejected_for_kv_pool",
                                              "shortened_for_kv_pool", "shortened_for_kv_pool_output_tokens",
                                              "total_output_tokens"))


# -- scheduler.running_cap_flag ------------------------------------------------------------------------


@pytest.mark.parametrize("value, problem", [
    (5, "expected text"), (["--max-num-seqs"], "expected text"), (True, "expected text"),
    ("", "expected the server's command-line flag"), ("max-num-seqs", "expected the server's command-line flag"),
    ("--máx-num-seqs", "expected the server's command-line flag"),
    ("--max num seqs", "expected the server's command-line flag"),
    ("--max-num-seqs=5", "expected the server's command-line flag"),
])
def test_a_user_cards_running_cap_flag_of_the_wrong_form_is_one_message(tmp_path, value, problem):
    path = _user_card(tmp_path, "vllm-0.33", scheduler__running_cap_flag=value)
    with pytest.raises(ConfigError) as caught:
        load_engine_card(path)
    assert (caught.value.source, caught.value.field, caught.value.value) == (path, "scheduler.running_cap_flag", value)
    assert problem in caught.value.problem


ABOVE_CAP = ["--model", "qwen3-0.6b", "--hardware", "h100-sxm", "--tp", "1", "--mfu-tables", "none", "--isl", "100", "--osl", "100",
             "--batch-per-gpu", "2000"]  # above vLLM's 1,024 on an H100; the KV cache holds 3,334


def test_emit_launch_names_the_card_file_and_key_of_a_flag_its_parser_lacks(tmp_path, capsys):
    path = _user_card(tmp_path, "vllm-0.33", scheduler__running_cap_flag="--foo-bar")
    assert main([*ABOVE_CAP, "--engine", path, "--emit-launch"]) == 2
    assert capsys.readouterr().err == (
        f"infersim: error: {path}: field 'scheduler.running_cap_flag' (value: '--foo-bar'): --emit-launch: vLLM "
        "0.33.0's parser has no such flag (engines/launch/vllm-0.33.0.yaml): the running-request cap of 2000 the "
        "simulation ran cannot be set\n")


@pytest.mark.parametrize("flag, clause", [
    ("--foo-bar", "--foo-bar; --emit-launch cannot set it: vLLM 0.33.0's parser has no such flag"),
    ("--kv-cache-dtype", "--kv-cache-dtype; --emit-launch cannot set it: vLLM 0.33.0's parser has --kv-cache-dtype as "
                         "a choice, not a whole number"),
    ("--max-num-seqs", "--max-num-seqs; --emit-launch sets it"),
])
def test_the_plain_runs_cap_sentence_says_whether_emit_launch_can_set_the_cards_flag(tmp_path, capsys, flag, clause):
    """The run's warning promises --emit-launch only for a flag the engine's parser data has as a whole number."""
    path = _user_card(tmp_path, "vllm-0.33", scheduler__running_cap_flag=flag)
    assert main([*ABOVE_CAP, "--engine", path]) == 0
    assert f"a server runs it only with a larger cap ({clause})\n" in capsys.readouterr().out


def test_a_flag_set_by_set_is_said_to_come_from_set_not_from_the_card_file(capsys):
    """The bundled card's file does not hold a value --set gave it: the message says the overrides."""
    assert main([*ABOVE_CAP, "--engine", "vllm", "--emit-launch", "--set",
                 "engine.scheduler.running_cap_flag=--foo-bar"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infersim: error: ")
    assert "engines/vllm-0.33.yaml with --set overrides: field 'scheduler.running_cap_flag' (value: '--foo-bar'): " \
        "--emit-launch: vLLM 0.33.0's parser has no such flag" in err


def test_emit_launch_refuses_a_running_cap_flag_that_sets_another_setting_too(tmp_path, capsys):
    """--max-model-len named as the running cap's flag: the command would set it twice (to the cap and to
    the context), and vLLM would take the last."""
    path = _user_card(tmp_path, "vllm-0.33", scheduler__running_cap_flag="--max-model-len")
    serve = ["serve", "--model", "qwen3-0.6b", "--hardware", "h100-sxm", "--tp", "1", "--isl", "100", "--osl", "100",
             "--num-requests", "2", "--concurrency", "2", "--engine", path, "--emit-launch"]
    assert main([*serve, "--max-model-len", "4096"]) == 2
    assert capsys.readouterr().err == (
        "infersim: error: --emit-launch: vLLM 0.33.0's --max-model-len would be set twice: to 1024 for running "
        "requests per DP rank, and to 4096 for longest request, prompt + output tokens; "
        f"{path}: scheduler.running_cap_flag names it for the running-request cap: the command cannot be spelled\n")


# -- context_limit.kv_pool: the card ---------------------------------------------------------------------


@pytest.mark.parametrize("kv_pool, field, value, problem", [
    ({"margins": True, "size": 1}, "context_limit.kv_pool.size", 1, "unknown key"),
    ({"margins": "true"}, "context_limit.kv_pool.margins", "true", "expected true or false"),
    ({"margins": True, "empty_pool_fit": {"pages_free": 1.5, "tokens_free": 1}},
     "context_limit.kv_pool.empty_pool_fit.pages_free", 1.5, "expected a whole number"),
    ({"margins": True, "empty_pool_fit": {"pages_free": True, "tokens_free": 1}},
     "context_limit.kv_pool.empty_pool_fit.pages_free", True, "expected a whole number"),
    ({"margins": True, "empty_pool_fit": {"pages_free": 1, "tokens_free": 10 ** 10}},
     "context_limit.kv_pool.empty_pool_fit.tokens_free", 10 ** 10, "must be at most"),
    ({"margins": True, "empty_pool_fit": [1, 1]}, "context_limit.kv_pool.empty_pool_fit", [1, 1], "expected a mapping"),
    ("margins", "context_limit.kv_pool", "margins", "expected a mapping"),
])
def test_a_user_cards_kv_pool_of_the_wrong_form_is_one_message(tmp_path, kv_pool, field, value, problem):
    path = _user_card(tmp_path, "sglang-0.5.23", context_limit__kv_pool=kv_pool)
    with pytest.raises(ConfigError) as caught:
        load_engine_card(path)
    assert (caught.value.source, caught.value.field, caught.value.value) == (path, field, value)
    assert problem in caught.value.problem


def test_kv_pool_null_is_no_pool_and_a_kv_pool_on_a_shortening_engine_is_taken(tmp_path):
    assert load_engine_card(_user_card(tmp_path, "sglang-0.5.23", context_limit__kv_pool=None))[0] \
        .context_limit.kv_pool is None
    rule = load_engine_card(_user_card(tmp_path, "trtllm", context_limit__kv_pool={"margins": True}))[0].context_limit
    assert (rule.beyond, rule.pool_output(1000, 32, 900, 200), rule.pool_prompt_limit(1000, 32)) == (
        "shorten_output", 100, 1000)


# -- context_limit.kv_pool: serve ------------------------------------------------------------------------


def test_a_pool_that_holds_no_prompt_refuses_every_request_and_says_so(tmp_path):
    """SGLang 0.5.23 at a pool of 5 tokens: max_req_len 4, max_req_input_len -1: every prompt is aborted."""
    summary = simulate_serving(_config("sglang"), {"mode": "trace", "trace": _trace(tmp_path, [(1, 1), (2, 5)]),
                                                   "kv_capacity_tokens": 5})
    assert _counts(summary) == (0, 2, 2, None, None, 0)
    assert summary["rejected_as_longer_than"] == (
        "model llama-2-7b's context of 4,096 tokens (max_position_embeddings), the max_model_len sglang defaults to, "
        "or with any prompt (its KV pool holds 5 tokens)")
    assert summary["notes"] == [
        "sglang 0.5.23 holds a request to its KV pool of 5 tokens per scheduler, fewer than its context of 4,096 "
        "tokens: 2 requests were rejected on arrival, as every prompt is (engine card context_limit.kv_pool)"]


def test_a_pool_of_one_token_is_said_in_the_singular(tmp_path):
    summary = simulate_serving(_config("sglang", "dp2"), {"mode": "trace", "trace": _trace(tmp_path, [(1, 1)]),
                                                          "kv_capacity_tokens": 2})
    assert _counts(summary) == (0, 1, 1, None, None, 0)
    assert summary["notes"][0].startswith("sglang 0.5.23 holds a request to its KV pool of 1 token per scheduler, ")
    assert summary["rejected_as_longer_than"].endswith("or with any prompt (its KV pool holds 1 token)")


def test_an_attention_dp_rank_with_no_token_of_the_pool_refuses_every_request(tmp_path):
    """2 tokens over 2 DP ranks leave each scheduler 1, which holds no prompt: every request is refused.
    1 token leaves each none: the pool given holds no whole page, refused up front as a pool the
    engine derives is (before, a pool of 0 per rank was taken for no pool, and a smaller pool served
    what a larger one refused)."""
    rows = [(1, 1), (1, 1)]
    summary = simulate_serving(_config("sglang", "dp2"), {"mode": "trace", "trace": _trace(tmp_path, rows),
                                                          "kv_capacity_tokens": 2})
    assert _counts(summary) == (0, 2, 2, None, None, 0)
    assert summary["notes"][0].startswith("sglang 0.5.23 holds a request to its KV pool of 1 token per scheduler")
    with pytest.raises(NotPossible) as caught:
        simulate_serving(_config("sglang", "dp2"), {"mode": "trace", "trace": _trace(tmp_path, rows),
                                                    "kv_capacity_tokens": 1})
    assert str(caught.value) == ("does not fit: the KV pool given (kv_capacity_tokens 1) holds no whole page of 1 "
                                 "token on each of 2 attention-DP ranks: it holds no request")


def test_a_pool_of_part_of_a_page_is_held_to_its_whole_pages(tmp_path):
    """A card whose scheduler reserves whole pages (TensorRT-LLM, pages of 32 on an H100) and cuts the output to
    the empty pool: 1,000 tokens are 31 whole pages, 992 tokens. 990 + 10 leaves no page for an output token
    (before: 8 output tokens taken, then refused by the scheduler); 900 + 200 runs 992 - 928 = 64."""
    path = _user_card(tmp_path, "trtllm",
                      context_limit__kv_pool={"margins": False, "empty_pool_fit": {"pages_free": 0, "tokens_free": 0}})
    summary = simulate_serving(_config(path), {"mode": "trace", "trace": _trace(tmp_path, [(990, 10), (900, 200)]),
                                               "kv_capacity_tokens": 1000})
    assert _counts(summary) == (1, 1, 1, 1, 136, 64)
    assert summary["notes"] == [
        "trtllm 1.0 holds a request to its KV pool of 992 tokens per scheduler, fewer than its context of 4,096 "
        "tokens: 1 request with a prompt of 961 tokens or more was rejected on arrival (trtllm runs it with no output "
        "token: no answer comes back), and 1 request was admitted with its output cut to what the empty pool holds "
        "beside the prompt: the pool less the prompt in whole pages of 32 tokens: 136 output tokens fewer in all "
        "(engine card context_limit.kv_pool)"]
    # the scheduler holds the same whole pages the note names, and says what became of the pool given
    pool = summary["pools"][0]
    assert pool["kv_capacity_tokens"] == 992
    assert "KV pool 992 tokens (" in pool["scheduler"]
    assert pool["scheduler"].endswith("; KV pool 1,000 tokens given, held as 992 tokens (whole pages of 32))")


def test_a_given_pool_is_each_attention_dp_ranks_whole_pages():
    """1,000 tokens over 2 attention-DP ranks in pages of 16: 500 each, 496 in whole pages, 992 in all."""
    from infersim.serve.settings import GivenLimits, _with_given

    settings = SchedulerSettings(token_budget=1 << 30, max_running=8, mixed=True, policy="decode-first",
                                 admission="on-demand", page_size=16, chunked=False, prefix_cache=False,
                                 kv_capacity_tokens=10_000, reservation=None, origin="test", dp_ranks=2)
    given = _with_given(settings, None, GivenLimits(0, 0, 1000, None))  # type: ignore[arg-type]
    assert given.kv_capacity_tokens == 992
    assert given.origin == "test; KV pool 1,000 tokens given, held as 992 tokens (whole pages of 16 on each of 2 " \
        "attention-DP ranks)"
    assert _with_given(settings, None, GivenLimits(0, 0, 992, None)).origin == "test; KV pool 992 tokens given"  # type: ignore[arg-type]


def test_a_request_no_kv_pool_holds_says_so_in_plain_numbers():
    """A pool of less than a page held no request, and was said to hold one of -7 tokens."""
    settings = SchedulerSettings(token_budget=1 << 30, max_running=0, mixed=True, policy="decode-first",
                                 admission="on-demand", page_size=16, chunked=False, prefix_cache=False,
                                 kv_capacity_tokens=0, reservation=None, origin="test")
    with pytest.raises(NotPossible) as caught:
        settings.refuse_unfit(0, 100, 100)
    assert str(caught.value) == ("request 0: 100 + 100 tokens do not fit in the instance's KV cache of 0 tokens: alone "
                                 "they need 206.5 (on-demand in pages of 16); it holds no request")
    with pytest.raises(NotPossible) as caught:
        replace(settings, page_size=1, kv_capacity_tokens=1).refuse_unfit(3, 2, 1)
    assert str(caught.value).endswith("KV cache of 1 token: alone they need 2 (on-demand in pages of 1); the longest "
                                      "request it runs holds 2 tokens")


# -- context_limit.kv_pool: the main run ----------------------------------------------------------------


L4 = ["--model", "qwen3-8b", "--hardware", "l4", "--engine", "sglang"]  # SGLang 0.5.23's pool: 864 tokens


@pytest.mark.parametrize("isl, osl, said", [
    # 863 tokens fit the KV cache, but SGLang runs the output cut to 864 - 2 - 500 = 362
    (500, 363, "a request of 863 tokens (ISL 500 + OSL 363) fits the KV cache, but sglang 0.5.23 runs it with its "
               "output cut to 362 tokens: its scheduler holds a request to its KV pool of 864 tokens (engine card "
               "context_limit.kv_pool; --osl 362 simulates that)"),
    # a prompt of 864 - 6 = 858 tokens SGLang aborts, though 859 tokens fit
    (858, 1, "a request of 859 tokens (ISL 858 + OSL 1) fits the KV cache, but sglang 0.5.23 rejects it on arrival: "
             "its scheduler holds a request to its KV pool of 864 tokens, which takes no prompt of 858 tokens or more "
             "(engine card context_limit.kv_pool)"),
])
def test_a_request_that_fits_the_kv_cache_but_not_sglangs_pool_is_not_run_as_asked(capsys, isl, osl, said):
    assert main([*L4, "--isl", str(isl), "--osl", str(osl)]) == 1
    assert f"infersim: does not fit: {said}; fix: " in capsys.readouterr().err
    assert main([*L4, "--isl", "500", "--osl", "362"]) == 0  # what it serves runs


def test_a_batch_of_two_where_one_request_fits_says_one_request_fits(capsys):
    assert main([*L4, "--isl", "500", "--osl", "362", "--batch-per-gpu", "2"]) == 1
    assert "over by 0.13 GB; at most 1 request per GPU fits; fix: a batch of at most 1 per GPU (--batch-per-gpu 1," \
        in capsys.readouterr().err


def test_a_weight_offload_leaves_sglangs_pool_the_tokens_it_keeps_free():
    """weight_offload auto sizes the KV cache to the workload: one request of 1,500 tokens alone, which
    SGLang's pool holds as asked only at 1,502 tokens (output <= pool - 2 - prompt); the run fits and
    runs its 1,000 output tokens (at a pool of 1,500 SGLang would run 998). In pages of 64 a one-token
    prompt and output need 3 pages: the prompt's, the page kept free and one for the output token."""
    from infersim.run.simulate import simulate

    config = config_from_mapping({"model": "qwen3-8b", "hardware": "l4", "engine": "sglang",
                                  "deployment": {"num_gpus": 1, "weight_offload": "auto"},
                                  "workload": {"isl": 500, "osl": 1000}}, "test", mfu_tables="none")
    rule = config.engine.context_limit
    assert (rule.pool_for(1, 500, 1000), rule.pool_for(64, 500, 1000), rule.pool_for(64, 1, 1)) == (1502, 1600, 192)
    assert (rule.pool_output(1502, 1, 500, 1000), rule.pool_output(1501, 1, 500, 1000)) == (1000, 999)
    assert (rule.pool_output(1600, 64, 500, 1000), rule.pool_output(1536, 64, 500, 1000)) == (1000, 959)
    result = simulate(config)
    assert result.memory.weight_offload is not None and not result.unfit
    assert result.memory.pool_tokens(1) >= 1502 and config.workload.osl == 1000


# -- sweeps: TensorRT-LLM cuts the output -----------------------------------------------------------------


def test_a_sweeps_csv_says_the_osl_each_row_was_timed_with(tmp_path, capsys):
    """TensorRT-LLM 1.0 cuts a 4,000 + 500 request to 96 output tokens at llama-2-7b's 4,096-token context:
    the CSV's rows say so (before, only the note on stderr and the JSON's shortened_output did)."""
    out = tmp_path / "sweep.csv"
    assert main(["sweep", "--model", "llama-2-7b", "--hardware", "h100", "--engine", "trtllm", "--num-gpus", "1",
                 "--isl", "4000", "--grid", "workload.osl=50,500", "--workers", "1",
                 "--out", str(out)]) == 0
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [(r["workload.osl"], r["osl_timed"]) for r in rows] == [("50", "50"), ("500", "96")]
    assert "trtllm 1.0 cuts its output to 96 tokens" in capsys.readouterr().err


def test_one_configuration_above_the_running_cap_is_said_in_the_singular(capsys):
    assert main(["sweep", "--model", "qwen3-0.6b", "--hardware", "h100-sxm", "--engine", "vllm", "--tp", "1", "--isl",
                 "100", "--osl", "100", "--grid", "workload.decode_batch_per_gpu=8,2000", "--workers", "1"]) == 0
    assert ("note: 1 configuration runs a decode batch above vllm's default running-request cap (1,024 per GPU): it "
            "fits where the KV cache holds the batch, and a server runs it only with a larger cap (--max-num-seqs; "
            "--emit-launch sets it)") in capsys.readouterr().err


def test_the_context_cut_note_names_the_context_alone_where_the_pool_binds_too(tmp_path):
    """max_model_len 999 (context 1,001) and a pool of 1,000: 990 + 10 runs 9 output tokens by the context,
    8 by the pool; each note says its own limit (before, the context's note said the pool's prompt limit in
    nested parentheses)."""
    summary = simulate_serving(_config("sglang"), {"mode": "trace", "trace": _trace(tmp_path, [(990, 10), (1, 1)]),
                                                   "kv_capacity_tokens": 1000, "max_model_len": 999})
    assert _counts(summary) == (2, None, None, 1, 1, 9)
    assert summary["notes"][0] == (
        "1 request longer (prompt + output) than sglang 0.5.23 runs whole at a context of 1,001 tokens (max_model_len "
        "999, or with a prompt of 995 tokens or more) was admitted with its output cut to the context less the prompt "
        "and the 2 tokens it keeps free: 1 output token fewer in all (engine card context_limit.beyond refuse)")


def test_a_card_that_keeps_one_token_free_is_said_in_the_singular(tmp_path):
    path = _user_card(tmp_path, "sglang-0.5.23", context_limit__output_margin=1)
    summary = simulate_serving(_config(path), {"mode": "trace", "trace": _trace(tmp_path, [(990, 10)]),
                                               "max_model_len": 999})
    assert summary["notes"] == [
        "1 request longer (prompt + output) than sglang 0.5.23 runs whole at a context of 1,000 tokens (max_model_len "
        "999, or with a prompt of 994 tokens or more) was admitted with its output cut to the context less the prompt "
        "and the 1 token it keeps free: 1 output token fewer in all (engine card context_limit.beyond refuse)"]


@pytest.mark.parametrize("engine, page, page_bytes", [("vllm", 16, "1,835,008"), ("sglang", 64, "7,340,032")])
def test_a_kv_space_of_less_than_a_page_is_a_pool_that_holds_no_request(capsys, engine, page, page_bytes):
    """3 bytes of KV space on a B200: before, every request refused by a max_model_len of 50 left a pool of 0
    tokens to divide the KV utilisation by (an internal error), and SGLang's pool rule took 0 for no pool."""
    assert main(["serve", "--model", "qwen3-0.6b", "--hardware", "b200", "--engine", engine, "--tp", "1",
                 "--num-requests", "2", "--concurrency", "2", "--isl", "100", "--osl", "100", "--max-model-len", "50",
                 "--set", "engine.memory.kv_fraction_of_free=2e-11", "--mfu-tables", "none"]) == 1
    assert capsys.readouterr().err.endswith(
        f"infersim: does not fit: the KV cache space {engine} leaves per GPU, 3 bytes, holds no whole page of {page} "
        f"tokens ({page_bytes} bytes): its KV pool holds no request\n")


def test_a_sweep_rejects_what_sglangs_pool_would_cut_as_the_main_run_does_not_fit_it(tmp_path):
    """The main run does not fit 500 + 363 tokens on L4 (SGLang's pool cuts the output to 362): a sweep
    row of the same configuration is rejected with the same reason, and 500 + 362 is a row."""
    out = tmp_path / "sweep.json"
    assert main(["sweep", *L4, "--isl", "500", "--grid", "workload.osl=362,363", "--grid", "workload.decode_batch_per_gpu=1",
                 "--workers", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "rejected"]
    assert rows[1]["problem"].startswith("a request of 863 tokens (ISL 500 + OSL 363) fits the KV cache, but sglang "
                                         "0.5.23 runs it with its output cut to 362 tokens")
