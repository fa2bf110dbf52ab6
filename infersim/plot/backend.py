"""matplotlib, imported only when a picture is asked for, and the files pictures are written to.

matplotlib is an optional extra (`pip install '.[plot]'` in a clone): nothing in the simulator imports
it, and every figure function gets it through `pyplot()`, which selects the non-interactive Agg
backend first so drawing works on machines without a display.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from infersim.base.errors import InferSimError
from infersim.base.outputs import check_output_path

#: file formats a picture can be written in, by extension
PICTURE_FORMATS = (".png", ".svg", ".pdf")

#: how to get matplotlib: infersim is installed from a clone (`pip install .`), not from an index,
#: so `pip install 'infersim[plot]'` finds nothing; the extra is named from the clone
INSTALL_HINT = "pip install matplotlib (or, in the infersim clone: pip install '.[plot]')"

#: dots per inch of written PNGs: ~100 keeps a 10 x 6 inch figure well under 150 KB
DPI = 100

#: colour of each bound (what limits a module), shared by every figure
BOUND_COLOURS = {
    "compute": "#d62728",
    "memory": "#1f77b4",
    "comm": "#2ca02c",
    "overhead": "#7f7f7f",
}


class Drawing(NamedTuple):
    """A figure and a record of what was drawn on it (numbers in the units shown on its axes)."""

    figure: Any  # matplotlib.figure.Figure
    data: dict[str, Any]


class PlottingUnavailable(InferSimError):
    """matplotlib is not installed."""


def matplotlib_available() -> bool:
    """Whether matplotlib imports (asked only when a picture is wanted, so its import cost is paid anyway)."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True


def require_matplotlib(what: str = "plotting") -> None:
    """Fail with one line naming the install command when matplotlib is missing."""
    if not matplotlib_available():
        raise PlottingUnavailable(f"{what} needs matplotlib, which is not installed: {INSTALL_HINT}")


def pyplot(what: str = "plotting") -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    require_matplotlib(what)
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:  # installed but broken (e.g. a missing compiled dependency)
        raise PlottingUnavailable(f"{what} needs a working matplotlib ({exc}): {INSTALL_HINT}") from exc


def check_picture_path(path: str, option: str = "--out", need_matplotlib: bool = True,
                       inputs: Mapping[str, Any] | None = None) -> None:
    """Fail before any work when a picture cannot be written to `path` (format, directory, a
    directory or one of the command's `inputs` in its place, and unless `need_matplotlib` is false, a
    missing matplotlib: a command that prints a report first asks later, so the report is not lost)."""
    suffix = Path(path).suffix.lower()
    if suffix not in PICTURE_FORMATS:
        raise InferSimError(f"{option} {path}: unknown picture format '{suffix or '(none)'}'; "
                            "use a .png, .svg or .pdf file")
    check_output_path(path, option, inputs)
    if need_matplotlib:
        require_matplotlib(f"{option} {path}")


def save_figure(figure: Any, path: str) -> None:
    """Write a figure in the format its extension names and release its memory."""
    plt = pyplot()
    try:
        figure.savefig(path, dpi=DPI)
    finally:
        plt.close(figure)
