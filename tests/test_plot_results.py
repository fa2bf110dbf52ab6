"""Pictures of the other commands' results: compare, validate, sweep and serve; drawn data checked."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, public_reference

pytest.importorskip("matplotlib")

from infersim.cli.main import main  # noqa: E402
from infersim.base.errors import InferSimError  # noqa: E402
from infersim.plot import choose_figure, load_result, result_kind  # noqa: E402
from infersim.plot.compare import draw_compare, draw_validate, validation_cases  # noqa: E402
from infersim.plot.serve import draw_serve, percentile, rate_points  # noqa: E402
from infersim.plot.breakdown import draw_sweep_breakdown  # noqa: E402
from infersim.plot.sweep import draw_sweep, sweep_lines  # noqa: E402
from tracegen.synthetic import TraceBuilder, dense_step, write_trace  # noqa: E402

QWEN3_8B_PREFILL = str(REPO_ROOT / "benchmarks" / "published" / "qwen3-8b-h20-prefill.yaml")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def command_json(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


# ---------------------------------------------------------------------------------------------
# compare


@pytest.fixture(scope="module")
def trace_compare(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    builder = TraceBuilder()
    start = builder.cpu_us
    builder.eager(dense_step(2))
    builder.annotation("step[EXTEND bs=1 toks=512]", start, builder.cpu_us + 1)
    trace = write_trace(tmp_path_factory.mktemp("plot") / "run-TP-0.trace.json.gz", builder.drain())
    return command_json(["compare", "--trace", str(trace), "--config", QWEN3_8B_PREFILL, "--format", "json"])


def test_compare_bars_side_by_side_are_measured_and_predicted_per_module(trace_compare: dict[str, Any]) -> None:
    assert result_kind(trace_compare) == "compare"
    figure, drawn = draw_compare(trace_compare)
    (comparison,) = trace_compare["lanes"][0]["comparisons"]
    modules = comparison["modules"]
    ax = figure.axes[0]
    measured_bars, predicted_bars = ax.patches[:len(modules)], ax.patches[len(modules):]
    rows = drawn["stages"]["prefill"]
    assert len(rows) == len(modules) == len(measured_bars) == len(predicted_bars)
    by_module = {m["module"]: m for m in modules}
    for row, measured, predicted in zip(rows, measured_bars, predicted_bars):
        source = by_module[row["module"]]
        assert measured.get_width() == pytest.approx(source["measured_s"] * 1e3)
        assert predicted.get_width() == pytest.approx(source["predicted_s"] * 1e3)
        # the two bars of a module share its row
        assert predicted.get_y() - measured.get_y() == pytest.approx(measured.get_height())
    assert [t.get_text() for t in ax.get_yticklabels()] == [r["module"] for r in rows]
    # the synthetic trace's dense FFN: 2 layers x 100 us measured
    assert by_module["dense_ffn"]["measured_s"] == pytest.approx(200e-6)


def test_compare_measured_only_trace_draws_measured_bars(tmp_path: Path) -> None:
    builder = TraceBuilder()
    start = builder.cpu_us
    builder.eager(dense_step(2))
    builder.annotation("step[EXTEND bs=1 toks=512]", start, builder.cpu_us + 1)
    trace = write_trace(tmp_path / "run-TP-0.trace.json.gz", builder.drain())
    data = command_json(["compare", "--trace", str(trace), "--format", "json"])
    figure, drawn = draw_compare(data)
    (stage,) = data["lanes"][0]["stages"]
    rows = drawn["stages"][stage["stage"]]
    assert sorted(r["measured_ms"] for r in rows) == pytest.approx(sorted(m["time_s"] * 1e3 for m in stage["modules"]))
    assert all(r["predicted_ms"] is None for r in rows)


def test_bench_compare_one_pair_of_bars_per_metric_and_line(tmp_path: Path) -> None:
    line = {"run_name": "before", "batch_size": 64, "input_len": 1024, "output_len": 16, "prefill_latency": 0.8,
            "prefill_throughput": 81920.0, "median_decode_latency": 0.025, "median_decode_throughput": 2560.0}
    result = tmp_path / "result.jsonl"
    result.write_text(json.dumps(line) + "\n")
    data = command_json(["compare", "--bench-result", str(result), "--config", QWEN3_8B_PREFILL, "--format", "json"])
    assert result_kind(data) == "compare"
    figure, drawn = draw_compare(data)
    metrics = data["results"][0]["metrics"]
    assert len(figure.axes) == len(metrics)
    for ax, m in zip(figure.axes, metrics):
        scale = 1e3 if m["unit"] == "s" else 1.0
        measured, predicted = ax.patches
        assert measured.get_width() == pytest.approx(m["measured"] * scale)
        assert predicted.get_width() == pytest.approx(m["predicted"] * scale)
        assert drawn["metrics"][m["metric"]]["measured"] == [pytest.approx(m["measured"] * scale)]


# ---------------------------------------------------------------------------------------------
# validate


def test_validate_scatter_holds_one_point_per_published_case() -> None:
    published = public_reference("published.yaml")
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        from validate_published import validate
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    data = validate(published)
    assert result_kind(data) == "validate"
    figure, drawn = draw_validate(data)
    ax = figure.axes[0]
    offsets = [tuple(xy) for c in ax.collections for xy in c.get_offsets() if len(c.get_offsets()) and
               c.get_label() in drawn["sources"]]
    assert len(offsets) == len(data["cases"]) == 6
    for case in data["cases"]:
        assert (pytest.approx(case["actual_tgs"]), pytest.approx(case["predicted_tgs"])) in offsets
    assert drawn["outliers"] == []  # the roofline-only errors are within 15% (README table: largest 11.4%)


def test_validate_reader_is_tolerant_and_labels_outliers() -> None:
    data = {"points": [
        {"id": "a", "source": "published", "measured": 100.0, "predicted": 110.0, "error_pct": 10.0, "unit": "tok/s"},
        {"id": "b", "source": "trace", "measured": 50.0, "predicted": 30.0, "unit": "tok/s"},  # -40%: outlier
        {"name": "c", "source": "published", "actual": 2000.0, "predicted": 2100.0, "unit": "tok/s"},
        {"id": "d", "measured": None, "predicted": 3.0},  # nothing to draw
    ], "summary": {"mean_abs_error_pct": 18.3}}
    cases, skipped = validation_cases(data)
    assert skipped == 1
    assert [c["id"] for c in cases] == ["a", "b", "c"]
    assert cases[1]["error_pct"] == pytest.approx(-40.0)
    assert cases[2]["error_pct"] == pytest.approx(5.0)
    figure, drawn = draw_validate(data)
    assert drawn["outliers"] == ["b"]
    assert drawn["sources"] == {"published": [0, 2], "trace": [1]}
    ax = figure.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "measured (tok/s)"
    assert [t.get_text() for t in ax.texts] == ["1"]  # the outlier's number, beside its point
    assert [t.get_text() for t in figure.texts][:2] == [" 1  b  -40%", ""]  # the list under the panels names it
    # plain-number ticks (2,000, not 2 x 10^3), none in scientific notation
    assert all("^" not in label.get_text() and "e+" not in label.get_text() for label in ax.get_xticklabels())
    # the band: predicted within 15% of measured
    band = next(c for c in ax.collections if c.get_label().startswith("within"))
    ys = band.get_paths()[0].vertices[:, 1]
    xs = band.get_paths()[0].vertices[:, 0]
    assert max(ys / xs) == pytest.approx(1.15) and min(ys / xs) == pytest.approx(0.85)


def test_validate_accepted_outliers_are_drawn_and_listed_but_not_counted() -> None:
    data = {"points": [
        {"id": "a", "source": "TRT", "measured": 100.0, "predicted": 110.0, "unit": "tok/s/GPU"},  # +10%
        {"id": "b", "source": "TRT", "measured": 100.0, "predicted": 80.0, "unit": "tok/s/GPU"},  # -20%
        {"id": "m", "source": "TRT", "measured": 100.0, "predicted": 178.0, "unit": "tok/s/GPU",
         "accepted_outlier": "held back by its own run"},  # +78%, excluded as validate excludes it
    ]}
    cases, _ = validation_cases(data)
    assert [c["excluded"] for c in cases] == [False, False, True]
    figure, drawn = draw_validate(data)
    assert drawn["outliers"] == ["m", "b"]  # both drawn and numbered
    title = figure._suptitle.get_text().replace("\n", " ")  # wrapped between words to the figure's width
    # two counted: median of 10% and 20%, mean 15%, 1 of 2 within 15%
    assert "2 cases, median |error| 15.0%, mean 15.0%, 1/2 within ±15% (1 accepted outlier drawn, not counted)" in title
    assert " 1  m  +78%  (excluded)" in [t.get_text() for t in figure.texts][0]


def test_validate_draws_one_panel_per_unit_with_labels_inside_the_figure(tmp_path: Path) -> None:
    data = {"points": [
        {"id": "k1", "source": "DEEPGEMM", "measured": 300.0, "predicted": 390.0, "unit": "TFLOPS"},
        {"id": "k2", "source": "DEEPGEMM", "measured": 1200.0, "predicted": 1250.0, "unit": "TFLOPS"},
        {"id": "s1", "source": "TRT", "measured": 9000.0, "predicted": 9500.0, "unit": "tok/s/GPU"},
        {"id": "s2", "source": "ANT", "measured": 700.0, "predicted": 1000.0, "unit": "tok/s (per GPU)"},
        {"id": "c1", "source": "DEEPEP", "measured": 150.0, "predicted": 120.0, "unit": "us"},
    ]}
    figure, drawn = draw_validate(data)
    assert drawn["panels"] == {"TFLOPS": [0, 1], "tok/s/GPU": [2, 3], "us": [4]}  # one unit, one panel
    assert drawn["outliers"] == ["s2", "k1", "c1"]  # numbered by |error|: +43%, +30%, -20%
    figure.savefig(tmp_path / "v.png")
    renderer = figure.canvas.get_renderer()
    frame = figure.bbox
    for text in [t for ax in figure.axes for t in ax.texts] + list(figure.texts) + [figure.legends[0]]:
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text
    for ax in figure.axes:  # the numbers stay inside their panel, the legend outside every panel
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert ax.get_window_extent(renderer).contains(box.x0, box.y0)
        assert not figure.legends[0].get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_validate_without_cases_is_a_clear_error() -> None:
    with pytest.raises(InferSimError, match="'points'"):
        validation_cases({"points": []})


# ---------------------------------------------------------------------------------------------
# sweep


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("sweep")
    files = {}
    for suffix in ("json", "csv"):
        files[suffix] = where / f"sweep.{suffix}"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(["sweep", "--config", "qwen3-30b.yaml", "--grid", "deployment.ffn.ep=1,2,4",
                         "--grid", "workload.decode_batch_per_gpu=16..64", "--prefill", "--workers", "1",
                         "--out", str(files[suffix])]) == 0
    return files


def test_sweep_lines_are_the_metric_of_each_row(sweep_files: dict[str, Path]) -> None:
    data = load_result(str(sweep_files["json"]))
    assert result_kind(data) == "sweep" and choose_figure(data, None) == "sweep"
    figure, drawn = draw_sweep(data, metric="tgs", x="decode_batch_per_gpu", series="ep")
    assert drawn["x_field"] == "workload.decode_batch_per_gpu" and drawn["series_field"] == "deployment.ffn.ep"
    lines = [line for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in lines] == ["1", "2", "4", "does not fit in memory (1 of 9)"]
    for line in lines[:3]:  # each line joins the configurations that fit, and only those
        ep = int(line.get_label())
        rows = sorted((r for r in data["rows"] if r["deployment.ffn.ep"] == ep and r["fits"]),
                      key=lambda r: r["workload.decode_batch_per_gpu"])
        assert list(line.get_xdata()) == [r["workload.decode_batch_per_gpu"] for r in rows]
        assert list(line.get_ydata()) == pytest.approx([r["tgs"] for r in rows])
    # EP1 at 64 requests per GPU does not fit on the H20s: a hollow marker, not a point of its line
    (unfit,) = [r for r in data["rows"] if not r["fits"]]
    assert (unfit["deployment.ffn.ep"], unfit["workload.decode_batch_per_gpu"]) == (1, 64)
    (ep1,) = [line for line in drawn["lines"] if line["label"] == "1"]
    assert ep1["x"] == [16, 32] and ep1["unfit_x"] == [64] and ep1["unfit_y"] == pytest.approx([unfit["tgs"]])
    hollow = [line for line in figure.axes[0].get_lines() if list(line.get_xdata()) == [64]
              and line.get_markerfacecolor() == "none"]
    assert len(hollow) == 1 and hollow[0].get_color() == lines[0].get_color()


def test_sweep_csv_draws_the_same_lines_as_json(sweep_files: dict[str, Path]) -> None:
    from_json = sweep_lines(load_result(str(sweep_files["json"])), "tpot_ms")
    from_csv = sweep_lines(load_result(str(sweep_files["csv"])), "tpot_ms")
    # default axes: the first swept field along x, the next one as series
    assert from_csv["x_field"] == from_json["x_field"] == "deployment.ffn.ep"
    assert from_csv["series_field"] == "workload.decode_batch_per_gpu"
    assert [line["y"] for line in from_csv["lines"]] == [pytest.approx(line["y"]) for line in from_json["lines"]]


def test_sweep_where_picks_a_slice_and_bad_names_are_clear(sweep_files: dict[str, Path]) -> None:
    data = load_result(str(sweep_files["json"]))
    drawn = sweep_lines(data, "ttft_ms", x="ep", where=["decode_batch_per_gpu=32"])
    (line,) = drawn["lines"]
    assert line["x"] == [1.0, 2.0, 4.0]
    assert line["y"] == pytest.approx([r["ttft_ms"] for r in data["rows"] if r["workload.decode_batch_per_gpu"] == 32])
    with pytest.raises(InferSimError, match="--metric nonsense: no such column"):
        sweep_lines(data, "nonsense")


def test_sweep_breakdown_draws_the_metric_per_configuration(sweep_files: dict[str, Path]) -> None:
    data = load_result(str(sweep_files["json"]))
    figure, drawn = draw_sweep_breakdown(data)
    tpot_bars = figure.axes[0].patches
    assert len(tpot_bars) == len(data["rows"]) == 9
    assert [b.get_height() for b in tpot_bars] == pytest.approx([r["tpot_ms"] for r in data["rows"]])
    assert [b.get_height() for b in figure.axes[1].patches] == pytest.approx([r["ttft_ms"] for r in data["rows"]])
    assert drawn["labels"][0] == "ep=1, decode_batch_per_gpu=16"


# ---------------------------------------------------------------------------------------------
# serve

SERVE = {
    "model": "qwen3-30b-a3b",
    "slo": {"ttft_ms": 2000.0, "tpot_ms": 50.0},
    "output_throughput": 5200.0, "mean_ttft_ms": 900.0, "median_ttft_ms": 800.0, "p99_ttft_ms": 2100.0,
    "median_tpot_ms": 30.0, "p99_tpot_ms": 45.0,
    "rate_sweep": [
        {"rate": 4.0, "output_throughput": 5200.0, "request_throughput": 4.0, "median_ttft_ms": 800.0,
         "p99_ttft_ms": 2100.0, "median_tpot_ms": 30.0, "p99_tpot_ms": 45.0},
        {"rate": 1.0, "output_throughput": 1500.0, "request_throughput": 1.0, "median_ttft_ms": 300.0,
         "p99_ttft_ms": 600.0, "median_tpot_ms": 20.0, "p99_tpot_ms": 25.0},
        {"rate": 2.0, "output_throughput": 2900.0, "request_throughput": 2.0, "median_ttft_ms": 450.0,
         "p99_ttft_ms": 1000.0, "median_tpot_ms": 24.0, "p99_tpot_ms": 33.0},
    ],
    "requests": [{"ttft_ms": 100.0 + 10 * i, "tpot_ms": 20.0 + 0.1 * i} for i in range(100)],
}


def test_serve_curves_over_the_rate_sweep_with_the_slo() -> None:
    assert result_kind(SERVE) == "serve"
    figure, drawn = draw_serve(SERVE)
    assert [p["rate"] for p in drawn["points"]] == [1.0, 2.0, 4.0]  # ordered by rate
    ttft_ax, tpot_ax = figure.axes[:2]
    p50, p99, slo = ttft_ax.get_lines()
    assert list(p50.get_xdata()) == [1500.0, 2900.0, 5200.0]
    assert list(p50.get_ydata()) == [300.0, 450.0, 800.0]
    assert list(p99.get_ydata()) == [600.0, 1000.0, 2100.0]
    assert list(slo.get_ydata()) == [2000.0, 2000.0]
    assert list(tpot_ax.get_lines()[1].get_ydata()) == [25.0, 33.0, 45.0]
    assert ttft_ax.get_xlabel() == "output throughput (tokens/s)" and ttft_ax.get_ylabel() == "TTFT (ms)"


def test_serve_histograms_of_the_requests() -> None:
    figure, drawn = draw_serve(SERVE)
    ttft = drawn["histograms"]["ttft"]
    assert sum(ttft["counts"]) == 100
    assert sum(p.get_height() for p in figure.axes[2].patches) == 100
    assert ttft["p50"] == pytest.approx(595.0)  # 100 + 10 x 49.5
    assert ttft["p99"] == pytest.approx(100 + 10 * 98.01)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_serve_single_run_is_one_point() -> None:
    single = {k: v for k, v in SERVE.items() if k not in ("rate_sweep", "requests")}
    points = rate_points(single)
    assert len(points) == 1 and points[0]["p99_ttft_ms"] == 2100.0 and points[0]["rate"] is None
    figure, drawn = draw_serve(single)
    assert len(figure.axes) == 2 and drawn["histograms"] == {}
    assert figure.axes[0].get_ylim()[0] == 0  # latency from zero


def test_serve_single_run_with_requests_draws_its_histograms_under_a_title_naming_the_run() -> None:
    single = {k: v for k, v in SERVE.items() if k != "rate_sweep"}
    single["run"] = {"title": "llama-3.1-8b on 1 x h100-sxm, sglang 0.5; Poisson 8 req/s"}
    figure, drawn = draw_serve(single)
    assert not drawn["curves"] and len(figure.axes) == 2  # no lone points: the two histograms only
    assert drawn["title"] == ("llama-3.1-8b on 1 x h100-sxm, sglang 0.5; Poisson 8 req/s\n"
                              "output 5,200 tok/s; TTFT p50 800.0 / p99 2,100.0 ms; TPOT p50 30.0 / p99 45.0 ms")
    assert figure._suptitle.get_text() == drawn["title"]


def test_serve_histogram_of_identical_values_is_a_bar_one_can_see() -> None:
    """One client in closed loop gives every request the same TTFT (to the last bit): the bins span
    +-2% of it, not the 1e-11 ms between the values."""
    data = {"requests": [{"ttft_ms": 35.2057661262 + 1e-12 * (i % 3), "tpot_ms": 6.0} for i in range(50)]}
    figure, drawn = draw_serve(data)
    edges = drawn["histograms"]["ttft"]["edges"]
    assert edges[0] == pytest.approx(35.2057661262 * 0.98) and edges[-1] == pytest.approx(35.2057661262 * 1.02)
    assert len(edges) == 6 and sum(drawn["histograms"]["tpot"]["counts"]) == 50
    bar = max(figure.axes[0].patches, key=lambda p: p.get_height())
    assert bar.get_height() == 50 and bar.get_width() == pytest.approx(35.2057661262 * 0.04 / 5)
    assert figure.axes[0].xaxis.get_major_formatter().get_useOffset() is False
