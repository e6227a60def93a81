"""TPC-H Q10, stage scan_customer: the columns Q10 reports of this split's customers."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("customer").select("c_custkey", "c_name", "c_acctbal", "c_address", "c_phone", "c_comment",
                                          "c_nationkey"))
