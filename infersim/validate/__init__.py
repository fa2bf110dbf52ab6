"""Validation against public measurements: `python -m infersim validate`.

The points to compare come from a reference file in the format of
`../shared/reference/validation.yaml` (measured values with their source). How each point becomes
a simulator run is data, not code: `points.yaml` in this package names, for every point id, the
kind of comparison, the run (a kernel shape on a hardware card, an inline run config, or a run
config plus request-level serving options), how the result turns into the point's number, and
why each modelling choice was made. `mapping` reads and checks that file, `evaluate` runs the
points and computes the statistics, `report` prints them, `cli` registers the subcommand.
"""

from __future__ import annotations

from pathlib import Path

POINTS_FILE = Path(__file__).resolve().parent / "points.yaml"
