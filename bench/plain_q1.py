"""TPC-H Q1 as ONE plain PySpark application (the reference of bench/warm.py): read lineitem, write the result.

Computes exactly what the example pipeline commits (the same two aggregations, averages as decimal sum /
count like q1_final.py),
so the outputs can be compared row for row.

    spark-submit --master 'local[2]' bench/plain_q1.py LINEITEM_DIR OUTPUT_DIR
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

lineitem_dir, output_dir = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.appName("plain-q1").getOrCreate()
spark.sparkContext.setLogLevel("WARN")
lineitem = spark.read.parquet(lineitem_dir)
disc_price = F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))
sums = (
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
# Summing the sums again gives the result the decimal types of the pipeline's two stages (scan, aggregate).
merged = sums.groupBy("l_returnflag", "l_linestatus").agg(
    *[F.sum(c).alias(c) for c in ("sum_qty", "sum_base_price", "sum_disc_price", "sum_charge", "sum_disc",
                                  "count_order")])
result = merged.select(
    "l_returnflag", "l_linestatus", "sum_qty", "sum_base_price", "sum_disc_price", "sum_charge",
    (F.col("sum_qty") / F.col("count_order")).alias("avg_qty"),
    (F.col("sum_base_price") / F.col("count_order")).alias("avg_price"),
    (F.col("sum_disc") / F.col("count_order")).alias("avg_disc"),
    "count_order",
).orderBy("l_returnflag", "l_linestatus")
result.coalesce(1).write.mode("overwrite").parquet(output_dir)
spark.stop()
