"""Engines' argument parsers as data: the flags InferSim emits, with their type, default, meaning
and the source line of the version they were read from (engines/launch/<framework>-<version>.yaml).

`parser_for(framework, version)` picks the data of the nearest known version at or below an engine
card's (a card version of fewer parts stands for its series: card "0.11" takes parser 0.11.x, the
newest known), so that a new engine card needs no code. Each file is validated on load like a card:
an unknown key, a wrong type, a default outside the choices, a repeated name is one error naming the
file, the key and the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from infersim.cards.schema import build, load_yaml, spec
from infersim.base.errors import MISSING, ConfigError, InferSimError

FlagKind = Literal["int", "float", "text", "choice", "switch", "toggle", "json", "int-list", "url-list"]
Framework = Literal["vllm", "sglang", "trtllm"]

#: folder of the parser data, under the bundled engines directory
DATA_FOLDER = "launch"


@dataclass(frozen=True, kw_only=True)
class SizeRange:
    """Sizes start..stop (inclusive) every `step`; stop null: up to the largest capture size."""

    start: int = spec(doc="first size", gt=0)
    stop: int | None = spec(None, doc="last size (null: up to the engine's largest capture size)", gt=0)
    step: int = spec(1, doc="spacing of the sizes", gt=0)


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One argument of an engine's parser: a command-line flag, an environment variable or a key of
    the configuration file the program reads."""

    name: str = spec(doc="the spelling emitted: --flag, an ENVIRONMENT_VARIABLE, or a dotted.key of the config file")
    kind: FlagKind = spec(
        doc="int, float, text, choice (one of choices), switch (present or not), toggle (--x / --no-x, or a YAML "
            "boolean), json (a JSON object), int-list (space-separated whole numbers, a YAML list), url-list (the "
            "flag repeated per URL)")
    default: float | bool | str | tuple[int, ...] | None = spec(
        None, doc="what the parser gives when the argument is absent (null: unset; the engine derives a value at "
                  "start-up, see default_note)")
    default_note: str = spec("", doc="how the engine derives the value of an unset argument")
    default_sizes: tuple[SizeRange, ...] = spec(
        default_factory=tuple, doc="int-list of CUDA-graph sizes: the sizes the engine captures when the argument is "
                                   "unset, up to its largest capture size")
    choices: tuple[str, ...] = spec(default_factory=tuple, doc="the values a choice accepts")
    json_keys: tuple[str, ...] = spec(default_factory=tuple, doc="the keys a json argument's object may have")
    meaning: str = spec(doc="what the argument does, in a line")
    source: str = spec(doc="where the parser defines it in that version (file:line, and the config field)")


@dataclass(frozen=True, kw_only=True)
class Program:
    """One program's parser: an engine's server, or the router in front of PD-disaggregated servers."""

    package: str = spec(doc="the package and version the arguments were read from")
    program: tuple[str, ...] = spec(doc="how the program starts, e.g. [vllm, serve]")
    model_argument: str = spec("", doc="the flag naming the checkpoint ('' = the first positional argument)")
    config_flag: str = spec("", doc="the flag naming the YAML options file config_file keys go to ('' = none)")
    flags: tuple[Flag, ...] = spec(doc="command-line flags")
    environment: tuple[Flag, ...] = spec(default_factory=tuple, doc="environment variables the program reads")
    config_file: tuple[Flag, ...] = spec(default_factory=tuple, doc="keys of the options file (config_flag)")

    def find(self, name: str) -> Flag | None:
        """The flag, environment variable or options-file key of that name (None: this version has none)."""
        for flag in (*self.flags, *self.environment, *self.config_file):
            if flag.name == name:
                return flag
        return None

    def has(self, name: str) -> bool:
        return self.find(name) is not None

    def lacks_whole_number(self, name: str) -> str:
        """What this parser has instead of a whole-number flag `name` ('' where it has one): the
        running-request cap is set by such a flag."""
        known = self.find(name)
        if known is None:
            return "no such flag"
        return "" if known.kind == "int" else f"{name} as a {known.kind}, not a whole number"


@dataclass(frozen=True, kw_only=True)
class ParserData:
    """An engine version's parsers: its server and, where PD disaggregation needs one, its router."""

    framework: Framework = spec(doc="the engine (an engine card's framework)")
    version: str = spec(doc="the engine version the server's arguments were read from")
    server: Program = spec(doc="the serving program")
    router: Program | None = spec(None, doc="the router of PD-disaggregated deployments (null: none known)")

    @property
    def title(self) -> str:
        return f"{FRAMEWORK_NAMES[self.framework]} {self.version}"


FRAMEWORK_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_NAME = re.compile(r"^(--[a-z0-9][a-z0-9_-]*|[A-Z][A-Z0-9_]*|[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*)$")


def _check_flags(flags: tuple[Flag, ...], where: str, source: str) -> None:
    seen: set[str] = set()
    for i, flag in enumerate(flags):
        path = f"{where}[{i}]"
        if not _NAME.match(flag.name):
            raise ConfigError(source, f"{path}.name", flag.name,
                              "expected --flag, an ENVIRONMENT_VARIABLE or a dotted.config_key")
        if flag.name in seen:
            raise ConfigError(source, f"{path}.name", flag.name, "named twice")
        seen.add(flag.name)
        if (flag.kind == "choice") != bool(flag.choices):
            raise ConfigError(source, f"{path}.choices", list(flag.choices),
                              "a choice lists its choices, and only a choice has them")
        if flag.kind == "choice" and flag.default is not None and flag.default not in flag.choices:
            raise ConfigError(source, f"{path}.default", flag.default, f"not one of its choices {list(flag.choices)}")
        if flag.kind in ("switch", "toggle") and flag.default is not None and not isinstance(flag.default, bool):
            raise ConfigError(source, f"{path}.default", flag.default, f"a {flag.kind} defaults to true or false")
        if flag.json_keys and flag.kind != "json":
            raise ConfigError(source, f"{path}.json_keys", list(flag.json_keys), "only a json argument has keys")
        if flag.default_sizes and flag.kind != "int-list":
            raise ConfigError(source, f"{path}.default_sizes", MISSING, "only an int-list has default sizes")
        if not flag.source.strip() or not flag.meaning.strip():
            raise ConfigError(source, f"{path}.source", flag.source, "every argument names its meaning and source")


def validate_parser_data(data: ParserData, source: str) -> ParserData:
    for name, program in (("server", data.server), ("router", data.router)):
        if program is None:
            continue
        if not program.program:
            raise ConfigError(source, f"{name}.program", [], "say how the program starts")
        for where, flags in (("flags", program.flags), ("environment", program.environment),
                             ("config_file", program.config_file)):
            _check_flags(flags, f"{name}.{where}", source)
        if program.config_file and not program.has(program.config_flag):
            raise ConfigError(source, f"{name}.config_flag", program.config_flag,
                              "config_file keys need the flag that names the file, listed among the flags")
        if program.model_argument and not program.has(program.model_argument):
            raise ConfigError(source, f"{name}.model_argument", program.model_argument, "not among the flags")
    if version_key(data.version) is None:
        raise ConfigError(source, "version", data.version, "expected a version of numbers, e.g. 0.11.0")
    return data


def version_key(text: str) -> tuple[int, ...] | None:
    """'0.11.0' -> (0, 11, 0); '1.0.0rc4' -> (1, 0, 0); None when the text is not a version."""
    parts = []
    for part in str(text).split("."):
        match = re.match(r"\d+", part)
        if not match:
            return None
        parts.append(int(match.group()))
    return tuple(parts) or None


def data_dir() -> Path:
    from infersim.cards.registry import bundled_dir

    return bundled_dir("engines") / DATA_FOLDER


def _whole_defaults(program: Program, source: str, where: str) -> Program:
    """The program with an int argument's default as an int (YAML numbers are read as floats here)."""
    sections: dict[str, tuple[Flag, ...]] = {}
    for section in ("flags", "environment", "config_file"):
        flags = []
        for i, flag in enumerate(getattr(program, section)):
            if flag.kind == "int" and isinstance(flag.default, float):
                if not flag.default.is_integer():
                    raise ConfigError(source, f"{where}.{section}[{i}].default", flag.default, "an int's default is whole")
                flag = replace(flag, default=int(flag.default))
            flags.append(flag)
        sections[section] = tuple(flags)
    return replace(program, flags=sections["flags"], environment=sections["environment"],
                   config_file=sections["config_file"])


def load_parser_data(path: Path) -> ParserData:
    raw: Any = load_yaml(path, "parser data file")
    data = build(ParserData, raw, str(path))
    data = replace(data, server=_whole_defaults(data.server, str(path), "server"),
                   router=None if data.router is None else _whole_defaults(data.router, str(path), "router"))
    return validate_parser_data(data, str(path))


def known_versions(framework: str, directory: Path | None = None) -> dict[tuple[int, ...], Path]:
    """Version -> file of every parser data file of `framework` (named <framework>-<version>.yaml)."""
    found: dict[tuple[int, ...], Path] = {}
    for path in sorted((directory or data_dir()).glob(f"{framework}-*.yaml")):
        key = version_key(path.stem[len(framework) + 1:])
        if key is not None:
            found[key] = path
    return found


@dataclass(frozen=True)
class ChosenParser:
    data: ParserData
    path: Path
    note: str  # how the version was chosen, for the output


def parser_for(framework: str, card_version: str, directory: Path | None = None) -> ChosenParser:
    """The parser data of the nearest known version at or below `card_version`. A card version of
    fewer parts names a series: "0.11" is at or above every 0.11.x, so it takes the newest 0.11.x."""
    name = FRAMEWORK_NAMES.get(framework, framework)
    card = version_key(card_version)
    if card is None:
        raise InferSimError(f"--emit-launch: engine card version {card_version!r} is not a version of numbers")
    known = known_versions(framework, directory)
    if not known:
        raise InferSimError(f"--emit-launch: no parser data for {name} (engines/launch/{framework}-*.yaml): "
                            f"InferSim cannot spell a {name} command")
    eligible = [v for v in known if v[:len(card)] <= card]
    if not eligible:
        listed = ", ".join(".".join(map(str, v)) for v in sorted(known))
        raise InferSimError(f"--emit-launch: no {name} parser data at or below {card_version} (known: {listed}); "
                            "a newer parser's flags may not exist in that version")
    chosen = max(eligible)
    data = load_parser_data(known[chosen])
    if data.framework != framework:
        raise ConfigError(str(known[chosen]), "framework", data.framework, f"the file name says {framework}")
    same = chosen[:len(card)] == card
    note = (f"flags of {data.title}'s parser" if same else
            f"flags of {data.title}'s parser, the nearest known at or below the engine card's {card_version}")
    return ChosenParser(data, known[chosen], note)
