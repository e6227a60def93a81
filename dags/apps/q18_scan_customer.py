"""TPC-H Q18, stage scan_customer: key and name of this split's customers."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("customer").select("c_custkey", "c_name"))
