"""`plot` draws a file only as the figure it fits: a CSV that is not a sweep's is refused (a serve
--requests-out file drew as a sweep of 'configurations'), a figure option the chosen figure does
not read is refused rather than ignored, JSON goes through the plain-data reader (a key given
twice is refused), and the sweep breakdown marks what does not fit and what was not recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_cli import one_line_error, run

from infersim.plot import draw, load_result

pytest.importorskip("matplotlib")

SWEEP_HEADER = "deployment.ffn.ep,status,num_gpus,tpot_ms,tgs,ttft_ms,bound,fits,problem"
SWEEP_ROWS = [
    "1,ok,4,26.1,612.0,300.5,compute,True,",
    "2,ok,4,47.6,1343.0,310.0,memory bandwidth,False,",  # does not fit in memory
    "4,ok,4,16.9,950.0,,,True,",  # no TTFT and no bound recorded
    "8,rejected,,,,,,,experts do not divide",
]


@pytest.fixture()
def sweep_csv(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.csv"
    path.write_text("\n".join([SWEEP_HEADER, *SWEEP_ROWS]) + "\n")
    return path


@pytest.fixture()
def run_json(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"prefill": {"ttft_ms": 1.0}, "decode": {"tpot_ms": 1.0}}))
    return path


def plot_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    out = tmp_path / "picture.png"
    code, stdout, err = run(capsys, "plot", *argv, "--out", str(out))
    assert code == 2 and not stdout and not out.exists()
    return err


def test_a_serve_requests_csv_is_not_drawn_as_a_sweep(capsys, tmp_path) -> None:
    records = tmp_path / "requests.csv"
    records.write_text("id,arrival_s,input_tokens,output_tokens,ttft_ms,tpot_ms\n0,0.5,2000,500,31.2,5.7\n")
    for kind in ((), ("--kind", "breakdown"), ("--kind", "sweep")):
        err = plot_error(capsys, tmp_path, str(records), *kind)
        one_line_error(err, f"{records}: not a sweep's CSV: no column status", "serve --requests-out records",
                       "serve --format json")


def test_a_csv_without_the_sweep_columns_is_refused(capsys, tmp_path) -> None:
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    one_line_error(plot_error(capsys, tmp_path, str(other)), f"{other}: not a sweep's CSV: no column status, tpot_ms")


def test_a_sweep_csv_naming_a_column_twice_is_refused(capsys, tmp_path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("status,tpot_ms,tpot_ms\nok,1,2\n")
    one_line_error(plot_error(capsys, tmp_path, str(path)), f"{path}: the header names column 'tpot_ms' twice")


@pytest.mark.parametrize("row, cells", [("ok,1,2", 3), ("ok", 1)])
def test_a_sweep_csv_row_of_another_width_is_refused(capsys, tmp_path, row, cells) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text(f"status,tpot_ms\nok,1\n{row}\n")
    one_line_error(plot_error(capsys, tmp_path, str(path)), f"{path}: line 3: {cells} cells under a header of 2")


def test_json_with_a_key_given_twice_is_refused(capsys, tmp_path) -> None:
    path = tmp_path / "twice.json"
    path.write_text('{"prefill": {"ttft_ms": 1}, "decode": {"tpot_ms": 1, "tpot_ms": 2}}')
    one_line_error(plot_error(capsys, tmp_path, str(path)), f"{path}: field 'decode.tpot_ms'", "given twice")


def test_text_that_is_not_json_keeps_its_hint(capsys, tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    one_line_error(plot_error(capsys, tmp_path, str(path)), f"{path}: not JSON", "save results with --format json")


@pytest.mark.parametrize("kind, found, fits", [("roofline", "sweep", "sweep or breakdown"),
                                               ("serve", "sweep", "sweep or breakdown")])
def test_a_kind_the_sweep_does_not_draw_as_is_refused(capsys, tmp_path, sweep_csv, kind, found, fits) -> None:
    err = plot_error(capsys, tmp_path, str(sweep_csv), "--kind", kind)
    one_line_error(err, f"--kind {kind}: {sweep_csv} is {found} output, which draws as {fits}")


def test_a_kind_the_run_does_not_draw_as_is_refused(capsys, tmp_path, run_json) -> None:
    err = plot_error(capsys, tmp_path, str(run_json), "--kind", "sweep")
    one_line_error(err, f"--kind sweep: {run_json} is run output, which draws as breakdown or roofline")


@pytest.mark.parametrize("argv, parts", [
    (("--kind", "breakdown", "--metric", "tgs"), ("--metric tgs: only the sweep figure reads it", "drawn as breakdown")),
    (("--kind", "breakdown", "--where", "ep=1"), ("--where ep=1: only the sweep figure reads it",)),
    (("--stage", "decode"), ("--stage decode: only the roofline figure reads it", "drawn as sweep")),
])
def test_an_option_the_sweep_figure_does_not_read_is_refused(capsys, tmp_path, sweep_csv, argv, parts) -> None:
    one_line_error(plot_error(capsys, tmp_path, str(sweep_csv), *argv), *parts)


@pytest.mark.parametrize("argv", [("--x", "ep"), ("--series", "ep"), ("--metric", "tgs")])
def test_sweep_options_on_a_run_breakdown_are_refused(capsys, tmp_path, run_json, argv) -> None:
    one_line_error(plot_error(capsys, tmp_path, str(run_json), *argv),
                   f"{argv[0]} {argv[1]}: only the sweep figure reads it", "drawn as breakdown")


def test_the_sweep_figure_takes_its_options(capsys, tmp_path, sweep_csv) -> None:
    out = tmp_path / "lines.png"
    code, stdout, err = run(capsys, "plot", str(sweep_csv), "--metric", "tgs", "--x", "ep", "--out", str(out))
    assert code == 0, err
    assert stdout.strip() == f"wrote {out} (sweep)" and out.stat().st_size > 0


def test_the_sweep_breakdown_marks_unfit_and_unrecorded_rows(sweep_csv) -> None:
    drawing = draw(load_result(str(sweep_csv)), "breakdown")
    drawn = drawing.data
    assert drawn["labels"] == ["ep=1", "ep=2", "ep=4"]  # the rejected row has no bar
    assert drawn["fits"] == [True, False, True]
    # an empty bound is said as not recorded, not drawn in the overhead grey
    assert drawn["bounds"] == ["compute", "memory", "unrecorded"]
    assert drawn["metrics"]["tpot_ms"] == pytest.approx([26.1, 47.6, 16.9])
    assert drawn["metrics"]["ttft_ms"][:2] == pytest.approx([300.5, 310.0]) and drawn["metrics"]["ttft_ms"][2] is None
    tpot_axes, ttft_axes = drawing.figure.axes
    assert [bar.get_hatch() for bar in tpot_axes.patches] == [None, "///", None]
    assert [bar.get_height() for bar in tpot_axes.patches] == pytest.approx([26.1, 47.6, 16.9])
    assert [t.get_text() for t in ttft_axes.texts] == ["no value"]
    legend = [t.get_text() for t in drawing.figure.legends[0].get_texts()]
    assert legend == ["compute-bound", "memory-bound", "bound not recorded",
                      "does not fit in memory (1 of 3): no speed that can happen"]
