"""Stage application for skew tests: partial sum and count of ``v`` per key ``k`` over this subtask's input.

A skewed key split across subtasks by producer range yields several partial rows for that key; the
next stage (merge_sum.py) adds them up, which is what makes the split safe (``splittable_skew``).
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    rows = ctx.read("rows")
    # bench/skew.py passes a number of SHA-256 rounds per row: CPU work proportional to the rows read,
    # so a consumer's time follows its input rather than Spark's start-up. 0 (the test): none.
    rounds = int(ctx.application_args[0]) if ctx.application_args else 0
    digest = F.col("v").cast("string")
    for _ in range(rounds):
        digest = F.sha2(digest, 256)
    aggregates = [F.sum("v").alias("sum_v"), F.count(F.lit(1)).alias("cnt")]
    if rounds:
        aggregates.append(F.max(digest).alias("work"))
    ctx.write(rows.groupBy("k").agg(*aggregates))
