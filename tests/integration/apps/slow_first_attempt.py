"""Stage application for the Connect cancel test: attempt 0 writes through a UDF that sleeps for minutes.

Every other attempt waits until attempt 0's write job has started on the server (its output directory
exists), then writes at once: so when the copy wins, the cancelled attempt surely has a query running.
"""

from __future__ import annotations

import time

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    counts = ctx.read("lineitem").groupBy("l_returnflag", "l_linestatus").agg(F.count(F.lit(1)).alias("n"))
    if ctx.attempt == 0:
        @F.udf("long")
        def sleepy(value: int) -> int:
            time.sleep(600)
            return value

        counts = counts.withColumn("n", sleepy("n"))
    else:
        deadline = time.time() + 600
        while not ctx.layout.data(ctx.subtask, 0).exists():
            if time.time() > deadline:
                raise TimeoutError("attempt 0 never started writing")
            time.sleep(0.2)
    ctx.write(counts)
