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

Every variant runs once to warm up, then ``--repeat`` times, interleaved; prints median and min seconds
and the bytes written.

    .venv/bin/python bench/exchange_write.py [--data .data/tpch-sf1/lineitem] [--repeat 5] [--variants a,b]
"""

from __future__ import annotations

import argparse
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


def variants(spark: Any, files: list[str]) -> dict[str, Callable[[str], Any]]:
    from pyspark.sql import functions as F

    def src() -> Any:
        rows = spark.read.parquet(*files).where(F.col("l_shipdate") > F.lit("1995-03-15").cast("date"))
        return rows.select("l_orderkey", (F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))).alias("revenue"))

    def sp(kind: str) -> Any:
        return F.pmod(F.xxhash64(F.col("l_orderkey").cast(kind)), F.lit(SUBPARTITIONS))

    def exchange(out: str, kind: str = "string", shuffle: bool = False, codec: str | None = None) -> None:
        df = src().withColumn("_sp", sp(kind))
        if shuffle:
            df = df.repartition("_sp")
        writer = df.write.partitionBy("_sp")
        if codec:
            writer = writer.option("compression", codec)
        writer.parquet(out)

    return {
        "plain": lambda out: src().write.parquet(out),
        "old_str": lambda out: exchange(out, shuffle=True),
        "new_str": lambda out: exchange(out),
        "new_long": lambda out: exchange(out, kind="long"),
        "new_lz4": lambda out: exchange(out, codec="lz4"),
        "new_zstd": lambda out: exchange(out, codec="zstd"),
        "new_none": lambda out: exchange(out, codec="none"),
        "schema": lambda out: src().schema,
    }


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO / ".data" / "tpch-sf1" / "lineitem")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--variants", default="plain,old_str,new_str,new_long,new_lz4,new_zstd,new_none,schema")
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
        chosen = {name: fn for name, fn in variants(spark, files).items() if name in args.variants.split(",")}
        seconds: dict[str, list[float]] = {name: [] for name in chosen}
        for name, fn in chosen.items():
            fn(str(work / f"warm-{name}"))
        for _ in range(args.repeat):
            for name, fn in chosen.items():
                out = work / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                start = time.perf_counter()
                fn(str(out))
                seconds[name].append(time.perf_counter() - start)
        print(f"one lineitem part ({files[0]}), 1-core Connect server, median of {args.repeat}")
        for name, values in seconds.items():
            print(f"{name:10s} median {statistics.median(values):6.3f} s  min {min(values):6.3f} s  "
                  f"bytes {_bytes(work / f'out-{name}')}")
    finally:
        spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
