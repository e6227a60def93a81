"""TPC-H Q9, stage scan_supplier: key and nation of this split's suppliers."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("supplier").select("s_suppkey", "s_nationkey"))
