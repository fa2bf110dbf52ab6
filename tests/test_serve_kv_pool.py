"""SGLang holds a request to its KV pool as well as to its context (engine card context_limit.kv_pool):
its scheduler's max_req_len is min(context_len, pool) - 1, so with a pool shorter than the context a
prompt of pool - 6 tokens or more is aborted and an output cut to pool - 2 - prompt (0.5.2 and
0.5.23); 0.5.23 also cuts the output to what the empty pool holds beside the prompt in whole pages
(max_new_tokens_for_memory). serve applies both at one scheduler's pool and counts them apart from
the context's; the main run's does-not-fit message says what SGLang does instead. A multi-turn
conversation goes on with an answer as the server cut it, until the context refuses a turn."""

from __future__ import annotations

import copy
import json
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import FREE_ENGINE
from infersim.base.errors import ConfigError
from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.config import config_from_mapping, load_engine_card
from infersim.serve.api import simulate_serving
from infersim.serve.outcomes import Outcomes

ONE_GPU = {"num_gpus": 1, "attention": {"tp": 1}, "ffn": {"tp": 1}}
SGLANG = {"beyond": "refuse", "output_margin": 2, "prompt_margin": 6}


def _card(**context_limit: object) -> EngineCard:
    data = copy.deepcopy(FREE_ENGINE)
    data["context_limit"] = context_limit
    return validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")


@cache
def _config(engine: str, hardware: str = "h100", deployment: str = "one") -> object:
    dep = ONE_GPU if deployment == "one" else {"num_gpus": 2, "attention": {"tp": 1, "dp": 2}, "ffn": {"tp": 2}}
    return config_from_mapping({"model": "llama-2-7b", "hardware": hardware, "engine": engine, "deployment": dep,
                                "workload": {"isl": 1000, "osl": 100}}, "test", mfu_tables="none")


def _trace(tmp_path, rows: list[tuple[int, int]]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": 5.0 * i, "input_tokens": isl, "output_tokens": osl}) + "\n"
                            for i, (isl, osl) in enumerate(rows)))
    return str(path)


def _counts(summary: dict) -> tuple:
    return tuple(summary.get(key) for key in ("completed", "rejected", "rejected_for_kv_pool", "shortened",
                                              "shortened_for_kv_pool", "shortened_for_kv_pool_output_tokens",
                                              "total_output_tokens"))


# -- the card section ---------------------------------------------------------------------------------


@pytest.mark.parametrize("section, field, value, problem", [
    ({**SGLANG, "kv_pool": {"margins": True, "pages": 1}}, "context_limit.kv_pool.pages", 1, "unknown key"),
    ({**SGLANG, "kv_pool": {"margins": "yes"}}, "context_limit.kv_pool.margins", "yes", "expected true or false"),
    ({**SGLANG, "kv_pool": {}}, "context_limit.kv_pool.margins", None, "required field is missing"),
    ({**SGLANG, "kv_pool": {"margins": True, "empty_pool_fit": {"pages_free": -1, "tokens_free": 1}}},
     "context_limit.kv_pool.empty_pool_fit.pages_free", -1, "must be at least 0"),
    ({**SGLANG, "kv_pool": {"margins": True, "empty_pool_fit": {"pages_free": 1, "tokens_free": 1.5}}},
     "context_limit.kv_pool.empty_pool_fit.tokens_free", 1.5, "expected a whole number"),
    ({**SGLANG, "kv_pool": {"margins": False}}, "context_limit.kv_pool.margins", False, "says nothing the engine does"),
    ({"beyond": "run", "kv_pool": {"margins": True}}, "context_limit.kv_pool", {"margins": True}, "beyond run"),
])
def test_the_kv_pool_section_is_validated_strictly(section, field, value, problem):
    with pytest.raises(ConfigError) as caught:
        _card(**section)
    assert caught.value.field == field and problem in caught.value.problem
    assert str(caught.value).startswith(f"e.yaml: field '{field}'")
    if value is not None:
        assert f"(value: {value!r})" in str(caught.value) or f"(value: {value})" in str(caught.value)


def test_each_sglang_card_holds_a_request_to_its_pool_as_its_source_does():
    new, old = (load_engine_card(name)[0].context_limit for name in ("sglang", "sglang@0.5"))
    # a pool of 1,000 tokens in pages of 1: max_req_len 999, prompts of 994+ aborted, output <= 998 - prompt
    for rule in (new, old):
        assert (rule.pool_output(1000, 1, 900, 200), rule.pool_output(1000, 1, 993, 100),
                rule.pool_output(1000, 1, 994, 1), rule.pool_prompt_limit(1000, 1)) == (98, 5, 0, 994)
        assert rule.pool_output(None, 1, 900, 200) == 200  # no pool known: as asked
        assert (rule.pool_output(0, 1, 1, 5), rule.pool_prompt_limit(0, 1)) == (0, 0)  # a pool of nothing: none
    # pages of 64 (B200): 0.5.23 leaves 1,024 - 896 - 64 - 1 = 63; 0.5.2 only the margin's 1,024 - 2 - 896
    assert (new.pool_output(1024, 64, 896, 500), new.pool_output(1024, 64, 897, 500),
            new.pool_prompt_limit(1024, 64)) == (63, 0, 897)
    assert (old.pool_output(1024, 64, 896, 500), old.pool_prompt_limit(1024, 64)) == (126, 1018)
    assert all(load_engine_card(name)[0].context_limit.kv_pool is None for name in ("vllm@0.33", "trtllm"))


# -- serve --------------------------------------------------------------------------------------------


ROWS = [(900, 50), (900, 200), (990, 10), (994, 1), (5000, 10)]


@pytest.mark.parametrize("engine, version, kept", [("sglang", "0.5.23", ""), ("sglang@0.5", "0.5", " less the 1 token "
                                                                                                  "sglang keeps free")])
def test_serve_refuses_and_cuts_for_a_pool_shorter_than_the_context(tmp_path, engine, version, kept):
    """A pool of 1,000 tokens on a context of 4,096: 900 + 50 runs whole; 900 + 200 runs 98 output
    tokens and 990 + 10 runs 8 (102 + 2 cut); a 994-token prompt is aborted; 5,000 + 10 is the context's."""
    summary = simulate_serving(_config(engine), {"mode": "trace", "trace": _trace(tmp_path, ROWS),
                                                 "kv_capacity_tokens": 1000, "requests": True})
    assert _counts(summary) == (3, 2, 1, None, 2, 104, 50 + 98 + 8)
    assert [r["output_tokens"] for r in summary["requests"]] == [50, 98, 8]
    assert summary["rejected_as_longer_than"] == (
        f"model llama-2-7b's context of 4,096 tokens (max_position_embeddings){kept}, the max_model_len sglang "
        "defaults to, or with a prompt of 994 tokens or more (its KV pool holds 1,000 tokens)")
    assert summary["notes"] == [
        f"1 request longer (prompt + output) than model llama-2-7b's context of 4,096 tokens{kept}, or with a prompt "
        "of 4,090 tokens or more, was rejected on arrival: max_model_len not given, sglang defaults it to the model's "
        "max_position_embeddings",
        f"sglang {version} holds a request to its KV pool of 1,000 tokens per scheduler, fewer than its context of "
        "4,096 tokens: 1 request with a prompt of 994 tokens or more was rejected on arrival, and 2 requests were "
        "admitted with their output cut to the pool less the prompt and the 2 tokens it keeps free: 104 output tokens "
        "fewer in all (engine card context_limit.kv_pool)"]


def test_each_attention_dp_rank_holds_a_request_to_its_own_share_of_the_pool(tmp_path):
    summary = simulate_serving(_config("sglang", deployment="dp2"), {"mode": "trace", "trace": _trace(tmp_path, ROWS),
                                                                     "kv_capacity_tokens": 2000})
    assert _counts(summary) == (3, 2, 1, None, 2, 104, 156)  # 2 ranks of 1,000 tokens: as one pool of 1,000


def test_sglang_0_5_23_cuts_the_output_to_whole_pages_of_the_empty_pool(tmp_path):
    """B200 pages of 64, a pool of 1,024: 896 + 500 runs 63 output tokens on 0.5.23 (126 on 0.5.2), and a
    897-token prompt leaves 0.5.23 no output token (0.5.2 runs 125)."""
    trace = _trace(tmp_path, [(896, 500), (897, 500)])
    new = simulate_serving(_config("sglang", "b200"), {"mode": "trace", "trace": trace, "kv_capacity_tokens": 1024})
    old = simulate_serving(_config("sglang@0.5", "b200"), {"mode": "trace", "trace": trace, "kv_capacity_tokens": 1024})
    assert _counts(new) == (1, 1, 1, None, 1, 437, 63)
    assert _counts(old) == (2, None, None, None, 2, 374 + 375, 126 + 125)
    assert new["notes"] == [
        "sglang 0.5.23 holds a request to its KV pool of 1,024 tokens per scheduler, fewer than its context of 4,096 "
        "tokens: 1 request with a prompt of 897 tokens or more was rejected on arrival (one of fewer than 1,018 tokens "
        "sglang runs with no output token: no answer comes back), and 1 request was admitted with its output cut to "
        "what the empty pool holds beside the prompt: the pool less the prompt in whole pages of 64 tokens, 1 more "
        "page and 1 token: 437 output tokens fewer in all (engine card context_limit.kv_pool)"]


def test_a_pool_longer_than_the_context_changes_nothing(tmp_path):
    summary = simulate_serving(_config("sglang"), {"mode": "trace", "trace": _trace(tmp_path, [(900, 200)]),
                                                   "kv_capacity_tokens": 1000, "max_model_len": 500})
    assert _counts(summary) == (0, 1, None, None, None, None, 0)
    assert summary["rejected_as_longer_than"] == "max_model_len 500, or with a prompt of 496 tokens or more"


SESSION = {"type": "sessions", "num_system_prompts": 1, "system_prompt_len": 200, "turns": 4, "question_len": 50,
           "think_time_s": 1}


def _rejected_prompts(monkeypatch) -> list[int]:
    """The prompt lengths of the requests the server refuses on arrival, as the run refuses them."""
    seen: list[int] = []
    reject = Outcomes.reject

    def spy(self, req, for_pool=False):
        seen.append(req.input_tokens)
        reject(self, req, for_pool)

    monkeypatch.setattr(Outcomes, "reject", spy)
    return seen


def test_a_conversation_grows_to_sglangs_pool_and_its_cut_answer_goes_on(monkeypatch):
    """A pool of 1,000 tokens, no max_model_len: turns of 250, 600 (250 + 300 + 50) and 950 tokens; the third
    answer is cut to 1,000 - 2 - 950 = 48 tokens, and the fourth turn's prompt of 950 + 48 + 50 = 1,048 is refused."""
    refused = _rejected_prompts(monkeypatch)
    workload = {"load": {"stages": [{"rate": 1, "num_requests": 1}]}, "data": {**SESSION, "output_len": 300}}
    summary = simulate_serving(_config("sglang"), {"workload": workload, "kv_capacity_tokens": 1000, "requests": True})
    records = sorted(summary["requests"], key=lambda r: r["id"])
    assert [(r["input_tokens"], r["output_tokens"]) for r in records] == [(250, 300), (600, 300), (950, 48)]
    assert _counts(summary) == (3, 1, 1, None, 1, 252, 648) and refused == [1048]
    assert not any("conversations grow" in note for note in summary["notes"])  # SGLang's own rule holds them
    assert summary["notes"][-1].startswith("sglang 0.5.23 holds a request to its KV pool of 1,000 tokens per "
                                           "scheduler, fewer than its context of 4,096 tokens: 1 request with a "
                                           "prompt of 994 tokens or more was rejected on arrival, and 1 request was")


def test_vllm_0_33_chat_session_goes_on_with_the_cut_answer_until_the_context_refuses_a_turn(monkeypatch):
    """max_model_len 600: turns of 250 and 420 tokens run their 120 output tokens; the third, 590 tokens,
    gets 600 - 590 = 10; the fourth's prompt, 590 + 10 + 50 = 650, holds the cut answer and is refused."""
    refused = _rejected_prompts(monkeypatch)
    workload = {"load": {"stages": [{"rate": 1, "num_requests": 1}]}, "data": {**SESSION, "output_len": 120},
                "max_model_len": 600}
    summary = simulate_serving(_config("vllm@0.33"), {"workload": workload, "requests": True})
    records = sorted(summary["requests"], key=lambda r: r["id"])
    assert [(r["input_tokens"], r["output_tokens"]) for r in records] == [(250, 120), (420, 120), (590, 10)]
    assert _counts(summary) == (3, 1, None, 1, None, None, 250) and summary["shortened_output_tokens"] == 110
    assert refused == [650]


def test_vllm_0_33_inference_perf_rounds_carry_the_cut_answer_and_are_refused_once_the_context_is_full(
        monkeypatch):
    """One user, rounds of (200 + 50)-token prompts, max_model_len 700: round 0 runs 250 + 120; round 1,
    370 + 250 = 620 tokens, gets 80; rounds 2 and 3, 620 + 80 + 250 = 950 tokens, are refused."""
    refused = _rejected_prompts(monkeypatch)
    workload = {"load": {"stages": [{"rate": 1, "num_requests": 4}]}, "max_model_len": 700,
                "data": {"type": "shared_prefix", "num_groups": 1, "prompts_per_group": 1, "system_prompt_len": 200,
                         "question_len": 50, "output_len": 120, "multi_turn": True}}
    summary = simulate_serving(_config("vllm@0.33"), {"workload": workload, "requests": True})
    records = sorted(summary["requests"], key=lambda r: r["id"])
    assert [(r["input_tokens"], r["output_tokens"]) for r in records] == [(250, 120), (620, 80)]
    assert _counts(summary) == (2, 2, None, 1, None, None, 200) and refused == [950, 950]


# -- the main run -------------------------------------------------------------------------------------


def test_the_does_not_fit_message_says_what_sglang_does_with_a_request_longer_than_its_pool(capsys):
    """qwen3-8b on an L4 leaves SGLang 0.5.23 a pool of 864 tokens: 500 + 1,000 does not fit, and SGLang runs
    it with 864 - 2 - 500 = 362 output tokens; a 2,000-token prompt it aborts (858 = 864 - 6)."""
    args = ["--model", "qwen3-8b", "--hardware", "l4", "--engine", "sglang"]
    assert main([*args, "--isl", "500", "--osl", "1000"]) == 1
    assert ("over by 0.09 GB; sglang 0.5.23 does not refuse it: its scheduler holds a request to its KV pool of 864 "
            "tokens and runs it with its output cut to 362 tokens (engine card context_limit.kv_pool; --osl 362 "
            "simulates that); fix: shorter requests") in capsys.readouterr().err
    assert main([*args, "--isl", "2000", "--osl", "10"]) == 1
    assert ("sglang 0.5.23 rejects it on arrival: its scheduler holds a request to its KV pool of 864 tokens, which "
            "takes no prompt of 858 tokens or more (engine card context_limit.kv_pool); fix:") in capsys.readouterr().err
    assert main([*args, "--isl", "500", "--osl", "362"]) == 0  # what it serves fits
    assert main(["--model", "qwen3-8b", "--hardware", "l4", "--engine", "vllm@0.33", "--isl", "500", "--osl",
                 "40000"]) == 1
    err = capsys.readouterr().err  # an engine without the rule: as before
    assert "does not fit: one request of 40,500 tokens needs" in err and "KV pool" not in err


@pytest.mark.parametrize("total, output", [(1001, 7), (1002, 6)])
def test_a_request_longer_than_sglangs_pool_is_cut_alike_on_arrival_and_in_a_stream(total, output):
    """A 1,000-token pool: a request of `total` tokens (10 of them output) runs 1,000 - 2 - prompt output
    tokens, in a conversation's turn and in a Poisson stream alike (where an engine without the rule is
    refused: tests/test_serve_hostile_workloads.py)."""
    form = {"load": {"stages": [{"rate": 1, "num_requests": 1}]},
            "data": {"type": "sessions", "system_prompt_len": 0, "turns": 1, "question_len": total - 10,
                     "output_len": 10}}
    stream = {"mode": "poisson", "rate": 1, "num_requests": 1, "isl": total - 10, "osl": 10}
    for options in ({"workload": form}, stream):
        summary = simulate_serving(_config("sglang"), {**options, "kv_capacity_tokens": 1000})
        assert _counts(summary) == (1, None, None, None, 1, 10 - output, output)


@given(margins=st.booleans(), fit=st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 5))),
       pool=st.integers(0, 5000), page=st.sampled_from([1, 16, 32, 64]), data=st.data())
@settings(max_examples=300, deadline=None)
def test_a_request_within_what_the_pool_runs_whole_is_run_as_asked(margins, fit, pool, page, data):
    """pool_runs_whole is the bound serve's admission skips the pool's rule below: every request of a
    prompt and at least one output token within it, the rule runs as asked (tried at the bound and
    anywhere below it); one token more than it and the rule cuts a request of that length (a
    one-token output, or a one-token prompt)."""
    if not margins and fit is None:
        margins = True
    empty = None if fit is None else {"pages_free": fit[0], "tokens_free": fit[1]}
    rule = _card(**SGLANG, kv_pool={"margins": margins, "empty_pool_fit": empty}).context_limit
    whole = rule.pool_runs_whole(pool, page)
    if whole < 2:
        return
    prompt = data.draw(st.integers(1, whole - 1))
    output = data.draw(st.integers(1, whole - prompt))
    assert rule.pool_output(pool, page, prompt, whole - prompt) == whole - prompt  # at the bound
    assert rule.pool_output(pool, page, prompt, output) == output
    assert rule.pool_output(pool, page, whole, 1) < 1 or rule.pool_output(pool, page, 1, whole) < whole
