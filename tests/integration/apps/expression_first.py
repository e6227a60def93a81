"""Stage application that builds a column expression before its first read (as many PySpark scripts do)."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    doubled = (F.col("id") * 2).alias("doubled")
    ctx.write(ctx.read("rows").select("id", doubled))
