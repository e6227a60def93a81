"""How an exchange producer writes its output, variant by variant, on one warm Spark Connect server.

One TPC-H Q3 ``scan_lineitem`` attempt's query (one lineitem part: filter on l_shipdate, l_orderkey and
revenue) is written, in one session on a 1-core Connect server started for the run, as:

    plain         ``df.write.parquet``: what a plain Spark job pays to write the same rows once
    old_str       the exchange write with a shuffle first: ``withColumn(_sp).repartition(_sp)``, then
                  ``partitionBy(_sp)``; keys hashed as ``xxhash64(cast(k as string))``
    new_str       the exchange write without the shuffle (runtime/context.py): ``partitionBy(_sp)`` sorts
                  each task's rows by subpartition; keys hashed as strings
    new_long      as new_str, hashing the key as a bigint (needs the key's type at write time)
    new_lz4, new_zstd, new_none   as new_str with another Parquet codec (snappy is the default)
    schema        ``df.schema`` alone: the round trip that hashing by native type would add per attempt
    new_conc      as new_str with ``spark.sql.maxConcurrentOutputFileWriters`` set to the subpartition count:
                  one open writer per subpartition instead of sorting the task's rows first
    new_conc_unplanned  as new_conc with ``spark.sql.optimizer.plannedWrite.enabled=false`` (a planned
                  write adds the sort to the query before the writer could skip it)
    new_nodict, new_nodict_lz4  as new_str without Parquet dictionary encoding (snappy; lz4)
    scan_noop     the query alone, its rows dropped (``format("noop")``): the work before any write
    shuffle_noop  the query through a Spark shuffle on the key (what a plain job's join pays to move the
                  rows), then dropped
    readback      reading new_str's output back whole, rows dropped: a consumer's share of the exchange
    raw_nodict, raw_scan_noop, raw_shuffle_noop   as new_nodict, scan_noop and shuffle_noop with the
                  columns revenue is made of (l_extendedprice, l_discount) instead of revenue itself
    raw_nodict_long   as raw_nodict, hashing the key as a bigint

Every variant reports the server's CPU seconds too (user + system of its JVM, from /proc), since on a
shared machine CPU time is steadier than wall time.

Every variant runs once to warm up, then ``--repeat`` times, interleaved; prints median and min seconds
and the bytes written.

    .venv/bin/python bench/exchange_write.py [--data .data/tpch-sf1/lineitem] [--repeat 5] [--variants a,b]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_provider_speculative.devtools.localcluster import LocalCluster  # noqa: E402
from airflow_provider_speculative.runtime.session import SESSION_DEFAULTS  # noqa: E402

SUBPARTITIONS = 8


def variants(spark: Any, files: list[str], out_dir: str) -> dict[str, Callable[[str], Any]]:
    from pyspark.sql import functions as F

    def src() -> Any:
        rows = spark.read.parquet(*files).where(F.col("l_shipdate") > F.lit("1995-03-15").cast("date"))
        return rows.select("l_orderkey", (F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))).alias("revenue"))

    def src_raw() -> Any:
        # The columns revenue is made of, not revenue itself: decimal(15,2) x decimal(16,2) is a
        # decimal(32,4), arithmetic on java.math.BigDecimal and 14-byte binary values in Parquet.
        rows = spark.read.parquet(*files).where(F.col("l_shipdate") > F.lit("1995-03-15").cast("date"))
        return rows.select("l_orderkey", "l_extendedprice", "l_discount")

    def sp(kind: str) -> Any:
        return F.pmod(F.xxhash64(F.col("l_orderkey").cast(kind)), F.lit(SUBPARTITIONS))

    def exchange(out: str, kind: str = "string", shuffle: bool = False, codec: str | None = None,
                 raw: bool = False) -> None:
        df = (src_raw() if raw else src()).withColumn("_sp", sp(kind))
        if shuffle:
            df = df.repartition("_sp")
        writer = df.write.partitionBy("_sp")
        if codec:
            writer = writer.option("compression", codec)
        writer.parquet(out)

    def with_conf(conf: dict[str, str], out: str, **kwargs: Any) -> None:
        for key, value in conf.items():
            spark.conf.set(key, value)
        try:
            exchange(out, **kwargs)
        finally:
            for key in conf:
                spark.conf.unset(key)

    def concurrent(out: str, planned: bool = True) -> None:
        conf = {"spark.sql.maxConcurrentOutputFileWriters": str(SUBPARTITIONS)}
        if not planned:
            conf["spark.sql.optimizer.plannedWrite.enabled"] = "false"
        with_conf(conf, out)

    readback_from: list[str] = []

    def readback() -> None:
        if not readback_from:
            readback_from.append(out_dir + "/readback-source")
            exchange(readback_from[0])
        spark.read.parquet(readback_from[0]).write.format("noop").mode("overwrite").save()

    return {
        "plain": lambda out: src().write.parquet(out),
        "old_str": lambda out: exchange(out, shuffle=True),
        "new_str": lambda out: exchange(out),
        "new_long": lambda out: exchange(out, kind="long"),
        "new_lz4": lambda out: exchange(out, codec="lz4"),
        "new_zstd": lambda out: exchange(out, codec="zstd"),
        "new_none": lambda out: exchange(out, codec="none"),
        "schema": lambda out: src().schema,
        "new_conc": lambda out: concurrent(out),
        "new_conc_unplanned": lambda out: concurrent(out, planned=False),
        "new_nodict": lambda out: with_conf({"parquet.enable.dictionary": "false"}, out),
        "new_nodict_lz4": lambda out: with_conf({"parquet.enable.dictionary": "false"}, out, codec="lz4"),
        "raw_nodict": lambda out: with_conf({"parquet.enable.dictionary": "false"}, out, raw=True),
        "raw_nodict_long": lambda out: with_conf({"parquet.enable.dictionary": "false"}, out, raw=True, kind="long"),
        "raw_scan_noop": lambda out: src_raw().write.format("noop").mode("overwrite").save(),
        "raw_shuffle_noop": lambda out: src_raw().repartition(SUBPARTITIONS, "l_orderkey").write.format("noop")
        .mode("overwrite").save(),
        "scan_noop": lambda out: src().write.format("noop").mode("overwrite").save(),
        "shuffle_noop": lambda out: src().repartition(SUBPARTITIONS, "l_orderkey").write.format("noop")
        .mode("overwrite").save(),
        "readback": lambda out: readback(),
    }


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch-sf1" / "lineitem")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--variants", default="plain,old_str,new_str,new_long,new_lz4,new_zstd,new_none,schema,"
                        "new_conc,scan_noop,shuffle_noop,readback")
    parser.add_argument("--base-port", type=int, default=15460)
    args = parser.parse_args()
    files = sorted(str(p) for p in args.data.glob("*.parquet"))[:1]
    if not files:
        raise SystemExit(f"no Parquet files under {args.data}: make data-q3 DATA_DIR=.data/tpch-sf1 SCALE=1")
    work = Path(tempfile.mkdtemp(prefix="exchange-write-"))
    cluster = LocalCluster(work / "cluster")
    started, running = cluster.start(servers=1, base_port=args.base_port, ui_base_port=args.base_port - 11000,
                                     cores=1)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote((started or running)[0].url + "/").getOrCreate()
    try:
        for key, value in SESSION_DEFAULTS.items():
            spark.conf.set(key, value)
        wanted = args.variants.split(",")
        chosen = {name: fn for name, fn in variants(spark, files, str(work)).items() if name in wanted}
        seconds: dict[str, list[float]] = {name: [] for name in chosen}
        cpu: dict[str, list[float]] = {name: [] for name in chosen}
        server_pid = (started or running)[0].pid
        for name, fn in chosen.items():
            fn(str(work / f"warm-{name}"))
        for _ in range(args.repeat):
            for name, fn in chosen.items():
                out = work / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                cpu_before, start = process_cpu(server_pid), time.perf_counter()
                fn(str(out))
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(process_cpu(server_pid) - cpu_before)
        print(f"one lineitem part ({files[0]}), 1-core Connect server, median of {args.repeat}")
        for name, values in seconds.items():
            print(f"{name:10s} median {statistics.median(values):6.3f} s  min {min(values):6.3f} s  "
                  f"CPU median {statistics.median(cpu[name]):6.3f} s  bytes {_bytes(work / f'out-{name}')}")
    finally:
        spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
