"""TPC-H Q3, stage join_orders: orders of BUILDING customers in this subtask's range of customer keys."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    customers = ctx.read("customer")
    orders = ctx.read("orders")
    joined = orders.join(customers, orders["o_custkey"] == customers["c_custkey"], "left_semi")
    ctx.write(joined.select("o_orderkey", "o_orderdate", "o_shippriority"))
