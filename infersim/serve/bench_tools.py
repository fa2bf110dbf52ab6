"""The benchmark clients' defaults as data: what `vllm bench serve` and `sglang.bench_serving` take
when a dataset or load flag is not given, how each spreads the random dataset's lengths, how it
spaces its sends, and which generated datasets it has (engines/bench/<program>.yaml, one file per
tool, each value beside the source line of the version it was read from).

Each file is validated on load like a card: an unknown key, a wrong type, an impossible value, a
dataset whose defaults are not its workload's keys is one error naming the file, the key and the
value. `bench_tool(name)` reads one tool's file, `bench_tools()` every one; `generated_dataset`
finds the tool whose file describes a generated dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infersim.base.errors import MISSING, ConfigError
from infersim.cards.schema import build, load_yaml, spec

ToolName = Literal["vllm", "sglang"]
#: folder of the benchmark clients' data, under the bundled engines directory
DATA_FOLDER = "bench"
#: the file of each tool, under DATA_FOLDER
TOOL_FILES: dict[str, str] = {"vllm": "vllm-bench-serve.yaml", "sglang": "sglang-bench-serving.yaml"}

#: each generated dataset's workload form (infersim.serve.workload_spec): its keys (the flags after
#: the dataset's flag prefix), the keys its prompts are built from and the key of its outputs
WORKLOAD_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "prefix_repetition": (("prefix_len", "suffix_len", "num_prefixes", "output_len"),
                          ("prefix_len", "suffix_len"), "output_len"),
    "shared_prefix": (("num_groups", "prompts_per_group", "system_prompt_len", "question_len", "output_len"),
                      ("system_prompt_len", "question_len"), "output_len"),
}


@dataclass(frozen=True, kw_only=True)
class RandomDefaults:
    """The random dataset: its lengths' defaults and how the range ratio spreads them."""

    input_len: int = spec(doc="--random-input-len's default (tokens)", gt=0)
    output_len: int = spec(doc="--random-output-len's default (tokens)", gt=0)
    range_ratio: float = spec(doc="--random-range-ratio's default", ge=0)
    prefix_len: int = spec(doc="--random-prefix-len's default (tokens every request shares; 0 where the tool has "
                               "no such flag)", ge=0)
    spread: Literal["around", "below"] = spec(
        doc="around: a length L uniform on [floor(L (1 - r)), ceil(L (1 + r))], r < 1 (vLLM); below: uniform on "
            "[max(1, int(L r)), L] (SGLang)")


@dataclass(frozen=True, kw_only=True)
class GeneratedDataset:
    """A dataset the tool generates from its own flags (no file)."""

    name: str = spec(doc="its --dataset-name")
    flag_prefix: str = spec(doc="what its flags start with, e.g. --gsp-")
    workload: Literal["prefix_repetition", "shared_prefix"] = spec(
        doc="the workload form it makes: prefix_repetition (num_prompts // num_prefixes prompts per prefix), "
            "shared_prefix (every prompt of every group sent once, shuffled)")
    defaults: dict[str, int] = spec(doc="each flag's default, by the workload form's key, in the parser's order",
                                    gt=0)

    def flag(self, key: str) -> str:
        return self.flag_prefix + key.replace("_", "-")

    def attribute(self, key: str) -> str:
        """The argparse name of the flag of `key`."""
        return self.flag(key).removeprefix("--").replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class BenchTool:
    """One benchmark client's defaults."""

    tool: ToolName = spec(doc="the --bench-tool that names it")
    program: str = spec(doc="how the tool is named in the output, e.g. vllm bench serve")
    package: str = spec(doc="the package and version the values were read from")
    num_prompts: int = spec(doc="--num-prompts' default", gt=0)
    burstiness: float = spec(doc="--burstiness' default (gamma shape of the gaps; 1: Poisson)", gt=0)
    arrivals: Literal["vllm", "poisson"] = spec(
        doc="the workload form's timer: vllm (gamma gaps rescaled to end at num_prompts / rate), poisson "
            "(exponential gaps)")
    ramp_up: bool = spec(doc="whether the tool has --ramp-up-strategy")
    random: RandomDefaults = spec(doc="the random dataset")
    datasets: tuple[GeneratedDataset, ...] = spec(default_factory=tuple, doc="its generated datasets")


def _check(tool: BenchTool, source: str) -> BenchTool:
    if tool.random.spread == "around" and not tool.random.range_ratio < 1:
        raise ConfigError(source, "random.range_ratio", tool.random.range_ratio,
                          "a ratio spread around the length is below 1")
    for i, dataset in enumerate(tool.datasets):
        where = f"datasets[{i}]"
        if not dataset.flag_prefix.startswith("--") or not dataset.flag_prefix.endswith("-"):
            raise ConfigError(source, f"{where}.flag_prefix", dataset.flag_prefix, "expected --name-")
        keys = WORKLOAD_KEYS[dataset.workload][0]
        unknown = [key for key in dataset.defaults if key not in keys]
        if unknown:
            raise ConfigError(source, f"{where}.defaults.{unknown[0]}", dataset.defaults[unknown[0]],
                              f"not a key of the {dataset.workload} workload ({', '.join(keys)})")
        missing = [key for key in keys if key not in dataset.defaults]
        if missing:
            raise ConfigError(source, f"{where}.defaults.{missing[0]}", MISSING,
                              f"the {dataset.workload} workload needs every key ({', '.join(keys)})")
    return tool


def data_dir() -> Path:
    from infersim.cards.registry import bundled_dir

    return bundled_dir("engines") / DATA_FOLDER


def load_bench_tool(path: Path) -> BenchTool:
    """One tool's file, validated."""
    raw: Any = load_yaml(path, "benchmark tool file")
    return _check(build(BenchTool, raw, str(path)), str(path))


def bench_tool(name: str, directory: Path | None = None) -> BenchTool:
    """The defaults of --bench-tool `name` (vllm or sglang)."""
    path = (directory or data_dir()) / TOOL_FILES[name]
    tool = load_bench_tool(path)
    if tool.tool != name:
        raise ConfigError(str(path), "tool", tool.tool, f"the file of --bench-tool {name}")
    return tool


def bench_tools(directory: Path | None = None) -> tuple[BenchTool, ...]:
    """Every tool's defaults, in TOOL_FILES' order."""
    tools = tuple(bench_tool(name, directory) for name in TOOL_FILES)
    seen: dict[str, str] = {}
    for tool in tools:
        for i, dataset in enumerate(tool.datasets):
            if dataset.name in seen:
                raise ConfigError(str((directory or data_dir()) / TOOL_FILES[tool.tool]), f"datasets[{i}].name",
                                  dataset.name, f"a dataset of {seen[dataset.name]} too; one tool generates it")
            seen[dataset.name] = tool.program
    return tools


def generated_dataset(name: str, tools: tuple[BenchTool, ...]) -> tuple[BenchTool, GeneratedDataset] | None:
    """(the tool, the dataset) of a generated dataset's --dataset-name; None: no tool generates it."""
    for tool in tools:
        for dataset in tool.datasets:
            if dataset.name == name:
                return tool, dataset
    return None
