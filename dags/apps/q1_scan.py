"""TPC-H Q1, stage 1: filter this subtask's lineitem split and pre-aggregate per (returnflag, linestatus)."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
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
