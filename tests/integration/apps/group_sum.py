"""Stage application: per group of input ``input``, the sum of ``measure`` (as ``s``) and the row count (``n``).

Argument: ``{"input": "rows", "group": ["g"], "measure": "m"}``.
"""

from __future__ import annotations

import json

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    args = json.loads(ctx.application_args[0])
    rows = ctx.read(args["input"])
    ctx.write(rows.groupBy(*args["group"]).agg(F.sum(args["measure"]).alias("s"), F.count(F.lit(1)).alias("n")))
