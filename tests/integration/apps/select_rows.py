"""Stage application: write input ``input`` (JSON argument), filtered by an optional SQL ``where``.

Argument: ``{"input": "rows", "where": "k IS NOT NULL"}`` (``where`` may be omitted).
"""

from __future__ import annotations

import json

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    args = json.loads(ctx.application_args[0])
    rows = ctx.read(args["input"])
    if args.get("where"):
        rows = rows.where(args["where"])
    ctx.write(rows)
