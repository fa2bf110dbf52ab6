"""The hardware check's summaries as an indexed table set keeps them: each dtype's fastest rates in
steps (a few dozen numbers for tens of thousands of rows) answer what the rows answer, and the rows
kept in runs of one file come back as they were."""

from __future__ import annotations

import bisect

from hypothesis import given
from hypothesis import strategies as st

from infersim.tables.lookup import _fastest_rows
from infersim.tables.table_cache import _dumps, _grouped_rows, decode_rows

ROWS = st.lists(st.tuples(st.sampled_from(["bf16", "fp8"]), st.floats(0.0, 1e4), st.floats(0.0, 1e9),
                          st.sampled_from(["a.csv:2", "a.csv:3", "b/c.csv:10", "x:y.csv:0", "odd", "d.csv:007"])),
                max_size=60)


@given(ROWS, st.floats(0.0, 1.1e9))
def test_the_fastest_step_beyond_l2_is_the_fastest_row_beyond_it(rows: list, l2: float) -> None:
    steps = _fastest_rows(rows)
    for dtype in {row[0] for row in rows}:
        beyond = [moved / latency if latency > 0 else float("inf")
                  for kind, latency, moved, _ in rows if kind == dtype and moved > l2]
        moved, rates = steps[dtype]
        assert list(moved) == sorted(moved) and len(moved) == len(rates)
        first = bisect.bisect_right(moved, l2)
        assert (rates[first] if first < len(moved) else None) == (max(beyond) if beyond else None)


def test_the_steps_are_few_where_the_rows_are_many() -> None:
    # bytes per microsecond rising with the bytes moved, as a GEMM table's do: one step holds them all
    rising = [("bf16", 1.0, float(moved), "g.csv:1") for moved in range(1, 1001)]
    assert _fastest_rows(rising)["bf16"] == ((1000.0,), (1000.0,))
    # falling: every row is its own step
    falling = [("bf16", float(moved) ** 2, float(moved), "g.csv:1") for moved in range(1, 1001)]
    assert len(_fastest_rows(falling)["bf16"][0]) == 1000


@given(ROWS)
def test_rows_kept_in_runs_of_one_file_come_back_as_they_were(rows: list) -> None:
    assert decode_rows(_dumps(_grouped_rows(rows))) == tuple(rows)


def test_a_file_named_once_per_run() -> None:
    rows = [("bf16", 2.0, 8.0, f"/tables/gemm_bf16.csv.gz:{line}") for line in range(2, 5)]
    rows.append(("fp8", 1.0, 4.0, "/tables/gemm_fp8.csv.gz:2"))
    assert _grouped_rows(rows) == [["/tables/gemm_bf16.csv.gz:", [["bf16", 2.0, 8.0, 2], ["bf16", 2.0, 8.0, 3],
                                                                   ["bf16", 2.0, 8.0, 4]]],
                                   ["/tables/gemm_fp8.csv.gz:", [["fp8", 1.0, 4.0, 2]]]]
