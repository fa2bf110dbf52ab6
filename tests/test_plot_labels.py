"""Every kind of picture, rendered from the results the commands print: no two pieces of text the
renderer draws overlap (titles, axis and tick labels, legends, point and line labels, footnotes),
none is cut by the figure's edge, and a footnote breaks between words."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.backends.backend_agg import RendererAgg  # noqa: E402

from infersim.cli.main import main  # noqa: E402
from infersim.plot import draw  # noqa: E402

#: a text that grazes another by at most this many pixels (anti-aliasing, the font's line gap) is clear of it
SLACK_PX = 1.0


def command_json(*argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(list(argv)) == 0
    return json.loads(out.getvalue())


def agg_canvas(figure: Any) -> Any:
    """The figure's Agg canvas; a new one for a figure pyplot closed (after saving it, or after the
    test that drew it first)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    return figure.canvas


@contextlib.contextmanager
def drawn_texts(figure: Any) -> Iterator[list[tuple[str, Any]]]:
    """(text, its box as drawn: corners of the rotated rectangle) of every text the renderer draws."""
    found: list[tuple[str, Any]] = []
    original = RendererAgg.draw_text

    def record(self: Any, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False,
               mtext: Any = None) -> Any:
        if s.strip():
            width, height, descent = self.get_text_width_height_descent(s, prop, ismath)
            # Agg is handed y counted from the top (the renderer flips y): count it from the bottom
            found.append((s, _corners(x, self.height - y, width, height, descent, angle)))
        return original(self, gc, x, y, s, prop, angle, ismath, mtext)

    RendererAgg.draw_text = record  # type: ignore[method-assign]
    agg_canvas(figure)
    try:
        figure.canvas.draw()
        yield found
    finally:
        RendererAgg.draw_text = original  # type: ignore[method-assign]


def _corners(x: float, y: float, width: float, height: float, descent: float, angle: float) -> list[tuple[float, float]]:
    """The four corners (display pixels, y up) of a line of text drawn at (x, y) rotated by `angle`."""
    # Agg draws from the baseline's left end; the box spans descent below it to height - descent above
    box = [(0.0, -descent), (width, -descent), (width, height - descent), (0.0, height - descent)]
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return [(x + bx * c - by * s, y + bx * s + by * c) for bx, by in box]


def _separated(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether two convex quadrilaterals are apart by more than SLACK_PX (separating axis test)."""
    for poly in (a, b):
        for i in range(4):
            (x1, y1), (x2, y2) = poly[i], poly[(i + 1) % 4]
            nx, ny = y2 - y1, x1 - x2
            norm = math.hypot(nx, ny) or 1.0
            nx, ny = nx / norm, ny / norm
            pa = [px * nx + py * ny for px, py in a]
            pb = [px * nx + py * ny for px, py in b]
            if max(pa) < min(pb) + SLACK_PX or max(pb) < min(pa) + SLACK_PX:
                return True
    return False


def assert_no_overlap(figure: Any) -> list[str]:
    with drawn_texts(figure) as texts:
        width, height = figure.bbox.width, figure.bbox.height
        for text, corners in texts:
            assert all(-SLACK_PX <= x <= width + SLACK_PX and -SLACK_PX <= y <= height + SLACK_PX
                       for x, y in corners), f"cut by the figure's edge: {text!r}"
        clashes = [f"{a!r} / {b!r}" for i, (a, ca) in enumerate(texts) for b, cb in texts[i + 1:]
                   if not _separated(ca, cb)]
        assert not clashes, "overlapping text: " + "; ".join(clashes[:6])
        return [t for t, _ in texts]


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


RUNS = {
    "dense TP8 with tables": ("--model", "llama-3.1-70b", "--hardware", "h100", "--tp", "8", "--engine", "vllm"),
    "MoE on DP attention": ("--config", "qwen3-30b.yaml"),
    # TensorRT-LLM's B200 tables: the ones `validate` indexes too, where SGLang's would be indexed for this run alone
    "fp8 on B200": ("--model", "qwen3-235b-a22b", "--hardware", "b200", "--tp", "8", "--ep", "8", "--precision", "fp8",
                    "--engine", "trtllm"),
    "roofline only, MI300X": ("--model", "llama-3.1-8b", "--hardware", "mi300x", "--engine", "vllm"),
}


class OnFirstUse(dict):  # type: ignore[type-arg]
    """A dict whose value for a key is made when first read: a pytest-xdist worker makes only the
    runs and drawings its share of the tests reads, each once."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: str) -> Any:
        self[key] = value = self.make(key)
        return value


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    return OnFirstUse(lambda name: command_json(*RUNS[name], "--format", "json"))


@pytest.fixture(scope="module")
def rooflines(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each run's roofline drawing, drawn once for the tests that read it (placing its labels is the
    costly part)."""
    return OnFirstUse(lambda name: draw(runs[name], "roofline"))


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("kind", ["breakdown", "roofline"])
def test_run_pictures_have_no_overlapping_text(runs: dict[str, dict[str, Any]], rooflines: dict[str, Any],
                                               run: str, kind: str) -> None:
    drawing = rooflines[run] if kind == "roofline" else draw(runs[run], kind)
    texts = assert_no_overlap(drawing.figure)
    assert texts  # something was drawn


@pytest.mark.parametrize("run", list(RUNS))
def test_roof_labels_sit_off_every_line(rooflines: dict[str, Any], run: str) -> None:
    from infersim.plot.common import _crosses, _line_segments

    drawing = rooflines[run]
    figure, ax = drawing.figure, drawing.figure.axes[0]
    canvas = agg_canvas(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    segments = _line_segments([line for line in ax.lines if len(line.get_xdata()) > 1])
    notes = [t for t in ax.texts if t.get_text() in drawing.data["roof_labels"]]
    # every datasheet and derated roof but attention's (in the legend) is named once; equal roofs share a name
    named = {c["flops_per_s"] for c in drawing.data["ceilings"] if not c.get("attention")}
    assert len(notes) == len(named)
    from matplotlib.text import Text

    for note in notes:
        box = Text.get_window_extent(note, renderer)  # the words, without the leader to the roof's end
        assert box.x0 >= ax.get_window_extent(renderer).x1  # right of the plot, where no roof runs
        assert not any(_crosses(box, seg) for seg in segments), note.get_text()


def test_the_roofline_footnote_breaks_between_words(rooflines: dict[str, Any]) -> None:
    figure = rooflines["MoE on DP attention"].figure
    with drawn_texts(figure) as texts:
        lines = [t for t, _ in texts if "not drawn" in t or "(no FLOPs)" in t or "(communication)" in t]
    assert lines, "the footnote lists what is not drawn"
    words = {w for line in lines for w in line.replace("\n", " ").split()}
    whole = " ".join(lines).replace("\n", " ")
    for line in lines:
        for piece in line.split("\n"):
            # each line of the footnote ends at a word's end: its last word is a word of the footnote
            assert piece.split()[-1] in words and piece.rstrip().endswith(tuple(whole.split()))


def test_sweep_and_frontier_pictures_have_no_overlapping_text(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.decode_batch_per_gpu=16,32,64,max",
                 "--grid", "deployment.ffn.ep=1,2,4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    drawing = draw(data, "sweep")
    assert_no_overlap(drawing.figure)
    # 'max' is no category: it sits at the batch each row resolved it to, on the numeric axis
    assert drawing.data["numeric_x"] and drawing.data["categories"] is None
    resolved = {float(r["batch_per_gpu"]) for r in data["rows"]
                if r["workload.decode_batch_per_gpu"] == "max" and r["fits"]}
    assert resolved and resolved <= set(drawing.data["max_x"])
    for line in drawing.data["lines"]:
        assert line["x"] == sorted(line["x"])


def test_frontier_picture_marks_the_answer_without_overlapping_text(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    figures: list[Any] = []
    from infersim.sweep import output

    original = output.frontier_figure

    def keep(*args: Any, **kwargs: Any) -> Any:
        figure = original(*args, **kwargs)
        figures.append(figure)
        return figure

    monkeypatch.setattr(output, "frontier_figure", keep)
    picture = tmp_path / "frontier.png"
    with contextlib.redirect_stdout(io.StringIO()) as stdout, contextlib.redirect_stderr(io.StringIO()):
        assert main(["pareto", "--config", "qwen3-30b.yaml", "--grid", "hardware=h20,h800,h200,b200,rtx-a6000",
                     "--gpus", "1..16", "--target-user-tps", "30", "--plot", str(picture), "--workers", "1"]) == 0
    (figure,) = figures
    texts = assert_no_overlap(figure)
    assert texts
    answer = next(line for line in stdout.getvalue().splitlines() if line.startswith("answer: "))
    cost = answer.rsplit(": $", 1)[1].split("/M")[0]
    # the star's label names the answer's point and cost
    assert any(f"${cost}/M" in t.replace("\n", " ") for t in texts)
    stars = [c for ax in figure.axes for c in ax.collections if c.get_label() == "the answer (star)"]
    assert len(stars) == 1 and len(stars[0].get_offsets()) == 1


@pytest.fixture(scope="module")
def serve_sweep() -> dict[str, Any]:
    return command_json("serve", "--model", "llama-3.1-8b", "--hardware", "h100", "--rate-sweep", "2,8,32",
                        "--num-requests", "200", "--slo", "ttft=1s,tpot=50ms", "--workers", "1", "--format", "json")


def test_serve_picture_has_no_overlapping_text(serve_sweep: dict[str, Any]) -> None:
    assert_no_overlap(draw(serve_sweep, "serve").figure)


def test_validate_and_compare_pictures_have_no_overlapping_text(tmp_path: Path) -> None:
    points = [{"id": f"p{i}", "source": "SRC" if i % 2 else "OTHER", "measured": 100.0 * (1 + i),
               "predicted": 100.0 * (1 + i) * (1 + (-1) ** i * 0.05 * (i % 7)), "unit": "tok/s"} for i in range(30)]
    assert_no_overlap(draw({"points": points}, "validate").figure)
    bench = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"
    compared = command_json("compare", "--bench-result", str(bench), "--hardware", "h100", "--format", "json")
    assert_no_overlap(draw(compared, "compare").figure)
