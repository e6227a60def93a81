"""Stage application: write input ``input`` projected by SQL expressions (``selectExpr``).

Argument: ``{"input": "rows", "select": ["collate(k, 'UTF8_LCASE') AS k", "v"]}``.
"""

from __future__ import annotations

import json

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    args = json.loads(ctx.application_args[0])
    ctx.write(ctx.read(args["input"]).selectExpr(*args["select"]))
