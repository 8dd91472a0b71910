"""One job-id order for Python and SQL (issue 30 item 3): the collector stamps a shared GPU
with `lowest_job`, `sing warehouse import` and the reports order in SQL, and before this the
SQL put "10_10" before "10_2" while Python put it after."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from sing.jobids import job_order, job_order_sql, lowest_job

# Slurm's shapes (plain, array, heterogeneous), leading zeros, text, and a number too long for
# any integer type.
KNOWN = ["9", "10", "10_2", "10_10", "10+1", "9+1", "100", "x", "", "007", "7", "a1", "ab",
         "1234_7", "1234+1", "10_", "5.2", "1" * 45]  # fmt: skip


def sql_sorted(ids: list[str], descending: bool = False) -> list[str]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (job_id VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?)", [[i] for i in ids])
    order = job_order_sql(descending=descending)
    return [row[0] for row in con.execute(f"SELECT job_id FROM t ORDER BY {order}").fetchall()]


def test_array_and_heterogeneous_ids_sort_as_numbers() -> None:
    want = ["9", "9+1", "10", "10_2", "10_10", "100", "x"]
    assert sorted(want[::-1], key=job_order) == want
    assert sql_sorted(want[::-1]) == want
    assert lowest_job({"10_10", "10_2"}) == "10_2"


def test_sql_and_python_sort_the_known_ids_alike() -> None:
    want = sorted(KNOWN, key=job_order)
    assert sql_sorted(KNOWN) == want
    assert sql_sorted(KNOWN, descending=True) == want[::-1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="0123456789_+.ax", max_size=7), min_size=1, max_size=40))
def test_sql_and_python_sort_any_ids_alike(ids: list[str]) -> None:
    assert sql_sorted(ids) == sorted(ids, key=job_order)
