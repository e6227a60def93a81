"""Stage application: join two named inputs on key columns matched position by position.

Argument: ``{"left": "fact", "right": "dim", "left_on": ["f_k"], "right_on": ["d_k"], "how": "inner",
"keep": ["d_g"]}``. Writes the left input's columns and the right input's ``keep`` columns.
"""

from __future__ import annotations

import json
from functools import reduce

from airflow_provider_speculative.runtime import StageContext

with StageContext.from_argv() as ctx:
    args = json.loads(ctx.application_args[0])
    left, right = ctx.read(args["left"]), ctx.read(args["right"])
    right = right.select(*args["right_on"], *args["keep"])
    condition = reduce(lambda a, b: a & b, [left[lk] == right[rk]
                                            for lk, rk in zip(args["left_on"], args["right_on"], strict=True)])
    joined = left.join(right, condition, args.get("how", "inner"))
    ctx.write(joined.select(*[left[c] for c in left.columns], *[right[c] for c in args["keep"]]))
