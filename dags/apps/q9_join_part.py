"""TPC-H Q9, stage join_part: line items of green parts, for this subtask's range of part keys."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    lineitem, parts = ctx.read("lineitem"), ctx.read("part")
    ctx.write(lineitem.join(parts, lineitem["l_partkey"] == parts["p_partkey"], "left_semi"))
