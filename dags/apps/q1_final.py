"""TPC-H Q1, stage 2: merge the partial aggregates of this subtask's key range and compute the averages."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    partials = ctx.read("partials")
    merged = partials.groupBy("l_returnflag", "l_linestatus").agg(
        F.sum("sum_qty").alias("sum_qty"),
        F.sum("sum_base_price").alias("sum_base_price"),
        F.sum("sum_disc_price").alias("sum_disc_price"),
        F.sum("sum_charge").alias("sum_charge"),
        F.sum("sum_disc").alias("sum_disc"),
        F.sum("count_order").alias("count_order"),
    )
    result = merged.select(
        "l_returnflag", "l_linestatus", "sum_qty", "sum_base_price", "sum_disc_price", "sum_charge",
        (F.col("sum_qty") / F.col("count_order")).alias("avg_qty"),
        (F.col("sum_base_price") / F.col("count_order")).alias("avg_price"),
        (F.col("sum_disc") / F.col("count_order")).alias("avg_disc"),
        "count_order",
    ).orderBy("l_returnflag", "l_linestatus")
    ctx.write(result)
