"""YAML input nested past the limit, bytes that are not UTF-8, and a directory where a file is meant:
each is one message naming the file, for every command that reads YAML of the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TEST_CACHE_DIR
from test_hostile_cli import one_line_error, run

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")

# each command that reads a YAML file of the user's, with that file's place in its arguments
READERS = [
    pytest.param(lambda f: ["--config", f], id="run --config"),
    pytest.param(lambda f: [*SERVE, "--workload", f], id="serve --workload"),
    pytest.param(lambda f: ["calibrate", "--reference", f, "--hardware", "h100-sxm", "--engine", "vllm@0.15"],
                 id="calibrate --reference"),
]


@pytest.mark.parametrize("argv", READERS)
@pytest.mark.parametrize("text", [
    pytest.param("a: " + "[" * 3000 + "]" * 3000 + "\n", id="flow"),
    pytest.param("- " * 3000 + "a\n", id="block"),
    pytest.param("".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [1]\n" for i in range(100)), id="aliases"),
])
def test_yaml_nested_past_the_limit_is_one_line(tmp_path, capsys, argv, text) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(text)
    code, _out, err = run(capsys, *argv(str(deep)))
    assert code == 2
    one_line_error(err, str(deep), "nested more than 64 levels deep")


def test_yaml_nested_past_what_libyaml_can_compose_is_one_line(tmp_path) -> None:
    """100,000 block levels would overflow libyaml's composer (a crash, not an exception): refused
    before it runs. In a process of its own: a crash would take pytest's worker with it."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("- " * 100_000 + "a\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "INFERSIM_CACHE_DIR": TEST_CACHE_DIR}
    done = subprocess.run([sys.executable, "-m", "infersim", "--config", str(deep)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    one_line_error(done.stderr, str(deep), "nested more than 64 levels deep")


@pytest.mark.parametrize("argv", READERS)
def test_yaml_that_is_not_utf8_is_one_line(tmp_path, capsys, argv) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"model: llama\n\xd5\x00\xff binary\n")
    code, _out, err = run(capsys, *argv(str(binary)))
    assert code == 2
    one_line_error(err, str(binary), "not UTF-8 text (byte 0xd5 at offset 13)")


def test_random_bytes_as_a_workload_are_one_line(tmp_path, capsys) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 3)
    code, _out, err = run(capsys, *SERVE, "--workload", str(binary))
    assert code == 2
    one_line_error(err, f"--workload {binary}", "not UTF-8 text (byte 0x80 at offset 0)")


def test_a_reference_that_is_a_directory_is_named_so(tmp_path, capsys) -> None:
    code, _out, err = run(capsys, "calibrate", "--reference", str(tmp_path))
    assert code == 2
    one_line_error(err, f"--reference {tmp_path}", "is a directory")
    code, _out, err = run(capsys, "calibrate", "--reference", str(tmp_path / "absent.yaml"))
    assert code == 2
    one_line_error(err, "no such file")


def test_a_json_row_nested_past_the_limit_is_one_line(tmp_path, capsys) -> None:
    trace = tmp_path / "requests.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5, "x": ' + "[" * 3000 + "]" * 3000
                     + "}\n")
    code, _out, err = run(capsys, *SERVE, "--trace", str(trace))
    assert code == 2
    one_line_error(err, str(trace), "row 1", "nested 3,001 levels deep")


def test_a_deep_flag_value_in_block_style_is_one_line(capsys) -> None:
    code, _out, err = run(capsys, *SERVE, "--rate", "1", "--isl", "- " * 40_000 + "1")
    assert code == 2
    one_line_error(err, "--isl", "nested more than 64 levels deep")


def test_an_ordinary_config_still_reads(tmp_path, capsys) -> None:
    config = tmp_path / "ok.yaml"
    config.write_text(Path(REPO_ROOT / "configs" / "serve-llama-8b-h100.yaml").read_text())
    code, _out, err = run(capsys, "--config", str(config))
    assert code == 0, err


@pytest.mark.parametrize(("args", "message"), [
    (["validate", "--measured", "{dir}"], "--measured {dir}: is a directory, not a file"),
    (["validate", "--reference", "{dir}"], "--reference {dir}: is a directory, not a file"),
    (["--config", "qwen3-30b.yaml", "--calibration", "{dir}"], "calibration {dir}: is a directory, not a file"),
])
def test_a_directory_given_for_a_file_is_named_as_one(capsys, tmp_path: Path, args, message) -> None:
    code, _out, err = run(capsys, *[a.format(dir=tmp_path) for a in args])
    assert code == 2
    one_line_error(err, message.format(dir=tmp_path))


def test_a_too_deep_lengths_file_is_one_message(capsys, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    code, _out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--num-requests", "5", "--rate", "1",
                          "--isl", f"{{dist: empirical, file: {deep}}}")
    assert code == 2
    one_line_error(err, f"isl: lengths file {deep}: nested 5,000 levels deep")
