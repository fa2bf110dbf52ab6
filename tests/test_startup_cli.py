"""The plain run's command line is read without argparse, into what argparse would have made of it."""

from __future__ import annotations

import pytest

from infersim.cli import build_parser, plain_run


@pytest.mark.parametrize("argv", [["--config", "qwen3-30b.yaml"], ["run", "--config", "a b.yaml"], ["--config", ""]])
def test_the_plain_run_reads_as_argparse_reads_it(argv: list[str]) -> None:
    parser, _ = build_parser([])
    parsed = parser.parse_args(argv if argv[0] == "run" else ["run", *argv])
    assert vars(plain_run(argv)) == vars(parsed)


@pytest.mark.parametrize("argv", [[], ["--config"], ["--config=x.yaml"], ["--config", "-h"], ["--conf", "x.yaml"],
                                  ["--config", "x.yaml", "--detail"], ["sweep", "--config", "x.yaml"],
                                  ["--help"], ["run", "run", "--config", "x.yaml"]])
def test_any_other_command_line_goes_to_argparse(argv: list[str]) -> None:
    assert plain_run(argv) is None
