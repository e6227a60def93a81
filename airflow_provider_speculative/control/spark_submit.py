"""Parse-time I/O of SpeculativeSparkSubmitOperator: does a split stage's application use StageContext?"""

from __future__ import annotations

from pathlib import Path

# Larger scripts are not read when the DAG is parsed; the attempt's missing manifest still fails them.
MAX_SCRIPT_BYTES = 1 << 20


def stage_context_problem(application: str) -> str | None:
    """Why a local script cannot be a split stage's application (it never mentions StageContext), or None.

    Only a local, untemplated, readable file is judged; anything else is left to the attempt, which fails
    without a manifest. The check is a guard against running an unmodified script as speculative copies
    (each would write its own output), not a proof that the script writes through ``ctx.write``.
    """
    if "{{" in application or "://" in application:
        return None
    path = Path(application)
    try:
        if not path.is_file() or path.stat().st_size > MAX_SCRIPT_BYTES:
            return None
        text = path.read_text(errors="replace")
    except OSError:
        return None
    if "StageContext" in text:
        return None
    return (f"{application!r} does not use StageContext; an application split by file across speculative "
            "subtasks reads ctx.read(...) and writes ctx.write(df) (an unmodified script would write its whole "
            "output once per copy): use StageContext, or drop inputs and sink to run it unmodified")
