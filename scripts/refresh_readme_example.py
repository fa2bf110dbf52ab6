"""Rewrite the README's worked example with what `python -m infersim --config qwen3-30b.yaml` prints now.

Run after a deliberate modelling change; tests/test_core_cli.py pins the README to the real output.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.cli import main  # noqa: E402

COMMAND = "$ python -m infersim --config qwen3-30b.yaml\n"


def refresh() -> None:
    readme_path = REPO / "README.md"
    readme = readme_path.read_text()
    start = readme.index(COMMAND) + len(COMMAND)
    end = readme.index("```", start)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--config", "qwen3-30b.yaml"])
    readme_path.write_text(readme[:start] + out.getvalue().rstrip() + "\n" + readme[end:])


if __name__ == "__main__":
    refresh()
