"""What a launch plan holds, and the arguments of one command checked against its parser's data.

A `LaunchPlan` is the commands (with their environment and options files) that realise one
simulated deployment, and the `Setting`s: each fact the simulation assumed (a memory share, a
token budget, a running cap, CUDA-graph sizes, a page size ...) with the argument that realises it,
either set on the command line or left at the engine's default where that default equals it.
`Arguments` builds one command: every argument it adds is looked up in the parser data (an
argument the version does not have is an error naming it) and its value checked against the
argument's kind and choices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from infersim.base.errors import InferSimError
from infersim.cards.engine_parser import Flag, ParserData, Program


@dataclass(frozen=True)
class Setting:
    """One fact the simulation assumed, and how the command realises it."""

    fact: str  # e.g. "memory share", "token budget per DP rank"
    value: Any  # in the engine's terms (the flag's value)
    argument: str  # the flag, environment variable or options-file key
    how: Literal["set", "default"]  # set on the command, or the engine default that equals it
    role: str = ""  # the command it belongs to (a PD side)


@dataclass(frozen=True)
class OptionsFile:
    name: str
    text: str


@dataclass(frozen=True)
class Command:
    """One command to run: where, its environment, its arguments, the options file it reads."""

    role: str  # server, prefill, decode, router
    where: str  # which hosts run it
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    files: tuple[OptionsFile, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    engine: str  # the engine card, e.g. "vllm 0.11"
    parser: str  # which parser data spelled it, and why that version
    commands: tuple[Command, ...]
    settings: tuple[Setting, ...]
    notes: tuple[str, ...] = ()
    label: str = ""  # which simulated deployment (a sweep's row)


class Arguments:
    """The arguments of one command, each checked against `program`'s parser data."""

    def __init__(self, program: Program, data: ParserData, role: str) -> None:
        self.program = program
        self.data = data
        self.role = role
        self.argv: list[str] = list(program.program)
        self.env: dict[str, str] = {}
        self.options: dict[str, Any] = {}
        self.settings: list[Setting] = []
        # each argument set so far: (its value, the fact it realises, the engine card field naming it)
        self.given: dict[str, tuple[Any, str, str]] = {}

    def _flag(self, name: str) -> Flag:
        flag = self.program.find(name)
        if flag is None:
            raise InferSimError(f"--emit-launch: {self.program.package} has no {name} in InferSim's parser data "
                                f"(engines/launch/{self.data.framework}-{self.data.version}.yaml): the command cannot "
                                "be spelled for this version")
        return flag

    def model(self, checkpoint: str) -> None:
        if self.program.model_argument:
            self.add(self.program.model_argument, checkpoint)
        else:
            self.argv.append(checkpoint)

    def add(self, name: str, value: Any = True, fact: str = "", named_by: str = "") -> None:
        """Set an argument: a flag on the command line, an environment variable or an options-file key
        (`named_by`: where an engine card field names it, 'FILE: KEY names it for ...', said if it is
        set twice). An argument set twice is an error: the parser would keep one value silently."""
        flag = self._flag(name)
        if name in self.given:
            raise InferSimError(_set_twice(self.data.title, name, self.given[name], (value, fact, named_by)))
        text = _checked(flag, value, self.program.package)
        self.given[name] = (value, fact, named_by)
        if flag in self.program.environment:
            self.env[name] = str(text)
        elif flag in self.program.config_file:
            _nest(self.options, name, value)
        else:
            self.argv.extend(_command_line(flag, value, text))
        if fact:
            self.settings.append(Setting(fact, value, name, "set", self.role))

    def realise(self, name: str, value: Any, fact: str) -> None:
        """Leave the argument at the engine's default where that default equals `value`, else set it."""
        flag = self._flag(name)
        if flag.default is not None and _same(flag.default, value):
            self.settings.append(Setting(fact, value, name, "default", self.role))
        else:
            self.add(name, value, fact)

    def derived_default(self, name: str, value: Any, fact: str) -> None:
        """Record that the engine's derived default (e.g. its CUDA-graph size pattern, flag.default_sizes)
        equals `value`, which the caller has checked, so the argument is left unset."""
        self._flag(name)
        self.settings.append(Setting(fact, value, name, "default", self.role))

    def copy(self) -> Arguments:
        """The same command so far, without its settings (a further node's command)."""
        twin = Arguments(self.program, self.data, self.role)
        twin.argv, twin.env, twin.options = list(self.argv), dict(self.env), dict(self.options)
        twin.given = dict(self.given)
        return twin

    def command(self, where: str, files_name: str = "") -> Command:
        files: tuple[OptionsFile, ...] = ()
        argv = list(self.argv)
        if self.options:
            import yaml

            files = (OptionsFile(files_name, yaml.safe_dump(self.options, sort_keys=False, width=100, default_flow_style=None)),)
            argv.extend([self.program.config_flag, files_name])
        return Command(self.role, where, tuple(argv), tuple(self.env.items()), files)


def _set_twice(title: str, name: str, first: tuple[Any, str, str], second: tuple[Any, str, str]) -> str:
    """Why a command cannot set `name` twice, with the engine card field that names it where one does."""
    values = ", and ".join(f"to {value} for {fact or 'a setting'}" for value, fact, _ in (first, second))
    named = "".join(f"; {by}" for _, _, by in (first, second) if by)
    return f"--emit-launch: {title}'s {name} would be set twice: {values}{named}: the command cannot be spelled"


def _same(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return default is value
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return float(default) == float(value)
    return default == value


def _checked(flag: Flag, value: Any, package: str) -> Any:
    """The value as the parser takes it, or an error naming the argument (a bug in a speller)."""
    kind = flag.kind
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "text": lambda v: isinstance(v, str) and v != "",
        "choice": lambda v: v in flag.choices,
        "switch": lambda v: v is True,
        "toggle": lambda v: isinstance(v, bool),
        "json": lambda v: isinstance(v, dict),
        "int-list": lambda v: isinstance(v, (list, tuple)) and v and all(isinstance(i, int) for i in v),
        "url-list": lambda v: isinstance(v, (list, tuple)) and v and all(isinstance(i, (list, tuple)) for i in v),
    }[kind]
    if not ok(value):
        raise InferSimError(f"--emit-launch: {package} {flag.name} takes a {kind}"
                            + (f" ({', '.join(flag.choices)})" if flag.choices else "") + f", not {value!r}")
    if kind == "json":
        unknown = sorted(set(value) - set(flag.json_keys))
        if unknown:
            raise InferSimError(f"--emit-launch: {package} {flag.name} has no key {unknown[0]!r} in InferSim's parser "
                                f"data (keys: {', '.join(flag.json_keys)})")
        return json.dumps(value, separators=(",", ":"))
    if kind == "float":
        return f"{value:g}"
    return value


def _command_line(flag: Flag, value: Any, text: Any) -> list[str]:
    if flag.kind == "switch":
        return [flag.name]
    if flag.kind == "toggle":
        return [flag.name if value else "--no-" + flag.name[2:]]
    if flag.kind == "int-list":
        return [flag.name, *map(str, value)]
    if flag.kind == "url-list":
        return [word for entry in value for word in (flag.name, *map(str, entry))]
    return [flag.name, str(text)]


def _nest(options: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = options
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = list(value) if isinstance(value, tuple) else value


@dataclass
class PlanParts:
    """Commands, settings and notes gathered while spelling a deployment."""

    commands: list[Command] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def take(self, args: Arguments, where: str, files_name: str = "", record: bool = True) -> Command:
        """Add the command; `record`: also its settings (once per server, not per node)."""
        command = args.command(where, files_name)
        self.commands.append(command)
        if record:
            self.settings.extend(args.settings)
        return command

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
