"""TPC-H Q18, stage scan_orders: the columns Q18 reports of this split's orders."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("orders").select("o_orderkey", "o_custkey", "o_orderdate", "o_totalprice"))
