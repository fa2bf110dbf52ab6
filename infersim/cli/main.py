"""Command line. `python -m infersim --config X.yaml` simulates; subcommands do the rest.

Exit status: 0 ok; 1 the answer is "cannot run" (does not fit in memory, nothing to compare, no
configuration meets the targets); 2 bad input (an InferSimError, printed as one line on stderr);
3 internal error (a bug, one line unless INFERSIM_DEBUG=1); 130 interrupted. No traceback reaches
the user.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from infersim.base.errors import InferSimError, shorten
from infersim.run.flags import DEFAULT_ISL, DEFAULT_OSL, FLAG_DESTS, RunFlags

if TYPE_CHECKING:  # argparse (with gettext and locale, ~3 ms) is imported only where a parser is built
    import argparse

    from infersim.run.config import RunConfig

#: a message longer than this is cut (values inside messages are cut to 200 characters already)
MAX_MESSAGE_CHARS = 2000

# Subcommands and the module that registers each (register(subparsers) sets a `handler` default
# returning an exit code). A plain run imports none of them; a subcommand imports only its own
# module; --help imports them all. Optional modules that are absent are skipped.
SUBCOMMANDS = {
    "cards": "infersim.cli.cards",
    "mfu": "infersim.tabletools.cli",
    "compare": "infersim.trace.cli",
    "sweep": "infersim.sweep.cli",
    "pareto": "infersim.sweep.cli",
    "generate": "infersim.generate.cli",
    "plot": "infersim.plot.cli",
    "roofline": "infersim.plot.cli",
    "validate": "infersim.validate.cli",
    "calibrate": "infersim.calibrate.cli",
    "serve": "infersim.serve.cli",
    "cache": "infersim.cli.cache",
}
SUBCOMMAND_MODULES = tuple(dict.fromkeys(SUBCOMMANDS.values()))

#: the run command's option defaults, as argparse fills them in
RUN_DEFAULTS = {"overrides": [], "mfu_tables": None, "format": "text", "detail": False, "plot": None,
                "show_unfit": False, "emit_launch": False, **dict.fromkeys(FLAG_DESTS)}


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="run config: a path, or the name of a bundled example (e.g. qwen3-30b.yaml); or name the "
                             "run with --model, --hardware and the flags below")
    parser.add_argument("--set", dest="overrides", action="append", default=RUN_DEFAULTS["overrides"],
                        metavar="FIELD=VALUE",
                        help="override any config field, e.g. deployment.num_gpus=8 or model.num_key_value_heads=2 "
                             "(repeatable)")
    parser.add_argument("--mfu-tables", default=RUN_DEFAULTS["mfu_tables"], metavar="DIR",
                        help="directory of measured kernel tables (overrides the config's mfu_tables); 'none' = "
                             "roofline only; default: the bundled tables of the card's device and the engine")
    parser.add_argument("--format", choices=("text", "json"), default=RUN_DEFAULTS["format"], help="output format")
    parser.add_argument("--detail", action="store_true", default=RUN_DEFAULTS["detail"],
                        help="text: also list every operation")
    parser.add_argument("--plot", default=RUN_DEFAULTS["plot"], metavar="FILE",
                        help="also draw the module breakdown to FILE (.png, .svg or .pdf; needs matplotlib)")
    parser.add_argument("--show-unfit", action="store_true", default=RUN_DEFAULTS["show_unfit"],
                        help="text: print TTFT/TPOT/throughput even when the run does not fit in memory (marked); "
                             "the exit status is still 1")
    add_emit_launch(parser)
    add_run_flags(parser)


def add_emit_launch(parser: argparse.ArgumentParser, what: str = "the simulated deployment") -> None:
    parser.add_argument("--emit-launch", action="store_true", default=RUN_DEFAULTS["emit_launch"],
                        help=f"also print the engine command(s) that realise {what}, spelled with the engine "
                             "version's own flags (JSON: under 'launch', each command a list of arguments); "
                             "docs/launch.md")


def add_run_flags(parser: argparse.ArgumentParser, lengths: bool = True, batch: bool = True) -> None:
    """The direct flags, in their own help group. `lengths`: also --isl/--osl as whole numbers
    (serve has its own, which take distributions); `batch`: also --batch-per-gpu (a sweep has
    its own --batch list)."""
    count = number_arg(whole=True, gt=0)
    group = parser.add_argument_group(
        "model, GPUs and engine (instead of --config, or on top of it; names resolve forgivingly: h100, vLLM, "
        "Qwen/Qwen3-8B, a config.json path)")
    group.add_argument("--model", default=None, metavar="NAME", help="model card: bundled name, HF id, card YAML or "
                                                                     "HF config.json path")
    group.add_argument("--hardware", "--gpu", dest="hardware", default=None, metavar="NAME",
                       help="hardware card: bundled name (h100, h200, b200, ...) or path")
    group.add_argument("--engine", default=None, metavar="NAME[@VERSION]",
                       help="engine card: vllm, sglang, trtllm, huggingface (the newest bundled card of that engine), "
                            "NAME@VERSION for another (vllm@0.15, sglang@0.5.x), or a path (default: sglang@0.5)")
    group.add_argument("--num-gpus", type=count, default=None, metavar="G",
                       help="GPUs in total (default: what --tp x --dp-attention x --pp give)")
    group.add_argument("--num-nodes", type=count, default=None, metavar="N",
                       help="nodes the GPUs spread over (default: as many as the GPUs fill)")
    group.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=count, default=None, metavar="N",
                       help="tensor parallelism of attention, and of the FFN (experts: see --ep)")
    group.add_argument("--dp-attention", "--data-parallel-size", dest="dp_attention", type=count, default=None,
                       metavar="D", help="data-parallel attention replicas per pipeline stage")
    group.add_argument("--ep", type=count, default=None, metavar="E",
                       help="expert parallelism: routed experts spread over E GPUs (MoE models)")
    group.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=count, default=None, metavar="P",
                       help="pipeline-parallel stages")
    if lengths:
        group.add_argument("--isl", "--input-len", dest="isl", type=count, default=None, metavar="TOKENS",
                           help=f"input (prompt) length (default: the config's, else {DEFAULT_ISL})")
        group.add_argument("--osl", "--output-len", dest="osl", type=count, default=None, metavar="TOKENS",
                           help=f"output length (default: the config's, else {DEFAULT_OSL})")
    if lengths and batch:
        group.add_argument("--batch-per-gpu", default=None, metavar="N|max",
                           help="concurrent decode requests per GPU (default: max, the largest that fits and the "
                                "engine allows)")
    group.add_argument("--precision", default=None, choices=("bf16", "fp16", "fp8", "int8", "fp4"),
                       help="GEMM inputs and stored weights (default bf16)")
    group.add_argument("--kv-cache-dtype", default=None, choices=("bf16", "fp16", "fp8"),
                       help="KV-cache storage format (default bf16)")
    group.add_argument("--calibration", default=None, metavar="PROFILE.yaml",
                       help="calibration profile of this GPU and engine (`infersim calibrate --out`): run config key "
                            "`calibration`; docs/calibration.md")
    energy = parser.add_argument_group("energy cost (run config section `energy`; docs/energy.md)")
    energy.add_argument("--usd-per-kwh", type=number_arg(ge=0), default=None, metavar="USD",
                        help="electricity price, US dollars per kWh (default 0.0804: US EIA, average price to "
                             "industrial customers, 2023)")
    energy.add_argument("--pue", type=number_arg(ge=1), default=None, metavar="X",
                        help="power usage effectiveness multiplying the GPUs' energy in its cost (default 1.0: the "
                             "GPU boards only)")


def _batch(text: str | None) -> int | str | None:
    if text is None or text == "max":
        return text
    import argparse

    try:
        return int(number_arg(whole=True, gt=0)(text))
    except argparse.ArgumentTypeError as exc:
        raise InferSimError(f"--batch-per-gpu {exc} (or max)") from None


def flags_from_args(args: argparse.Namespace) -> RunFlags:
    """The RunFlags of parsed arguments (flags a parser lacks count as not given)."""
    get = lambda name: getattr(args, name, None)  # noqa: E731
    isl, osl = get("isl"), get("osl")
    return RunFlags(model=get("model"), hardware=get("hardware"), engine=get("engine"), num_gpus=_int(get("num_gpus")),
                    num_nodes=_int(get("num_nodes")), tp=_int(get("tp")), dp_attention=_int(get("dp_attention")),
                    ep=_int(get("ep")), pp=_int(get("pp")), isl=_int(isl) if isinstance(isl, (int, float)) else None,
                    osl=_int(osl) if isinstance(osl, (int, float)) else None, batch_per_gpu=_batch(get("batch_per_gpu")),
                    precision=get("precision"), kv_cache_dtype=get("kv_cache_dtype"), calibration=get("calibration"))


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def load_config_from_args(args: argparse.Namespace, extra_overrides: Sequence[str] = ()) -> RunConfig:
    """The run config a command's --config, direct flags (infersim.run.flags) and --set name."""
    from infersim.run.config import load_run_config

    return load_run_config(getattr(args, "config", None), [*command_overrides(args), *extra_overrides],
                           getattr(args, "mfu_tables", None), flags_from_args(args))


def command_overrides(args: argparse.Namespace) -> list[str]:
    """A command's --set overrides, with the fields its energy flags set (--usd-per-kwh is
    energy.usd_per_kwh). A flag and a --set of the same field is refused naming both: which one
    is meant is not guessed."""
    overrides = list(getattr(args, "overrides", ()))
    for key in ("usd_per_kwh", "pue"):
        value = getattr(args, key, None)
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        for text in overrides:
            if text.split("=", 1)[0].strip() == f"energy.{key}":
                raise InferSimError(f"{flag} {value:g} and --set {shorten(text)}: both set energy.{key}; give one")
        overrides.append(f"energy.{key}={value!r}")
    return overrides


def print_notes(config: RunConfig) -> None:
    """What the command line's names resolved to, one line each on stderr (for commands whose
    report does not show them)."""
    for note in config.notes:
        print(f"infersim: note: {note}", file=sys.stderr)


def _calibration_beside(config: RunConfig, result: Any) -> dict[str, Any] | None:
    """A calibrated run's headline beside the same run on the uncalibrated cards (None: no calibration)."""
    if config.calibration is None:
        return None
    from infersim.calibrate.beside import run_beside
    from infersim.cli.report import to_json_data
    from infersim.run.config import without_calibration
    from infersim.run.simulate import simulate

    plain = to_json_data(simulate(without_calibration(config)))
    return run_beside(config.calibration, to_json_data(result), plain)


def run_command(args: argparse.Namespace) -> int:
    from infersim.cli.report import to_json_data, to_text
    from infersim.run.simulate import simulate

    plot_path = getattr(args, "plot", None)
    if plot_path:
        from infersim.base.outputs import inputs_of
        from infersim.plot.backend import check_picture_path

        # a wrong format or directory fails before simulating; a missing matplotlib after the report
        check_picture_path(plot_path, "--plot", need_matplotlib=False, inputs=inputs_of(args))
    config = load_config_from_args(args)
    result = simulate(config)
    launch = _launch_plan(result) if getattr(args, "emit_launch", False) else None
    calibration = _calibration_beside(config, result)
    if args.format == "json":
        import json  # here: the text report, the default, needs no JSON

        data = to_json_data(result)
        if calibration is not None:
            data["calibration"] = calibration
        if launch is not None:
            from infersim.launch.report import plan_json

            data["launch"] = plan_json(launch)
        print(json.dumps(data, indent=2))
    else:
        print(to_text(result, detail=args.detail, show_unfit=args.show_unfit))
        if calibration is not None:
            from infersim.calibrate.beside import beside_text

            print("\n" + beside_text(calibration))
        if launch is not None:
            from infersim.launch.report import plan_text

            print("\n" + plan_text(launch))
    if plot_path:
        from infersim.plot import draw
        from infersim.plot.backend import require_matplotlib, save_figure

        require_matplotlib(f"--plot {plot_path}")  # after the report: a missing matplotlib does not lose it
        save_figure(draw(to_json_data(result), "breakdown").figure, plot_path)
        print(f"wrote {plot_path}", file=sys.stderr)  # stderr: stdout stays the report (or clean JSON)
    if not result.fits:
        no_command = " (so --emit-launch has no command for it)" if getattr(args, "emit_launch", False) else ""
        print(f"infersim: does not fit{no_command}: {result.unfit[0]}", file=sys.stderr)
        return 1
    return 0


def _launch_plan(result: Any) -> Any:
    """The launch plan of a simulated run (None when the run does not fit: nothing to launch, said with
    the reason it does not fit)."""
    if not result.fits:
        return None
    from infersim.launch.build import plan_for_run

    return plan_for_run(result)


def canonical_choice(action: argparse.Action, value: Any) -> Any:
    """A choice given in another case (--precision FP8) as the parser spells it."""
    if action.choices is None or not isinstance(value, str) or value in action.choices:
        return value
    same = [c for c in action.choices if isinstance(c, str) and c.lower() == value.lower()]
    return same[0] if len(same) == 1 else value


def build_parser(only: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser with the run command and the subcommand modules `only` (default: all)."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        """Bad arguments are one line on stderr, as every other bad input (exit 2; --help shows usage)."""

        def error(self, message: str) -> NoReturn:
            self.exit(2, f"{self.prog}: error: {shorten(message, MAX_MESSAGE_CHARS)} (see {self.prog} --help)\n")

        def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
            return canonical_choice(action, super()._get_value(action, arg_string))

        def _check_value(self, action: argparse.Action, value: Any) -> None:
            if action.choices is not None and value not in action.choices:
                import difflib

                close = difflib.get_close_matches(str(value), [str(c) for c in action.choices], n=1, cutoff=0.5)
                if close:
                    raise argparse.ArgumentError(action, f"invalid choice: {value!r}; did you mean {close[0]!r}? "
                                                         f"(choose from {', '.join(map(str, action.choices))})")
            super()._check_value(action, value)

    parser = OneLineParser(
        prog="infersim",
        description="Predict LLM serving speed and cost (TTFT, TPOT, tokens/GPU/s) on given GPUs, module by module.",
        epilog="Run `infersim --config X.yaml` (or `infersim --model M --hardware H --tp N ...`) to simulate, or a "
               "subcommand with --help.")
    from infersim import __version__

    parser.add_argument("--version", "-V", action="version", version=f"infersim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = subparsers.add_parser("run", help="simulate a run config (the default command)")
    add_run_arguments(run)
    run.set_defaults(handler=run_command)
    for name in SUBCOMMAND_MODULES if only is None else only:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # optional subcommand not part of this build
            raise
        module.register(subparsers)
    return parser, subparsers.choices


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = args_list[0] if args_list else ""
    if first in ("--version", "-V"):
        from infersim import __version__

        print(f"infersim {__version__}")
        return 0
    if first in SUBCOMMANDS:
        parser, _commands = build_parser([SUBCOMMANDS[first]])
    elif first in ("-h", "--help") or not args_list:
        parser, _commands = build_parser()
    else:
        parser, _commands = build_parser([])
        if first != "run":
            args_list = ["run", *args_list]
    try:
        args = parser.parse_args(args_list)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except InferSimError as exc:
        code = getattr(exc, "exit_code", 2)
        print(f"infersim: {'error: ' if code == 2 else ''}{shorten(str(exc), MAX_MESSAGE_CHARS, 600)}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("infersim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug, not bad input: say so in one line unless debugging
        if os.environ.get("INFERSIM_DEBUG"):
            raise
        print(f"infersim: internal error ({type(exc).__name__}: {exc}); please report it. "
              "Set INFERSIM_DEBUG=1 to see the traceback.", file=sys.stderr)
        return 3


def add_option_aliases(parser: argparse.ArgumentParser, aliases: dict[str, str]) -> None:
    """Make each alias (e.g. vllm bench serve's --request-rate) another name of an option the
    parser has (--rate): one option, so help lists both names and either sets it. Given twice with
    different values (`--rate 4 --request-rate 6`) it is refused: the last one winning hides which
    was meant."""
    for alias, option in aliases.items():
        action = parser._option_string_actions[option]  # argparse's own table of option names
        action.option_strings.append(alias)
        parser._option_string_actions[alias] = action
        if not getattr(action, "given_once", False):
            action.__class__ = _given_once(type(action))


def _given_once(store: type) -> type:
    """argparse's action class `store`, refusing a second, different value in one parse (the first
    is kept on the parse's namespace, beside the option's value)."""

    def __call__(self: Any, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        mark = f"_given_{self.dest}"
        earlier = getattr(namespace, mark, None)
        if earlier is not None and earlier[1] != values:
            parser.error(f"{option_string} {values} and {earlier[0]} {earlier[1]}: one option given twice "
                         "(under two names or one); give it once")
        setattr(namespace, mark, (option_string, values))
        store.__call__(self, parser, namespace, values, option_string)

    return type(f"GivenOnce{store.__name__}", (store,), {"__call__": __call__, "given_once": True})


def number_arg(whole: bool = False, gt: float | None = None, ge: float | None = None) -> Callable[[str], float]:
    """An argparse `type` applying the schema's number rule (finite, whole for counts, range), so
    `--target-tpot-ms nan` or `--max-tp 0` is refused like a bad card value."""
    import argparse

    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError

    def parse(text: str) -> float:
        try:
            return check_number(text, "", "", whole=whole, gt=gt, ge=ge)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(f"{shorten(repr(text))}: {exc.problem}") from None

    parse.__name__ = "whole number" if whole else "number"
    return parse
