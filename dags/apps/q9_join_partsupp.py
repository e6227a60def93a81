"""TPC-H Q9, stage join_partsupp: each line item's profit, joined on the two-column key (part, supplier).

Both inputs are partitioned on both columns, matched position by position: (l_partkey, l_suppkey)
with (ps_partkey, ps_suppkey).
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem, partsupp = ctx.read("lineitem"), ctx.read("partsupp")
    joined = lineitem.join(partsupp, (lineitem["l_partkey"] == partsupp["ps_partkey"])
                           & (lineitem["l_suppkey"] == partsupp["ps_suppkey"]))
    amount = F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount")) - F.col("ps_supplycost") * F.col("l_quantity")
    ctx.write(joined.select("l_orderkey", "l_suppkey", amount.alias("amount")))
