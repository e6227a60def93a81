"""The CLI's output in Airflow's own formats (``--output table|json|yaml|plain``, as ``airflow dags list``).

Rows go through Airflow's ``AirflowConsole``, so tables look like every other ``airflow`` command's; a
command's whole document (nested JSON) goes to ``json`` and ``yaml``. Strings from the store (node
names, causes, paths: anything a DAG author or an attempt wrote) are cleaned first: no terminal control
sequence reaches the terminal and no rich markup is interpreted.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

OUTPUTS = ("table", "json", "yaml", "plain")
# C0/C1 control characters (ESC starts terminal sequences), but not tab.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def clean(value: Any) -> str:
    """``value`` for a rich table cell: one line, control characters shown as ``\\xNN``, markup escaped."""
    from rich.markup import escape

    return escape(_plain(value))


def clean_text(text: str) -> str:
    """A multi-line text (an attempt's log) without terminal control sequences; newlines and tabs stay."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text)


def emit(output: str, *, rows: Sequence[dict[str, Any]], document: Any, header: Sequence[str] = (),
         footer: Sequence[str] = ()) -> None:
    """Print ``rows`` (table, plain) or ``document`` (json, yaml); ``header``/``footer`` lines frame a table."""
    if output == "json":
        print(json.dumps(document, indent=2, default=str))
        return
    if output == "yaml":
        import yaml

        # Through JSON first: datetimes and other objects become the same strings json shows.
        print(yaml.safe_dump(json.loads(json.dumps(document, default=str)), sort_keys=False), end="")
        return
    from airflow.cli.simple_table import AirflowConsole

    if output == "table":
        for line in header:
            print(_plain(line))
    sys.stdout.flush()
    console = AirflowConsole()
    if rows or output == "table":
        console.print_as(data=[{k: clean(v) if output == "table" else _plain(v) for k, v in row.items()}
                               for row in rows], output=output)
    if output == "table":
        for line in footer:
            print(_plain(line))


def _plain(value: Any) -> str:
    """``value`` as one line without control characters (plain output is not rendered by rich)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
