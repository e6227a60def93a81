"""TPC-H Q3 as ONE plain PySpark application (the reference of bench/warm.py): read three tables, write the top 10.

Computes exactly what the join example (dags/tpch_q3.py) commits: revenue per unshipped order of a
BUILDING customer, the 10 largest ordered by revenue desc, o_orderdate, l_orderkey (the tie-break the
pipeline uses too), so the outputs can be compared row for row.

    spark-submit --master 'local[2]' bench/plain_q3.py TPCH_DIR OUTPUT_DIR   # TPCH_DIR/{customer,orders,lineitem}
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

tpch_dir, output_dir = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.appName("plain-q3").getOrCreate()
spark.sparkContext.setLogLevel("WARN")
cut = F.lit("1995-03-15").cast("date")
customer = spark.read.parquet(tpch_dir + "/customer").where(F.col("c_mktsegment") == "BUILDING")
orders = spark.read.parquet(tpch_dir + "/orders").where(F.col("o_orderdate") < cut)
lineitem = spark.read.parquet(tpch_dir + "/lineitem").where(F.col("l_shipdate") > cut)
revenue = (
    lineitem.join(orders, lineitem["l_orderkey"] == orders["o_orderkey"])
    .join(customer, orders["o_custkey"] == customer["c_custkey"])
    .groupBy("l_orderkey", "o_orderdate", "o_shippriority")
    .agg(F.sum(F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))).alias("revenue"))
)
top = revenue.orderBy(F.col("revenue").desc(), "o_orderdate", "l_orderkey").limit(10)
top.select("l_orderkey", "revenue", "o_orderdate", "o_shippriority").coalesce(1).write.mode("overwrite").parquet(
    output_dir)
spark.stop()
