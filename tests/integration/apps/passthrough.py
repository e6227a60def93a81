"""Stage application for sink tests: write this subtask's split of the source unchanged."""

from __future__ import annotations

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    ctx.write(ctx.read("rows"))
