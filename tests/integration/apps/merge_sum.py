"""Stage application for skew tests: merge partial sums and counts per key ``k``."""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    partials = ctx.read("partials")
    ctx.write(partials.groupBy("k").agg(F.sum("sum_v").alias("sum_v"), F.sum("cnt").alias("cnt")))
