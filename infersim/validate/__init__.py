"""Validation against public measurements: `python -m infersim validate`.

The points to compare come from reference files in the format of `public/validation.yaml`
(measured values with their source): by default the public measurements shipped in `public/`
(copied from the project's reference set, see public/README.md), or any files `--reference` names. How each point becomes
a simulator run is data, not code: `points.yaml` in this package names, for every point id, the
kind of comparison, the run (a kernel shape on a hardware card, an inline run config, or a run
config plus request-level serving options), how the result turns into the point's number, and
why each modelling choice was made. `mapping` reads and checks that file, `evaluate` runs the
points and computes the statistics, `report` prints them, `cli` registers the subcommand.
"""

from __future__ import annotations

from pathlib import Path

POINTS_FILE = Path(__file__).resolve().parent / "points.yaml"

#: the public measurements shipped with the package (public/README.md says what and from where)
PUBLIC_DIR = Path(__file__).resolve().parent / "public"
#: the reference files `infersim validate` compares with by default
DEFAULT_REFERENCES = (PUBLIC_DIR / "validation.yaml", PUBLIC_DIR / "energy.yaml")


def public_file(name: str) -> Path:
    """A file of the shipped public measurements: validation.yaml, energy.yaml, published.yaml."""
    return PUBLIC_DIR / name
