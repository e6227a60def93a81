"""TPC-H Q3 reference answer (DuckDB) and a reader for the join example's committed Parquet output.

Shared by tests/integration/test_q3_connect.py and bench/warm.py. Rows are dicts with Python values
(``Decimal`` revenue, ``date`` order date) in Q3's order: revenue desc, o_orderdate, l_orderkey (the
tie-break dags/apps/q3_*.py and bench/plain_q3.py use too), so equal lists mean exactly equal results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Q3_COLUMNS = ("l_orderkey", "revenue", "o_orderdate", "o_shippriority")

Q3_SQL = """
SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
FROM read_parquet(?) AS customer, read_parquet(?) AS orders, read_parquet(?) AS lineitem
WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
  AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority
ORDER BY revenue DESC, o_orderdate, l_orderkey
LIMIT 10
"""


def _files(directory: Path) -> list[str]:
    files = sorted(str(p) for p in directory.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no Parquet files in {directory}")
    return files


def duckdb_q3(tpch_dir: str | Path) -> list[dict[str, Any]]:
    """TPC-H Q3 over ``tpch_dir``/{customer,orders,lineitem}/*.parquet, computed by DuckDB (exact decimals)."""
    import duckdb

    root = Path(tpch_dir)
    with duckdb.connect() as con:
        rows = con.execute(Q3_SQL, [_files(root / "customer"), _files(root / "orders"),
                                    _files(root / "lineitem")]).fetchall()
        names = [d[0] for d in con.description]
    return [dict(zip(names, row, strict=True)) for row in rows]


def sort_q3(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in Q3's total order (a Parquet directory does not keep row order across files)."""
    return sorted(rows, key=lambda r: (-r["revenue"], r["o_orderdate"], r["l_orderkey"]))


def read_q3_output(directory: str | Path) -> list[dict[str, Any]]:
    """The committed Q3 output under ``directory`` as rows in Q3's order, columns as in :data:`Q3_COLUMNS`."""
    import pyarrow.parquet as pq

    rows = pq.read_table(str(directory)).to_pylist()
    return sort_q3([{c: r[c] for c in Q3_COLUMNS} for r in rows])


def q3_difference(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str | None:
    """None if ``got`` equals ``want`` exactly (values compared as numbers/dates), else the first difference."""
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for column in Q3_COLUMNS:
            if g[column] != w[column]:
                return f"row {i} (l_orderkey {w['l_orderkey']}) {column}: {g[column]!r} != {w[column]!r}"
    return None
