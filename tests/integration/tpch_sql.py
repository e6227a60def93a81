"""The official TPC-H queries the join examples compute (Q9, Q10, Q18), and DuckDB's answer to them.

Shared by the tests that compare the examples with DuckDB (test_tpch_joins.py) and by the benchmark
that runs each query as one plain Spark application (bench/warm.py, bench/plain_sql.py).
"""

from __future__ import annotations

import decimal
from pathlib import Path
from typing import Any

TABLES = ("region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem")

Q10_SQL = """
SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, c_address,
       c_phone, c_comment
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01'
  AND o_orderdate < DATE '1993-10-01' + INTERVAL 3 MONTH AND l_returnflag = 'R' AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
ORDER BY revenue DESC, c_custkey
LIMIT 20
"""

Q18_SQL = """
SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS quantity
FROM customer, orders, lineitem
WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)
  AND c_custkey = o_custkey AND o_orderkey = l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
ORDER BY o_totalprice DESC, o_orderdate, o_orderkey
LIMIT 100
"""

Q9_SQL = """
SELECT nation, o_year, sum(amount) AS sum_profit
FROM (SELECT n_name AS nation, extract(year FROM o_orderdate) AS o_year,
             l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
      FROM part, supplier, lineitem, partsupp, orders, nation
      WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey AND p_partkey = l_partkey
        AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey AND p_name LIKE '%green%') AS profit
GROUP BY nation, o_year
ORDER BY nation, o_year DESC
"""

QUERIES = {"q9": Q9_SQL, "q10": Q10_SQL, "q18": Q18_SQL}


def duckdb_rows(sql: str, tpch: Path) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows in the query's order) of ``sql`` over ``tpch``/<table>/*.parquet, by DuckDB."""
    import duckdb

    with duckdb.connect() as con:
        for table in (t for t in TABLES if (tpch / t).is_dir()):  # `make data-tpch` writes no region
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{tpch / table}/*.parquet')")
        rows = con.execute(sql).fetchall()
        return [d[0] for d in con.description], rows


def rows_difference(got_columns: list[str], got: list[tuple[Any, ...]], want_columns: list[str],
                    want: list[tuple[Any, ...]]) -> str | None:
    """None when both results have the same columns and the same rows (as a multiset), else the first difference.

    A Parquet directory does not keep row order across files, so rows are compared in a canonical order;
    numbers compare by value (a Spark ``decimal(38,2)`` equals DuckDB's ``decimal(38,2)`` or an ``int`` year).
    """
    if got_columns != want_columns:
        return f"columns {got_columns}, expected {want_columns}"
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"

    def canonical(row: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(str(decimal.Decimal(v).normalize()) if isinstance(v, int | decimal.Decimal) else str(v)
                     for v in row)

    for g, w in zip(sorted(got, key=canonical), sorted(want, key=canonical), strict=True):
        if canonical(g) != canonical(w):
            return f"row {g!r} != {w!r}"
    return None
