"""Rewrite the README's generated parts: the worked example (what `python -m infersim --config
qwen3-30b.yaml` prints now) and the field tables of the run config and the three kinds of card
(from their schemas).

Run after a deliberate modelling or schema change; tests/test_core_cli.py pins the README to both.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.cards.engine import EngineCard  # noqa: E402
from infersim.cards.hardware import HardwareCard  # noqa: E402
from infersim.cards.model import ModelCard  # noqa: E402
from infersim.cards.schema import field_docs  # noqa: E402
from infersim.cli import main  # noqa: E402
from infersim.config import RunSpec  # noqa: E402

FIELD_TABLES = (("**Run config**", RunSpec), ("**Model card**", ModelCard), ("**Hardware card**", HardwareCard),
                ("**Engine card**", EngineCard))

COMMAND = "$ python -m infersim --config qwen3-30b.yaml\n"


def field_table(cls: type) -> str:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {kind} | {doc} |" for name, kind, doc in field_docs(cls)]
    return "\n".join(rows)


def with_field_tables(readme: str) -> str:
    """Each table follows its bold title and a blank line and ends at the next blank line."""
    for title, cls in FIELD_TABLES:
        start = readme.index(title + "\n\n") + len(title) + 2
        end = readme.index("\n\n", start)
        readme = readme[:start] + field_table(cls) + readme[end:]
    return readme


def refresh() -> None:
    readme_path = REPO / "README.md"
    readme = with_field_tables(readme_path.read_text())
    start = readme.index(COMMAND) + len(COMMAND)
    end = readme.index("```", start)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--config", "qwen3-30b.yaml"])
    readme_path.write_text(readme[:start] + out.getvalue().rstrip() + "\n" + readme[end:])


if __name__ == "__main__":
    refresh()
