"""Breakdown and roofline pictures of a real run: the drawn bars and points are the JSON's numbers."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import REPO_ROOT

pytest.importorskip("matplotlib")

from infersim.run.config import load_run_config  # noqa: E402
from infersim.base.errors import InferSimError  # noqa: E402
from infersim.plot import choose_figure, draw, result_kind  # noqa: E402
from infersim.plot.backend import BOUND_COLOURS  # noqa: E402
from infersim.plot.breakdown import draw_breakdown, module_segments  # noqa: E402
from infersim.plot.common import spread_labels  # noqa: E402
from infersim.plot.roofline import draw_roofline  # noqa: E402
from infersim.cli.report import to_json_data  # noqa: E402
from infersim.run.simulate import simulate  # noqa: E402


def run_json(*overrides: str) -> dict[str, Any]:
    return to_json_data(simulate(load_run_config("qwen3-30b.yaml", list(overrides), None)))


#: the tests share the run and its roofline drawing (module fixtures): one pytest-xdist worker draws them
pytestmark = pytest.mark.xdist_group("plot-run")


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    return run_json()


@pytest.fixture(scope="module")
def roofline(run: dict[str, Any]) -> Any:
    """The run's roofline drawing (placing its labels is the costly part), drawn once for the tests
    that read it."""
    return draw(run, "roofline")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _colour(rgba: tuple[float, ...]) -> str:
    from matplotlib.colors import to_hex

    return to_hex(rgba)


def test_hardware_peaks_in_run_json(run: dict[str, Any]) -> None:
    peaks = run["hardware_peaks"]
    assert peaks["flops"]["bf16"] == 148e12 and peaks["flops"]["fp8"] == 296e12  # h20 card
    assert peaks["hbm_bandwidth"] == 4.0e12
    assert peaks["compute_efficiency"]["bf16"] == 0.88
    assert peaks["memory_efficiency"] == 0.75
    assert peaks["attention_compute_efficiency"] == 0.85


def test_breakdown_bars_are_the_module_times_of_the_json(run: dict[str, Any]) -> None:
    figure, drawn = draw_breakdown(run)
    for ax, stage in zip(figure.axes[:2], ("prefill", "decode")):
        totals_ms = {m: t / 1000 for m, t in run[stage]["module_totals_us"].items() if t > 0}
        bars = ax.patches
        assert len(bars) == len(totals_ms)
        segments = drawn["stages"][stage]["segments"]
        bottom = 0.0
        for bar, seg in zip(bars, segments):
            # each bar segment is one module's step time, stacked on the ones below it
            assert bar.get_height() == pytest.approx(totals_ms[seg["module"]], rel=1e-12)
            assert bar.get_y() == pytest.approx(bottom)
            assert _colour(bar.get_facecolor()) == BOUND_COLOURS[seg["bound"]]
            bottom += bar.get_height()
        # without overlap the stacked column is the step: the prefill step, the decode step
        step_ms = run[stage]["ttft_ms"] if stage == "prefill" else run[stage]["step_time_ms"]
        assert bottom == pytest.approx(step_ms, rel=1e-9)
    prefill = {s["module"]: s for s in drawn["stages"]["prefill"]["segments"]}
    decode = {s["module"]: s for s in drawn["stages"]["decode"]["segments"]}
    # the worked example: prefill MoE experts compute-bound, decode attention memory-bound, as in the JSON
    assert prefill["moe_experts"]["time_ms"] == pytest.approx(run["prefill"]["module_totals_us"]["moe_experts"] / 1e3)
    assert prefill["moe_experts"]["bound"] == "compute"
    assert decode["attn_core"]["time_ms"] == pytest.approx(run["decode"]["module_totals_us"]["attn_core"] / 1e3)
    assert decode["attn_core"]["bound"] == "memory"
    assert decode["dp_gather"]["bound"] == "comm" and decode["overhead"]["bound"] == "overhead"
    # largest first, as the text report orders its table
    times = [s["time_ms"] for s in drawn["stages"]["prefill"]["segments"]]
    assert times == sorted(times, reverse=True)
    title = figure._suptitle.get_text()
    assert f"prefill step {run['prefill']['step_time_ms']:,.1f} ms" in title and f"TPOT {run['decode']['tpot_ms']:,.2f} ms" in title
    assert f"{run['decode']['tgs']:,.0f} tokens/GPU/s" in title


def test_breakdown_marks_the_step_time_under_two_batch_overlap() -> None:
    data = run_json("deployment.overlap=two-batch")
    figure, drawn = draw_breakdown(data)
    stage = drawn["stages"]["decode"]
    assert stage["kernel_time_ms"] > stage["step_time_ms"]  # overlap hides part of the kernels
    ax = figure.axes[1]
    dashed = [c for c in ax.collections if c.get_linestyle()[0][1] is not None]
    (line,) = dashed
    (segment,) = line.get_segments()
    assert segment[0][1] == pytest.approx(data["decode"]["step_time_ms"])


def test_module_bound_is_the_bound_holding_most_of_its_time() -> None:
    stage = {"modules": [
        {"module": "elementwise", "time_us": 30.0, "bound": "memory"},
        {"module": "elementwise", "time_us": 20.0, "bound": "overhead"},
        {"module": "elementwise", "time_us": 15.0, "bound": "overhead"},
        {"module": "router", "time_us": 0.0, "bound": "compute"},
    ]}
    (seg,) = module_segments(stage)  # zero-time modules are not drawn
    assert (seg.module, seg.time_s, seg.bound) == ("elementwise", pytest.approx(65e-6), "overhead")


def test_roofline_points_sit_at_each_module_intensity_and_rate(run: dict[str, Any], roofline: Any) -> None:
    figure, drawn = roofline
    ax = figure.axes[0]
    offsets = [tuple(c.get_offsets()[0]) for c in ax.collections if len(c.get_offsets()) == 1]
    points = drawn["points"]
    assert len(offsets) == len(points)
    for stage in ("prefill", "decode"):
        sums: dict[str, list[float]] = {}
        for op in run[stage]["modules"]:
            s = sums.setdefault(op["module"], [0.0, 0.0, 0.0])
            s[0] += op["flops"]
            s[1] += op["bytes"]
            s[2] += op["time_us"] * 1e-6
        drawn_modules = {p["module"]: p for p in points if p["stage"] == stage}
        # every module that does FLOPs and is not communication is drawn...
        expected = {m for m, (f, b, t) in sums.items() if f > 0 and m not in ("dispatch", "combine")}
        assert set(drawn_modules) == expected
        for module, p in drawn_modules.items():
            flops, nbytes, seconds = sums[module]
            # ...at intensity FLOPs / bytes and achieved FLOP/s = FLOPs / time, where the artist is
            assert p["intensity"] == pytest.approx(flops / nbytes, rel=1e-12)
            assert p["achieved_flops_per_s"] == pytest.approx(flops / seconds, rel=1e-12)
            assert any(x == pytest.approx(flops / nbytes) and y == pytest.approx(flops / seconds)
                       for x, y in offsets)
    decode = {p["module"]: p for p in points if p["stage"] == "decode"}
    # decode attention reads the KV cache: 8 FLOP/byte, far left of the ridge (37 FLOP/byte at bf16)
    assert decode["attn_core"]["intensity"] == pytest.approx(402653184000.0 / 50410291200.0)
    assert drawn["ridge"]["intensity"] == pytest.approx(148e12 / 4.0e12)
    assert drawn["ridge"]["derated_intensity"] == pytest.approx(148e12 * 0.88 / (4.0e12 * 0.75))
    assert "elementwise (no FLOPs)" in drawn["left_out"]["decode"]
    assert "dp_gather (communication)" in drawn["left_out"]["decode"]


def test_roofline_ceilings_datasheet_and_derated(run: dict[str, Any]) -> None:
    figure, drawn = draw_roofline(run, ("decode",))
    roofs = {r["label"]: r["flops_per_s"] for r in drawn["ceilings"]}
    assert roofs["bf16/fp16"] == 148e12 and roofs["fp8/int8"] == 296e12
    assert roofs["bf16/fp16 x 0.88"] == pytest.approx(148e12 * 0.88)
    assert roofs["attention: bf16 x 0.85"] == pytest.approx(148e12 * 0.85)
    # each compute roof is a horizontal line at its rate
    heights = {round(line.get_ydata()[0] / 1e9) for line in figure.axes[0].get_lines()
               if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2}
    assert {round(v / 1e9) for v in roofs.values()} <= heights
    assert {p["stage"] for p in drawn["points"]} == {"decode"}


def test_roofline_needs_hardware_peaks(run: dict[str, Any]) -> None:
    old = {k: v for k, v in run.items() if k != "hardware_peaks"}
    with pytest.raises(InferSimError, match="hardware_peaks"):
        draw_roofline(old)


def test_run_json_is_recognised_and_draws_breakdown_or_roofline(run: dict[str, Any], roofline: Any) -> None:
    assert result_kind(run) == "run"
    assert choose_figure(run, None) == "breakdown"
    assert choose_figure(run, "roofline") == "roofline"
    with pytest.raises(InferSimError, match="run output, which draws as breakdown or roofline"):
        choose_figure(run, "serve")
    assert roofline.data["kind"] == "roofline"  # draw(run, "roofline")


def test_labels_spread_keep_order_gap_and_limits() -> None:
    placed = spread_labels([0.0, 0.1, 0.2, 5.0, 9.95], 1.0, 0.0, 10.0)
    ordered = sorted(placed)
    assert placed == ordered  # order kept
    assert all(b - a >= 1.0 - 1e-12 for a, b in zip(ordered, ordered[1:]))
    assert min(placed) >= 0.0 and max(placed) <= 10.0
    assert placed[3] == 5.0  # a label with room stays at its segment
    assert spread_labels([2.0, 6.0], 1.0, 0.0, 10.0) == [2.0, 6.0]


#: qwen3-30b.yaml, the tests above draw
OTHER_CONFIGS = sorted(p.name for p in (REPO_ROOT / "configs").glob("*.yaml") if p.name != "qwen3-30b.yaml")


@pytest.mark.parametrize("config", OTHER_CONFIGS)
def test_every_bundled_config_draws_breakdown_and_roofline(config: str) -> None:
    data = to_json_data(simulate(load_run_config(config, [], None)))
    figure, drawn = draw_breakdown(data)
    for ax, stage in zip(figure.axes[:2], ("prefill", "decode")):
        totals_ms = {m: t / 1000 for m, t in data[stage]["module_totals_us"].items() if t > 0}
        assert {s["module"]: s["time_ms"] for s in drawn["stages"][stage]["segments"]} == pytest.approx(totals_ms)
        assert sum(bar.get_height() for bar in ax.patches) == pytest.approx(sum(totals_ms.values()))
    _, roofline = draw_roofline(data)
    assert roofline["points"] and all(p["intensity"] > 0 and p["achieved_flops_per_s"] > 0
                                      for p in roofline["points"])
