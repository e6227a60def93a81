"""Hybrid all_to_all test application: count and sum the input piece by piece as producers are admitted."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    parts = [df.agg(F.count(F.lit(1)).alias("n"), F.sum("k").alias("s")) for df in ctx.read_incremental("rows")]
    merged = reduce(DataFrame.unionByName, parts).agg(F.sum("n").alias("n"), F.sum("s").alias("s"))
    ctx.write(merged.withColumn("pieces", F.lit(len(parts))))
