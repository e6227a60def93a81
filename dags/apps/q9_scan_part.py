"""TPC-H Q9, stage scan_part: keys of this split's parts whose name contains 'green'."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("part").where(F.col("p_name").contains("green")).select("p_partkey"))
