"""Stage application for skew tests: partial sum and count of ``v`` per key ``k`` over this subtask's input.

A skewed key split across subtasks by producer range yields several partial rows for that key; the
next stage (merge_sum.py) adds them up, which is what makes the split safe (``splittable_skew``).
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    rows = ctx.read("rows")
    ctx.write(rows.groupBy("k").agg(F.sum("v").alias("sum_v"), F.count(F.lit(1)).alias("cnt")))
