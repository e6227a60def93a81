"""TPC-H Q1 reference answer (DuckDB) and a reader/comparator for the pipeline's committed Parquet output.

Shared by the integration tests: ``from tests.integration.q1 import duckdb_q1, read_q1_output, assert_q1_equal``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

Q1_KEYS = ("l_returnflag", "l_linestatus")
Q1_COLUMNS = ("sum_qty", "sum_base_price", "sum_disc_price", "sum_charge",
              "avg_qty", "avg_price", "avg_disc", "count_order")

Q1_SQL = """
SELECT
    l_returnflag,
    l_linestatus,
    sum(l_quantity)                                       AS sum_qty,
    sum(l_extendedprice)                                  AS sum_base_price,
    sum(l_extendedprice * (1 - l_discount))               AS sum_disc_price,
    sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
    avg(l_quantity)                                       AS avg_qty,
    avg(l_extendedprice)                                  AS avg_price,
    avg(l_discount)                                       AS avg_disc,
    count(*)                                              AS count_order
FROM read_parquet(?)
WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL 90 DAY
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus
"""

# q1_final.py computes the averages as decimal / count: Spark rounds that to decimal(38, 6).
SPARK_DECIMAL_SCALES = {"avg_qty": 6, "avg_price": 6, "avg_disc": 6}

Q1Result = dict[tuple[str, str], dict[str, float]]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, Decimal | int | float) else float(str(value))


def duckdb_q1(lineitem_dir: str | Path) -> Q1Result:
    """TPC-H Q1 over every ``*.parquet`` file in ``lineitem_dir``, computed by DuckDB.

    Returns ``{(returnflag, linestatus): {column: float}}``; decimals are cast to float.
    """
    import duckdb

    files = sorted(str(p) for p in Path(lineitem_dir).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no lineitem Parquet files in {lineitem_dir}")
    with duckdb.connect() as con:
        rows = con.execute(Q1_SQL, [files]).fetchall()
        names = [d[0] for d in con.description]
    out: Q1Result = {}
    for row in rows:
        record = dict(zip(names, row, strict=True))
        out[(record["l_returnflag"], record["l_linestatus"])] = {c: _number(record[c]) for c in Q1_COLUMNS}
    return out


def read_q1_output(directory: str | Path) -> Q1Result:
    """Read the committed Q1 Parquet directory (part files only; ``_SUCCESS`` and dot files are skipped).

    Same shape as :func:`duckdb_q1`. Raises if a group appears twice (a duplicated or un-merged partition).
    """
    import pyarrow.parquet as pq

    parts = sorted(p for p in Path(directory).glob("*.parquet") if not p.name.startswith((".", "_")))
    if not parts:
        raise FileNotFoundError(f"no Parquet part files in {directory}")
    return q1_of_records([r for part in parts for r in pq.read_table(part).to_pylist()], str(directory))


def q1_of_records(records: list[dict[str, Any]], where: str) -> Q1Result:
    """Q1 rows (dicts of the output's columns) in :func:`duckdb_q1`'s shape; raises if a group appears twice."""
    out: Q1Result = {}
    for record in records:
        key = (record["l_returnflag"], record["l_linestatus"])
        if key in out:
            raise AssertionError(f"group {key} appears more than once in {where}")
        out[key] = {c: _number(record[c]) for c in Q1_COLUMNS}
    return out


def output_decimal_scales(directory: str | Path) -> dict[str, int]:
    """Scale of every decimal column of the output (Spark rounds decimal division to a fixed scale)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = next(p for p in sorted(Path(directory).glob("*.parquet")) if not p.name.startswith((".", "_")))
    return {f.name: f.type.scale for f in pq.read_schema(part) if pa.types.is_decimal(f.type)}


def compare_q1(actual: Q1Result, expected: Q1Result, rel_tol: float = 1e-9,
               scales: dict[str, int] | None = None) -> list[str]:
    """Differences between two Q1 results (empty when they agree).

    Numbers must agree within ``rel_tol``. A column stored as a decimal of scale ``s`` (``scales``) may
    additionally be off by its rounding, half a unit in the last place (``0.5 * 10**-s``): Spark computes
    the averages as ``decimal / count`` rounded to 6 decimal places, DuckDB as doubles. ``scales`` defaults
    to :data:`SPARK_DECIMAL_SCALES`; pass the output's own (:func:`output_decimal_scales`) to be exact.
    """
    scales = SPARK_DECIMAL_SCALES if scales is None else scales
    problems = []
    if set(actual) != set(expected):
        problems.append(f"groups differ: got {sorted(actual)}, expected {sorted(expected)}")
    for key in sorted(set(actual) & set(expected)):
        for column in Q1_COLUMNS:
            got, want = actual[key][column], expected[key][column]
            abs_tol = 0.5 * 10.0 ** -scales[column] if column in scales else 0.0
            if not math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
                problems.append(f"{key} {column}: got {got!r}, expected {want!r}")
    return problems


def assert_q1_equal(actual: Q1Result, expected: Q1Result, rel_tol: float = 1e-9,
                    scales: dict[str, int] | None = None) -> None:
    """Fail listing every difference found by :func:`compare_q1`."""
    problems = compare_q1(actual, expected, rel_tol=rel_tol, scales=scales)
    assert not problems, "Q1 result differs from DuckDB:\n  " + "\n  ".join(problems)
