"""TPC-H Q3, stage scan_customer: the keys of this split's customers in market segment BUILDING."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("customer").where(F.col("c_mktsegment") == "BUILDING").select("c_custkey"))
