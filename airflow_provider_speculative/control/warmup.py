"""Warm up a fresh Spark Connect server with one small query: ``python -m ...control.warmup sc://HOST:PORT/``.

The first queries of a fresh Spark driver pay class loading, JIT compilation and code generation
(measured here: a stage's first attempts took 10-20 s of Spark work for a 1 MB scan that takes 2 s on
a warm server). A long-lived pool should pay that once, when it starts, not in the first pipeline's
attempts. The query touches what stage applications do: Parquet written partitioned and read back, a
join, an aggregation over decimals and dates, a sort with a limit. Its files live in a temporary
directory of this host (the local pool's servers share it) and are removed.
"""

from __future__ import annotations

import sys
import tempfile


def warm_up(url: str) -> None:
    """Run the warm-up query on the server at ``url`` in a session of its own, then release it."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        with tempfile.TemporaryDirectory(prefix="speculative-warm-up-") as tmp:
            day = F.date_add(F.lit("1995-01-01").cast("date"), (F.col("id") % 365).cast("int"))
            rows = spark.range(20000).select((F.col("id") % 16).alias("sp"), F.col("id").alias("k"),
                                             (F.col("id") * 1.25).cast("decimal(15,2)").alias("v"), day.alias("d"))
            rows.repartition("sp").write.partitionBy("sp").parquet(tmp + "/a")
            back = spark.read.parquet(tmp + "/a")
            joined = back.join(back.select("k", F.col("v").alias("w")), "k").where(
                F.col("d") < F.lit("1995-06-01").cast("date"))
            sums = joined.groupBy("sp", "d").agg(F.sum(F.col("v") * (F.lit(1) - F.col("w") / 100)).alias("s"),
                                                 F.count(F.lit(1)).alias("n"))
            sums.orderBy(F.col("s").desc(), "d").limit(10).write.parquet(tmp + "/b")
            spark.read.parquet(tmp + "/b").collect()
    finally:
        spark.stop()


if __name__ == "__main__":
    warm_up(sys.argv[1])
