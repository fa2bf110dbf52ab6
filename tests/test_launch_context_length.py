"""serve --max-model-len N --emit-launch: the server is launched with the context limit the simulation
admitted requests by (prompt + output <= N), in each engine's own flag, and with the engine card's
override setting where the limit is above the model's context (Qwen3-30B-A3B's 40,960 tokens). Without --max-model-len nothing is added: the engine's default is the model's context, the
simulation's too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli_helpers import run_json

from infersim.cards.registry import bundled_dir, bundled_names
from infersim.cli.main import main
from infersim.cards.engine_parser import load_parser_data, parser_for
from infersim.run.config import load_engine_card

#: a short closed loop on the Qwen3-30B-A3B config (4 x H20, DP attention 4, EP 4): each run ~1 s
SERVE = ("serve", "--config", "qwen3-30b.yaml", "--concurrency", "4", "--num-requests", "8", "--emit-launch")


def launched(capsys: pytest.CaptureFixture[str], engine: str, *extra: str) -> dict[str, Any]:
    return run_json(capsys, *SERVE, "--engine", engine, *extra)["launch"]


def value_of(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("engine,flag,value", [
    ("vllm", "--max-model-len", "8192"),
    ("vllm@0.11", "--max-model-len", "8192"),
    ("sglang", "--context-length", "8194"),  # SGLang cuts the output 2 tokens short of it: 8194 runs 8192 whole
    ("trtllm", "--max_seq_len", "8192"),
])
def test_the_server_carries_the_runs_max_model_len_in_its_own_flag(capsys, engine, flag, value):
    launch = launched(capsys, engine, "--max-model-len", "8192")
    server = launch["commands"][0]
    assert value_of(server["argv"], flag) == value
    assert server["env"] == {}  # 8192 is below the model's 40,960: no override
    setting = next(s for s in launch["settings"] if s["argument"] == flag)
    assert (setting["value"], setting["how"]) == (int(value), "set")
    if engine == "sglang":
        assert setting["fact"] == ("longest request run whole 8192 tokens, prompt + output (sglang 0.5.23 cuts a "
                                   "request's output to end 2 tokens short of --context-length, so 8192 + 2)")
    else:
        assert setting["fact"] == "longest request, prompt + output tokens"


@pytest.mark.parametrize("engine,flag,value,env", [
    ("vllm", "--max-model-len", "65536", {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
    ("sglang", "--context-length", "65538", {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}),
    ("trtllm", "--max_seq_len", "65536", {}),  # engine card trtllm names no override: a note says so
])
def test_above_the_models_context_the_engines_override_is_set(capsys, engine, flag, value, env):
    launch = launched(capsys, engine, "--max-model-len", "65536")
    server = launch["commands"][0]
    assert value_of(server["argv"], flag) == value and server["env"] == env
    above = f"{flag} {int(value):,} is above model qwen3-30b-a3b's context of 40,960 tokens (max_position_embeddings)"
    if env:
        (variable, setting), = env.items()
        assert f"{above}: {variable}={setting} lets it start; the model's output past its trained context is not " \
               "assured" in launch["notes"]
    else:
        assert f"{above}: engine card trtllm names no setting that lets TensorRT-LLM 1.0 start with it, and it may " \
               "refuse to" in launch["notes"]


def test_at_the_models_context_sglang_needs_its_override_for_the_two_tokens_it_keeps_free(capsys):
    sglang = launched(capsys, "sglang", "--max-model-len", "40960")
    server = sglang["commands"][0]
    assert value_of(server["argv"], "--context-length") == "40962"
    assert server["env"] == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    assert any("only by the 2 tokens SGLang 0.5.2 keeps free" in note for note in sglang["notes"])
    older = launched(capsys, "sglang@0.5", "--max-model-len", "8192")["commands"][0]  # 0.5.2: reserved 1, margin 2
    assert value_of(older["argv"], "--context-length") == "8194"
    vllm = launched(capsys, "vllm", "--max-model-len", "40960")["commands"][0]
    assert value_of(vllm["argv"], "--max-model-len") == "40960" and vllm["env"] == {}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_without_max_model_len_the_command_is_unchanged(capsys, engine):
    launch = launched(capsys, engine)
    for command in launch["commands"]:
        assert not {"--max-model-len", "--context-length"} & set(command["argv"]) and command["env"] == {}
    assert not any("context" in s["fact"] for s in launch["settings"])


def test_both_pd_sides_carry_it_and_the_router_does_not(capsys):
    launch = run_json(capsys, "serve", "--config", "qwen3-30b.yaml", "--engine", "sglang", "--rate", "4",
                      "--num-requests", "8", "--disaggregate", "1P1D", "--max-model-len", "8192", "--emit-launch")["launch"]
    prefill, decode, router = (c["argv"] for c in launch["commands"])
    assert value_of(prefill, "--context-length") == value_of(decode, "--context-length") == "8194"
    assert "--context-length" not in router


def test_a_workloads_max_model_len_is_the_servers(capsys):
    # docs/examples/chat-sessions.yaml says max_model_len: 32768
    workload = Path(__file__).resolve().parent.parent / "docs" / "examples" / "chat-sessions.yaml"
    launch = run_json(capsys, "serve", "--config", "qwen3-30b.yaml", "--workload", str(workload), "--engine", "vllm",
                      "--emit-launch")["launch"]
    assert value_of(launch["commands"][0]["argv"], "--max-model-len") == "32768"


def test_a_plain_run_has_no_max_model_len_to_carry(capsys):
    assert main(["--config", "qwen3-30b.yaml", "--engine", "vllm", "--format", "json", "--emit-launch"]) == 0
    assert "--max-model-len" not in capsys.readouterr().out


def test_every_engine_cards_override_is_an_environment_variable_of_its_parser_data():
    """The override an engine card names is emitted through its parser data: the variable must be among
    the data's environment variables and the value among its choices, or no command can carry it."""
    cards = [load_engine_card(name)[0] for name in bundled_names("engines")]
    checked = 0
    for card in cards:
        override = card.context_limit.override
        if not override:
            continue
        variable, _, value = override.partition("=")
        server = parser_for(card.framework, card.version).data.server
        flag = server.find(variable)
        assert flag is not None and flag in server.environment, override
        assert value in flag.choices, (override, flag.choices)
        checked += 1
    assert checked == 5  # vllm 0.11, 0.15, 0.33; sglang 0.5, 0.5.23


@pytest.mark.parametrize("name,flag", [
    ("vllm-0.11.0", "--max-model-len"), ("vllm-0.15.1", "--max-model-len"), ("vllm-0.33.0", "--max-model-len"),
    ("sglang-0.5.2", "--context-length"), ("trtllm-1.0", "--max_seq_len"),
])
def test_each_parser_file_has_its_context_flag_read_from_its_source(name, flag):
    data = load_parser_data(bundled_dir("engines") / "launch" / f"{name}.yaml")
    found = data.server.find(flag)
    assert found is not None and found.kind == "int" and found.default is None  # unset: derived from the model
    assert found in data.server.flags and found.source and "unset:" in found.default_note
