"""Q1's scan (dags/apps/q1_scan.py), except on the target named by ``SPECULATIVE_TEST_HELD_TARGET``.

There an attempt first records ``held.<subtask>.<attempt>`` in its stage's directory of the store, then
runs a query whose UDF sleeps for ten minutes on the server: it stays in the middle of a Spark job until
the test kills that server, whatever the machine's load. Every other attempt is Q1's scan.
"""

from __future__ import annotations

import os
import time

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    if ctx.target == os.environ.get("SPECULATIVE_TEST_HELD_TARGET"):
        layout = ctx.layout
        layout.store.replace(layout.name(layout.dir / f"held.{ctx.subtask}.{ctx.attempt}"), b"held")

        @F.udf("long")
        def sleepy(value: int) -> int:
            time.sleep(600)
            return value

        ctx.spark.range(1).select(sleepy("id")).collect()
    lineitem = ctx.read("lineitem")
    disc_price = F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))
    partial = (
        lineitem.where(F.col("l_shipdate") <= F.date_sub(F.lit("1998-12-01").cast("date"), 90))
        .groupBy("l_returnflag", "l_linestatus")
        .agg(
            F.sum("l_quantity").alias("sum_qty"),
            F.sum("l_extendedprice").alias("sum_base_price"),
            F.sum(disc_price).alias("sum_disc_price"),
            F.sum(disc_price * (F.lit(1) + F.col("l_tax"))).alias("sum_charge"),
            F.sum("l_discount").alias("sum_disc"),
            F.count(F.lit(1)).alias("count_order"),
        )
    )
    ctx.write(partial)
