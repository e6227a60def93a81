"""TPC-H Q9, stage join_supplier: profit per (nation, year) of this subtask's suppliers (partial sums).

nation is broadcast: every subtask reads all of it.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    profit, suppliers, nation = ctx.read("profit"), ctx.read("supplier"), ctx.read("nation")
    joined = (profit.join(suppliers, profit["l_suppkey"] == suppliers["s_suppkey"])
              .join(nation, suppliers["s_nationkey"] == nation["n_nationkey"]))
    ctx.write(joined.groupBy(F.col("n_name").alias("nation"), "o_year").agg(F.sum("amount").alias("sum_profit")))
