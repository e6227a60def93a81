"""PostgresSink's attempt writer (COPY FROM STDIN) against what it replaced and what plain Spark would run.

The same DataFrame (columns of TPC-H lineitem, SF 0.1 by default) is written to a real Postgres (a
throw-away server on a free loopback port, devtools/services.py) three ways, side by side in one run,
each into a fresh table:

    a  row-by-row ``INSERT ... VALUES`` batches from the driver (psycopg2 ``execute_values``, 1000 rows per
       batch): the writer PostgresSink used until this change
    b  PostgresSink's own writer: Spark writes CSV files (JVM, in parallel), ``COPY ... FROM STDIN (FORMAT csv)``
       loads them
    c  plain Spark: ``df.write.jdbc`` with the PostgreSQL JDBC driver from the executors (2 partitions,
       batchsize 10000); what a user would write without the provider (no staging, no exactly-once).
       Needs ``/usr/share/java/postgresql.jar`` (Debian: ``apt-get install libpostgresql-jdbc-java``);
       skipped without it.

Each row's table is checked to hold exactly the DataFrame's row count and the same sum of a decimal
column. Prints seconds per row (median of ``--repeat``), rows per second and the ratios b/a and b/c.

    PYTHONPATH=. .venv/bin/python bench/postgres_sink.py [--rows 600000] [--repeat 3]

Results: bench/results/postgres-sink-<timestamp>/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2

REPO = Path(__file__).resolve().parents[1]
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
COLUMNS = ["l_orderkey", "l_partkey", "l_quantity", "l_extendedprice", "l_shipdate", "l_shipmode", "l_comment"]


def write_execute_values(df: Any, dsn: str, table: str) -> int:
    """Row a: the replaced writer, row batches through ``execute_values`` (kept here as the baseline)."""
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    from airflow_provider_speculative.sinks.postgres import pg_type

    columns = [(f.name, pg_type(f.dataType.simpleString())) for f in df.schema.fields]
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        defs = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns)
        cur.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), defs))
        insert = sql.SQL("INSERT INTO {} VALUES %s").format(sql.Identifier(table)).as_string(cur)
        records, rows = 0, []
        for row in df.toLocalIterator():
            rows.append(tuple(row))
            if len(rows) >= 1000:
                execute_values(cur, insert, rows)
                records, rows = records + len(rows), []
        if rows:
            execute_values(cur, insert, rows)
            records += len(rows)
    return records


def write_copy(df: Any, dsn: str, table: str) -> int:
    """Row b: PostgresSink's attempt writer, exactly as an attempt calls it (its spool in a temporary directory)."""
    from airflow_provider_speculative.sinks.postgres import _PostgresWriter

    with tempfile.TemporaryDirectory(prefix="bench-pg-copy-") as spool:
        info = _PostgresWriter(dsn, "public", table, Path(spool) / "copy").write(df)
    return int(info["records"])


def write_jdbc(df: Any, dsn: str, table: str) -> int:
    """Row c: plain Spark's JDBC writer from the executors."""
    parts = dict(part.split("=", 1) for part in dsn.split())
    (df.repartition(2).write.format("jdbc")
     .option("url", f"jdbc:postgresql://{parts['host']}:{parts['port']}/{parts['dbname']}").option("user", "postgres")
     .option("dbtable", table).option("driver", "org.postgresql.Driver").option("batchsize", 10000)
     .mode("overwrite").save())
    return int(df.count())


def check(dsn: str, table: str, rows: int, price_sum: Any) -> None:
    """The table holds the DataFrame: same row count and the same sum of l_extendedprice."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT count(*), sum(l_extendedprice) FROM "{table}"')
        count, total = cur.fetchone()
    if count != rows or total != price_sum:
        raise SystemExit(f"{table}: {count} rows, sum {total}; expected {rows} rows, sum {price_sum}")


def main() -> None:
    """Run the rows side by side and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch" / "lineitem")
    parser.add_argument("--rows", type=int, default=600_000, help="rows of lineitem to write (default 600000)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").appName("bench-postgres-sink")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g"))
    if JDBC_JAR.exists():
        builder = builder.config("spark.jars", str(JDBC_JAR))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # limit() leaves one partition; eight keep what toLocalIterator (row a) pulls at once to an eighth.
    df = spark.read.parquet(str(args.data)).select(*COLUMNS).limit(args.rows).repartition(8).cache()
    rows = df.count()
    price_sum = df.agg({"l_extendedprice": "sum"}).collect()[0][0]

    from airflow_provider_speculative.devtools.services import start_postgres

    database = f"bench_pg_sink_{uuid.uuid4().hex[:8]}"
    server = start_postgres()
    server.create_database(database)
    dsn = server.dsn(database)
    writers: dict[str, Callable[[Any, str, str], int]] = {"a": write_execute_values, "b": write_copy}
    if JDBC_JAR.exists():
        writers["c"] = write_jdbc
    else:
        print(f"row c skipped: {JDBC_JAR} is missing (apt-get install libpostgresql-jdbc-java)", file=sys.stderr)
    seconds: dict[str, list[float]] = {name: [] for name in writers}
    try:
        for repeat in range(args.repeat):
            for name, write in writers.items():
                table = f"t_{name}_{repeat}"
                start = time.perf_counter()
                written = write(df, dsn, table)
                seconds[name].append(time.perf_counter() - start)
                if written != rows:
                    raise SystemExit(f"row {name}: wrote {written} rows, expected {rows}")
                check(dsn, table, rows, price_sum)
                print(f"repeat {repeat + 1} row {name}: {seconds[name][-1]:.2f} s", flush=True)
    finally:
        server.stop()
        spark.stop()

    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"\n{rows} rows of lineitem ({', '.join(COLUMNS)}), median of {args.repeat}, load {os.getloadavg()[0]:.2f}")
    print("row  what                                   seconds   rows/s")
    labels = {"a": "INSERT ... VALUES batches (replaced)", "b": "PostgresSink COPY (this writer)",
              "c": "plain Spark df.write.jdbc"}
    for name, value in medians.items():
        print(f"{name}    {labels[name]:<38} {value:7.2f}  {rows / value:9.0f}")
    ratios = {"b/a": medians["b"] / medians["a"]}
    if "c" in medians:
        ratios["b/c"] = medians["b"] / medians["c"]
    print("  ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    out = args.results / f"postgres-sink-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": rows, "seconds": seconds, "medians": medians,
                                                  "ratios": ratios}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
