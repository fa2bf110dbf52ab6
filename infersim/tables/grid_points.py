"""A table set's measured points per grid key before indexing (GridSource), for the tools that
rebuild grids from subsets of them (leave-one-out, extrapolation checks); a run looks
tables up through infersim.tables.lookup and never needs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infersim.tables.grid_keys import GridKey, work_limits
from infersim.tables.interpolation import DEFAULT_INTERPOLATION, Interpolation, KernelGrid, build_grid
from infersim.tables.lookup import grids_and_hbm_rows

if TYPE_CHECKING:
    from infersim.tables.format import Row, TableDirectory


@dataclass(frozen=True)
class GridPoint:
    """One measured point of a grid: coordinates on its axes, time and efficiency."""

    coords: tuple[float, ...]  # axis values
    seconds: float  # measured kernel time
    efficiency: float  # relative to the table's peak for the row's dtype
    row: Row


@dataclass(frozen=True)
class GridSource:
    """The measured points of one grid key before indexing, with their axes and peak."""

    axes: tuple[str, ...]
    tables: tuple[str, ...]  # CSV file names the points come from
    peak_flops: float
    points: tuple[GridPoint, ...]
    work_limits: tuple[float | None, ...] = ()  # see work_limits()


def grid_points(table_dir: TableDirectory) -> dict[GridKey, GridSource]:
    """Every grid's measured points, by grid key."""
    collected, _ = grids_and_hbm_rows(table_dir, keep_rows=True)
    return {key: GridSource(grid.axes, tuple(grid.tables), grid.peak_flops,
                            tuple(GridPoint(coords, seconds, eff, row)
                                  for (coords, seconds, eff), row in zip(grid.points, grid.rows)),
                            work_limits(key, grid.axes))
            for key, grid in collected.items()}


def grid_from_points(source: GridSource, points: Sequence[GridPoint] | None = None,
                     interpolation: Interpolation = DEFAULT_INTERPOLATION) -> KernelGrid:
    """The interpolating grid of `source` (or of a subset of its points, for leave-one-out)."""
    chosen = source.points if points is None else points
    return build_grid(source.axes, ((p.coords, p.seconds, p.efficiency) for p in chosen), source.peak_flops,
                      interpolation, source.work_limits)
