"""TPC-H Q9, stage scan_lineitem: this split's line items of green parts, with the columns Q9 needs.

The green part keys arrive whole (a ``broadcast`` input of scan_part, about 5 % of the parts): joining
them here keeps the other 95 % of line items out of the exchange, as Spark's optimizer does inside one
application (docs/authoring.md, "Fast stages").
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem, green = ctx.read("lineitem"), ctx.read("part")
    kept = lineitem.join(F.broadcast(green), lineitem["l_partkey"] == green["p_partkey"], "left_semi")
    ctx.write(kept.select("l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice", "l_discount"))
