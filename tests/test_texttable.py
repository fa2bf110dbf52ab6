"""The report's table layout is tabulate's "simple" one, character for character."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tabulate import tabulate

from infersim.base.texttable import simple_table

cell = st.text(alphabet="ab -,.%01", max_size=14)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), columns=st.integers(1, 6), count=st.integers(0, 5))
def test_simple_table_matches_tabulate(data, columns, count):
    headers = data.draw(st.lists(st.text(alphabet="hk ()", min_size=1, max_size=12).filter(str.strip),
                                 min_size=columns, max_size=columns))
    rows = data.draw(st.lists(st.lists(cell, min_size=columns, max_size=columns), min_size=count, max_size=count))
    assert simple_table(rows, headers) == tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
