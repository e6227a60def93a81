"""Warm up a fresh Spark Connect server with a few rounds of one small query: ``python -m ...devtools.warmup sc://HOST:PORT/``.

The first queries of a fresh Spark driver pay class loading, JIT compilation and code generation
(measured here: a stage's first attempts took 10-20 s of Spark work for a 1 MB scan that takes 2 s on
a warm server). A long-lived pool should pay that once, when it starts, not in the first pipeline's
attempts. The query touches what stage applications do: Parquet written partitioned and read back, a
join, an aggregation over decimals and dates, a sort with a limit. Its files live in a temporary
directory of this host (the local pool's servers share it) and are removed.

With ``--store s3://bucket/prefix`` (a pool that serves the store on S3) further rounds write an exchange as
attempts do (sorted by subpartition, through the provider's commit protocol when the server has its jar) and
read it back through s3a: a server's first S3 work pays the s3a file system's set-up and the AWS SDK's class
loading and JIT, which a pipeline's first run on the pool would pay otherwise. Those rounds work below a
prefix of their own, claimed in the store (``_warm-up/<uuid>``), and delete only it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import uuid
from typing import Any

from airflow_provider_speculative.store.layout import WARM_UP_DIR

# Rounds of the query. The first pays class loading (~10 s here); the JIT keeps improving over the
# next ones (measured: 3.5, 2.8, 2.6 s), and a pipeline's first run on a server warmed by one round
# was 5-6 s slower than its later runs (Q3, bench/warm.py --repeat 3).
ROUNDS = 4
# Rounds on the store, after the local ones: the first pays s3a's and the SDK's set-up, the second their JIT.
STORE_ROUNDS = 2


def warm_up(url: str, rounds: int = ROUNDS, store: str | None = None, store_rounds: int = STORE_ROUNDS) -> int:
    """Run the warm-up query ``rounds`` times on the server at ``url`` in a session of its own, then release it.

    With ``store`` (an ``s3://`` store root), ``store_rounds`` more rounds write and read there. Returns the
    number of objects those rounds wrote and then deleted (0 without a store).
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="speculative-warm-up-") as tmp:
                _query(spark, F, tmp, packed=False)
        if store is not None and store_rounds > 0:
            return _store_rounds(spark, F, store, store_rounds)
        return 0
    finally:
        spark.stop()


def _store_rounds(spark: Any, F: Any, root: str, rounds: int) -> int:
    """``rounds`` rounds below a claimed prefix of the store at ``root``, deleted afterwards, whatever happened.

    Returns the number of objects deleted (the rounds' files and the prefix's ownership marker).
    """
    from airflow_provider_speculative.runtime.session import direct_commit
    from airflow_provider_speculative.store.roots import open_store

    store = open_store(root)
    prefix = f"{WARM_UP_DIR}/{uuid.uuid4().hex}"
    store.claim(prefix)
    try:
        with direct_commit(spark.conf):
            for i in range(rounds):
                _query(spark, F, store.spark_url(f"{prefix}/r{i}"), packed=True)
    finally:
        deleted = store.delete_prefix(prefix)
    return deleted


def _query(spark: Any, F: Any, base: str, packed: bool) -> None:
    """One round below ``base``: what stage applications do, on 20,000 generated rows.

    ``packed`` writes as an exchange is written by default (one file per task, sorted by subpartition); else
    one directory per subpartition, which also leaves more than 32 files to read.
    """
    from airflow_provider_speculative.runtime.context import EXCHANGE_WRITE_OPTIONS, PACKED_WRITE_OPTIONS
    from airflow_provider_speculative.store.manifest import SUBPARTITION_COLUMN

    day = F.date_add(F.lit("1995-01-01").cast("date"), (F.col("id") % 365).cast("int"))
    # The subpartition expression of ctx.write (runtime/context.py).
    sp = F.pmod(F.xxhash64(F.col("id")), F.lit(48))
    rows = spark.range(20000).select(sp.alias(SUBPARTITION_COLUMN), F.col("id").alias("k"),
                                     (F.col("id") * 1.25).cast("decimal(15,2)").alias("v"), day.alias("d"))
    if packed:
        rows.sortWithinPartitions(SUBPARTITION_COLUMN).write \
            .options(**EXCHANGE_WRITE_OPTIONS, **PACKED_WRITE_OPTIONS).parquet(base + "/a")
    else:
        rows.repartition(SUBPARTITION_COLUMN).write.partitionBy(SUBPARTITION_COLUMN).parquet(base + "/a")
    back = spark.read.parquet(base + "/a")
    joined = back.join(back.select("k", F.col("v").alias("w")), "k").where(
        F.col("d") < F.lit("1995-06-01").cast("date"))
    sums = joined.groupBy(SUBPARTITION_COLUMN, "d").agg(
        F.sum(F.col("v") * (F.lit(1) - F.col("w") / 100)).alias("s"), F.count(F.lit(1)).alias("n"))
    sums.orderBy(F.col("s").desc(), "d").limit(10).write.parquet(base + "/b")
    spark.read.parquet(base + "/b").collect()


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m ...devtools.warmup sc://HOST:PORT/ [--rounds N] [--store s3://bucket/prefix]``."""
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_speculative.devtools.warmup")
    parser.add_argument("url", help="the Connect server, sc://HOST:PORT/")
    parser.add_argument("--store", default=None, help="an s3:// store root to warm s3a on (rounds below a "
                        f"prefix of their own, {WARM_UP_DIR}/<uuid>, deleted afterwards)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of the local query (default {ROUNDS})")
    args = parser.parse_args(argv)
    if args.rounds < 0:
        parser.error(f"--rounds {args.rounds}: expected 0 or more")
    # The last line of output, for whoever started the warm-up (devtools/localcluster.py).
    print(json.dumps({"store_objects": warm_up(args.url, rounds=args.rounds, store=args.store)}))


if __name__ == "__main__":
    main()
