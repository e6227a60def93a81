"""TPC-H Q9, stage scan_lineitem: the columns Q9 needs of this split's line items."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("lineitem").select("l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice",
                                          "l_discount"))
