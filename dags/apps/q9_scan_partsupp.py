"""TPC-H Q9, stage scan_partsupp: supply cost per (part, supplier) of this split, green parts only.

Only line items of green parts reach the join, so partsupp rows of other parts never match: the green
keys (a ``broadcast`` input of scan_part) filter them before the exchange.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    partsupp, green = ctx.read("partsupp"), ctx.read("part")
    kept = partsupp.join(F.broadcast(green), partsupp["ps_partkey"] == green["p_partkey"], "left_semi")
    ctx.write(kept.select("ps_partkey", "ps_suppkey", "ps_supplycost"))
