"""`cards import-hf` names a card after its config file by the rule `--name` is held to: a file
name with spaces, accents or other characters a card name cannot hold makes a name that can be
written on a command line, and the card runs under it."""

from __future__ import annotations

import json

import pytest
from test_hostile_cli import run

from infersim.cards.hf_import import MAX_CARD_NAME, default_card_name
from infersim.cli.cards import _CARD_NAME

HF_CONFIG = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32000, "intermediate_size": 3072,
             "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("file_name, card", [
    ("My Model é.json", "my-model-e"),
    ("Qwen3 8B (copy)_config.json", "qwen3-8b-copy"),
    ("+plus.json", "plus"),
    ("qwen3_8b_config.json", "qwen3_8b"),  # '_' is a card-name character: kept
    ("qwen3-8B_config.json", "qwen3-8b"),
])
def test_a_file_name_becomes_a_name_the_name_rule_takes(capsys, tmp_path, monkeypatch, file_name, card) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / file_name
    config.write_text(json.dumps(HF_CONFIG))
    code, out, err = run(capsys, "cards", "import-hf", str(config))
    assert code == 0, err
    assert out.strip() == f"wrote models/{card}.yaml (run it with --model {card})"
    assert _CARD_NAME.match(card) and (tmp_path / "models" / f"{card}.yaml").is_file()
    code, out, err = run(capsys, "--model", card, "--hardware", "h100", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["model"] == card


def test_a_long_file_name_is_cut_to_the_longest_card_name(tmp_path) -> None:
    name = default_card_name(tmp_path / ("Very Long " * 40 + ".json"))
    assert len(name) <= MAX_CARD_NAME and _CARD_NAME.match(name) and name.startswith("very-long-very-long")


def test_a_file_name_of_no_card_name_characters_falls_back_to_the_model(tmp_path) -> None:
    path = tmp_path / "日本語.json"
    assert default_card_name(path, {"_name_or_path": "Org/Tiny Qwen é"}) == "tiny-qwen-e"
    assert _CARD_NAME.match(default_card_name(path, {}))  # the directory's name, by the same rule


def test_two_files_making_one_name_are_refused_before_any_card_is_written(capsys, tmp_path) -> None:
    for name in ("My Model.json", "my-model.json"):
        (tmp_path / name).write_text(json.dumps(HF_CONFIG))
    out_dir = tmp_path / "cards"
    code, _out, err = run(capsys, "cards", "import-hf", str(tmp_path / "My Model.json"),
                          str(tmp_path / "my-model.json"), "--out", str(out_dir))
    assert code == 2 and "both make the card 'my-model'" in err
    assert not out_dir.exists()
