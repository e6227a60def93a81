"""TPC-H Q9, stage scan_partsupp: supply cost per (part, supplier) of this split."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("partsupp").select("ps_partkey", "ps_suppkey", "ps_supplycost"))
