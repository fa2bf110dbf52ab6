"""The in-process command line as the CLI tests drive it: a run's JSON, or its one-line error."""

from __future__ import annotations

import json

import pytest

from infersim.cli.main import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def error_of(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 2) -> str:
    assert main(list(argv)) == code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    return err
