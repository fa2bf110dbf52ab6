"""The flag that raises a server's running-request cap is a fact of the engine card
(scheduler.running_cap_flag): the main run's warning and a sweep's note name the run's own engine's
flag, --emit-launch sets it, and each bundled card's flag is one its launch parser data knows."""

from __future__ import annotations

import copy

import pytest

from core_fixtures import FREE_ENGINE
from infersim.base.errors import ConfigError
from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.registry import bundled_engines
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.cards.engine_parser import parser_for
from infersim.run.config import load_engine_card
from infersim.run.request_limits import larger_cap

ABOVE_VLLM_CAP = ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm", "--isl", "100", "--osl", "100",
                  "--batch-per-gpu", "1100"]  # vLLM's max_num_seqs on an H100 is 1,024; its KV cache holds 2,350


def _card(framework: str = "vllm", **scheduler: object) -> EngineCard:
    data = copy.deepcopy(FREE_ENGINE)
    data["framework"] = framework
    data["scheduler"].update(scheduler)
    return validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")


def test_each_bundled_server_engine_names_its_flag_from_its_launch_parser_data():
    flags = {}
    for entry in bundled_engines():
        card = load_engine_card(entry.stem)[0]
        flags[entry.stem] = card.scheduler.running_cap_flag
        if card.framework != "huggingface":
            parser = parser_for(card.framework, card.version).data.server
            assert parser.has(card.scheduler.running_cap_flag), entry.stem
    assert flags == {
        "deepspeed-zero-inference": None, "huggingface": None, "huggingface-compiled": None,
        "sglang-0.5": "--max-running-requests", "sglang-0.5.23": "--max-running-requests",
        "trtllm": "--max_batch_size", "vllm-0.11": "--max-num-seqs", "vllm-0.15": "--max-num-seqs",
        "vllm-0.33": "--max-num-seqs"}


def test_the_sentence_names_the_engines_own_flag_or_says_there_is_none():
    assert larger_cap(load_engine_card("trtllm")[0]) == "only with a larger cap (--max_batch_size; --emit-launch sets it)"
    assert larger_cap(load_engine_card("huggingface")[0]) == (
        "only with a larger cap, and engine card huggingface names no flag that sets one (scheduler.running_cap_flag)")


def test_the_run_warns_with_the_flag_of_its_engine_alone(capsys):
    assert main(ABOVE_VLLM_CAP) == 0
    assert ("decode batch 1,100 per GPU is above vllm's default running-request cap (1,024 per GPU): a server runs it "
            "only with a larger cap (--max-num-seqs; --emit-launch sets it)") in capsys.readouterr().out
    assert main([*ABOVE_VLLM_CAP, "--set", "engine.scheduler.running_cap_flag=null"]) == 0
    assert ("a server runs it only with a larger cap, and engine card vllm names no flag that sets one "
            "(scheduler.running_cap_flag)") in capsys.readouterr().out


def test_emit_launch_sets_the_cards_flag_and_refuses_a_card_that_names_none(capsys):
    assert main([*ABOVE_VLLM_CAP, "--emit-launch"]) == 0
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 1100 " in capsys.readouterr().out
    assert main([*ABOVE_VLLM_CAP, "--emit-launch", "--set", "engine.scheduler.running_cap_flag=null"]) == 2
    assert capsys.readouterr().err == (
        "infersim: error: --emit-launch: engine card vllm names no flag that sets vLLM 0.33.0's running-request cap "
        "(scheduler.running_cap_flag), and the simulation ran a cap of 1100: the command cannot be spelled\n")


@pytest.mark.parametrize("framework, flag, problem", [
    ("vllm", "max-num-seqs", "expected the server's command-line flag as its parser spells it"),
    ("vllm", "--max num seqs", "expected the server's command-line flag as its parser spells it"),
    ("huggingface", "--max-num-seqs", "framework huggingface runs no server"),
])
def test_the_field_is_validated_with_file_key_and_value(framework, flag, problem):
    with pytest.raises(ConfigError) as caught:
        _card(framework, running_cap_flag=flag)
    assert (caught.value.field, caught.value.value) == ("scheduler.running_cap_flag", flag)
    assert problem in caught.value.problem and caught.value.source == "e.yaml"
