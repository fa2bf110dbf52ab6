"""A JSONL trace row that gives one field under two of its accepted names (arrival_s and timestamp)
is refused naming the file, the row and both names, as a CSV header that does: which of them holds
the field is not guessed. Keys no field reads do not count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_cli import one_line_error, run

from infersim.base.errors import InferSimError
from infersim.serve.trace_replay import read_trace

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")
PLAIN = {"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}


def _trace(path: Path, second: dict) -> Path:
    """A trace whose second row, after a blank line (row numbers are line numbers), is `second`."""
    path.write_text(json.dumps(PLAIN) + "\n\n" + json.dumps(second) + "\n")
    return path


@pytest.mark.parametrize("second, names", [
    ({"arrival_s": 1, "timestamp": 3, "input_tokens": 10, "output_tokens": 5},
     "keys 'arrival_s' and 'timestamp' both name arrival_s"),
    ({"arrival_s": 1, "input_len": 10, "ContextTokens": 20, "output_tokens": 5},
     "keys 'input_len' and 'ContextTokens' both name input_tokens"),
    ({"arrival_s": 1, "input_tokens": 10, "output_tokens": 5, "osl": 7, "prefix_id": "a", "prefix_tokens": 4},
     "keys 'output_tokens' and 'osl' both name output_tokens"),
    # a null under one name is still the field given twice, as an empty CSV cell under a second column is
    ({"arrival_s": None, "TIMESTAMP": 3, "isl": 10, "osl": 5}, "keys 'arrival_s' and 'TIMESTAMP' both name arrival_s"),
])
def test_a_jsonl_row_giving_a_field_under_two_names_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                second: dict, names: str) -> None:
    trace = _trace(tmp_path / "requests.jsonl", second)
    code, out, err = run(capsys, *SERVE, "--trace", str(trace))
    assert code == 2 and not out
    one_line_error(err, f"trace {trace}: row 3: {names}; keep one")


def test_a_row_with_two_names_of_one_field_and_none_of_another_is_refused(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "requests.jsonl", {"arrival_s": 1, "timestamp": 3, "input_tokens": 10})
    with pytest.raises(InferSimError, match="row 3: no field for output_tokens"):
        read_trace(trace)


def test_keys_no_field_reads_are_not_counted(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "requests.jsonl", {"timestamp": 2.5, "input_len": 30, "output_len": 7, "id": 4,
                                                 "model": "llama", "session": "s1"})
    rows = read_trace(trace)
    assert (list(rows.arrival), list(rows.isl), list(rows.osl)) == ([0.0, 2.5], [10, 30], [5, 7])
