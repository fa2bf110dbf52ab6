"""The benchmark clients' defaults (engines/bench/*.yaml): the loaded values are the tools' own, read
by hand from their source; a file with a bad value is one error naming the file, the key and the
value; every flag a file names is one `serve` parses; and the workload the flags make takes them."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from test_hostile_cli import one_line_error, run

from infersim.base.errors import ConfigError
from infersim.serve import bench_tools as bench_tools_module
from infersim.serve.bench_flags import DATASET_FLAGS, DATASETS, dataset_length_flags, dataset_own_flags
from infersim.serve.bench_tools import TOOL_FILES, bench_tool, bench_tools, data_dir


@pytest.mark.parametrize(("name", "tool_facts", "random_facts", "dataset_facts", "defaults"), [
    # vllm 0.15.1 vllm/benchmarks/datasets.py add_dataset_parser (the same in 0.33.0,
    # vllm/benchmarks/datasets/datasets.py) and vllm/benchmarks/serve.py add_cli_args
    ("vllm", ("vllm bench serve", 1000, 1.0, "vllm", True), (1024, 128, 0.0, 0, "around"),
     ("prefix_repetition", "--prefix-repetition-", "prefix_repetition"),
     {"prefix_len": 256, "suffix_len": 256, "num_prefixes": 10, "output_len": 128}),
    # sglang 0.5.23 sglang/benchmark/serving.py (what sglang/bench_serving.py re-exports): --num-prompts
    # 1000, --random-input-len 1024, --random-output-len 1024, --random-range-ratio 0.0, --gsp-* 64, 16,
    # 2048, 128, 256; exponential gaps, no ramp-up, no --random-prefix-len
    ("sglang", ("sglang.bench_serving", 1000, 1.0, "poisson", False), (1024, 1024, 0.0, 0, "below"),
     ("generated-shared-prefix", "--gsp-", "shared_prefix"),
     {"num_groups": 64, "prompts_per_group": 16, "system_prompt_len": 2048, "question_len": 128, "output_len": 256}),
])
def test_bench_tool_defaults_are_the_tools_own(name, tool_facts, random_facts, dataset_facts, defaults) -> None:
    tool = bench_tool(name)
    assert (tool.program, tool.num_prompts, tool.burstiness, tool.arrivals, tool.ramp_up) == tool_facts
    random = tool.random
    assert (random.input_len, random.output_len, random.range_ratio, random.prefix_len, random.spread) == random_facts
    (dataset,) = tool.datasets
    assert (dataset.name, dataset.flag_prefix, dataset.workload) == dataset_facts
    assert dataset.defaults == defaults


def test_every_bench_file_names_its_source_beside_each_default() -> None:
    numbers = ("num_prompts", "input_len", "output_len", "range_ratio", "prefix_len", "suffix_len",
               "num_prefixes", "num_groups", "prompts_per_group", "system_prompt_len", "question_len")
    for name, version in (("vllm-bench-serve.yaml", "vllm 0.15.1"), ("sglang-bench-serving.yaml", "sglang 0.5.23")):
        text = (data_dir() / name).read_text()
        assert f"package: {version}" in text
        valued = [line for line in text.splitlines() if line.strip().split(":")[0] in numbers]
        assert len(valued) >= 7, name
        for line in valued:
            assert "# " in line, (name, line)  # each default says where it was read, or why it has no flag


def test_the_bench_files_ship_in_the_package() -> None:
    from infersim.cards.registry import bundled_dir

    assert data_dir() == bundled_dir("engines") / "bench"
    assert '"engines" = "infersim/_bundled/engines"' in (REPO_ROOT / "pyproject.toml").read_text()
    assert sorted(p.name for p in data_dir().glob("*.yaml")) == sorted(TOOL_FILES.values())


def _copy(tmp_path: Path) -> Path:
    for name in TOOL_FILES.values():
        shutil.copy(data_dir() / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize(("tool", "old", "new", "parts"), [
    ("vllm", "  input_len: 1024 ", "  input_len: -5 ", ("random.input_len", "-5", "greater than 0")),
    ("vllm", "  output_len: 128 ", "  output_len: many ", ("random.output_len", "many", "whole number")),
    ("vllm", "  range_ratio: 0.0 ", "  range_ratio: 1.5 ", ("random.range_ratio", "1.5", "below 1")),
    ("vllm", "  spread: around", "  spread: sideways", ("random.spread", "sideways", "around, below")),
    ("vllm", "num_prompts: 1000 ", "num_prompt: 1000 ", ("num_prompt", "1000", "unknown key", "num_prompts")),
    ("vllm", "    num_prefixes: 10 ", "    num_prefix: 10 ",
     ("datasets[0].defaults.num_prefix", "10", "not a key of the prefix_repetition workload")),
    ("vllm", "    num_prefixes: 10 ", "    num_prefixes: 0 ", ("datasets[0].defaults", "0", "greater than 0")),
    ("sglang", "  workload: shared_prefix", "  workload: prefix_repetition",
     ("datasets[0].defaults.num_groups", "64", "not a key of the prefix_repetition workload")),
    ("sglang", "    question_len: 128 ", "    # question_len: 128 ",
     ("datasets[0].defaults.question_len", "needs every key")),
    ("sglang", "tool: sglang", "tool: vllm", ("field 'tool'", "vllm", "--bench-tool sglang")),
    ("sglang", "flag_prefix: --gsp-", "flag_prefix: gsp", ("datasets[0].flag_prefix", "gsp", "--name-")),
])
def test_a_bad_value_is_one_error_naming_file_key_and_value(tmp_path, tool, old, new, parts) -> None:
    directory = _copy(tmp_path)
    path = directory / TOOL_FILES[tool]
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        bench_tool(tool, directory)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    for part in parts:
        assert part in message, (part, message)


def test_a_dataset_two_tools_generate_is_refused(tmp_path) -> None:
    directory = _copy(tmp_path)
    path = directory / TOOL_FILES["sglang"]
    path.write_text(path.read_text().replace("- name: generated-shared-prefix", "- name: prefix_repetition"))
    with pytest.raises(ConfigError, match=r"sglang-bench-serving.yaml: field 'datasets\[0\].name' \(value: "
                                          r"'prefix_repetition'\): a dataset of vllm bench serve too"):
        bench_tools(directory)


def test_a_broken_bench_file_stops_serve_with_one_line(capsys, tmp_path, monkeypatch) -> None:
    directory = _copy(tmp_path)
    path = directory / TOOL_FILES["vllm"]
    path.write_text(path.read_text().replace("  output_len: 128 ", "  output_len: -1 ", 1))
    monkeypatch.setattr(bench_tools_module, "data_dir", lambda: directory)
    code, out, err = run(capsys, "serve", "--config", "serve-llama-8b-h100.yaml", "--dataset-name", "random",
                         "--random-input-len", "100", "--request-rate", "4", "--num-prompts", "10")
    assert code == 2 and not out
    one_line_error(err, "vllm-bench-serve.yaml", "random.output_len", "-1", "greater than 0")


def _serve_parser() -> argparse.ArgumentParser:
    from infersim.serve.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def test_every_flag_a_bench_file_names_is_one_serve_parses() -> None:
    parsed = vars(_serve_parser().parse_args(["serve"]))
    tools = bench_tools()
    own = dataset_own_flags(tools)
    assert list(own) == ["random", "prefix_repetition", "generated-shared-prefix", "sharegpt"]
    assert set(own) == set(DATASETS)
    for attrs in own.values():
        for attr in attrs:
            assert attr in parsed and attr in DATASET_FLAGS, attr
    assert dataset_length_flags(tools) == {
        "prefix_repetition": ("--prefix-repetition-prefix-len and --prefix-repetition-suffix-len",
                              "--prefix-repetition-output-len"),
        "generated-shared-prefix": ("--gsp-system-prompt-len and --gsp-question-len", "--gsp-output-len")}


def _form(*flags: str) -> dict:
    from infersim.serve.bench_flags import workload_from_flags

    return workload_from_flags(_serve_parser().parse_args(["serve", *flags]))


def test_the_workload_takes_each_tools_defaults() -> None:
    vllm = _form("--dataset-name", "random", "--request-rate", "2")
    assert vllm["data"] == {"type": "random", "input": 1024, "output": 128, "prefix_tokens": 0}
    assert vllm["load"] == {"timer": "vllm", "stages": [{"rate": 2, "num_requests": 1000}], "burstiness": 1.0}
    assert vllm["notes"] == ["--random-input-len and --random-output-len not given: input length 1,024 and output "
                             "length 128 tokens, vllm bench serve's defaults"]
    sglang = _form("--bench-tool", "sglang", "--dataset-name", "random", "--max-concurrency", "8")
    # sglang's default range ratio 0: uniform from 1 to the length
    assert sglang["data"]["input"] == {"dist": "uniform", "min": 1, "max": 1024}
    assert sglang["data"]["output"] == {"dist": "uniform", "min": 1, "max": 1024}
    assert sglang["load"]["timer"] == "poisson" and sglang["load"]["stages"] == [{"concurrency": 8,
                                                                                "num_requests": 1000}]
    repetition = _form("--dataset-name", "prefix_repetition", "--offline")
    assert repetition["data"] == {"type": "prefix_repetition", "prefix_len": 256, "suffix_len": 256,
                                  "num_prefixes": 10, "output_len": 128}
    assert repetition["load"]["stages"] == [{"concurrency": 1000, "num_requests": 1000}]
    assert repetition["notes"] == ["not given, so vllm bench serve's defaults: --prefix-repetition-prefix-len 256, "
                                   "--prefix-repetition-suffix-len 256, --prefix-repetition-num-prefixes 10, "
                                   "--prefix-repetition-output-len 128"]
    shared = _form("--bench-tool", "sglang", "--dataset-name", "generated-shared-prefix", "--request-rate", "1",
                   "--gsp-num-groups", "4")
    assert shared["data"] == {"type": "shared_prefix", "num_groups": 4, "prompts_per_group": 16,
                              "system_prompt_len": 2048, "question_len": 128, "output_len": 256, "order": "once"}
    assert shared["load"]["stages"] == [{"rate": 1, "num_requests": 64}]  # 4 groups x 16 prompts, each sent once
