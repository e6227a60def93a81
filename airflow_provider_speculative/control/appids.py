"""The Spark application ids of a stage run's attempts, as XComs of the stage task under stable keys.

Every attempt that reaches a Spark session records its application id in its heartbeat (its own
driver's, or the Spark Connect server's). When the stage task completes, the operator (or the trigger
that ends the task in the triggerer) pushes:

- :data:`APP_IDS_KEY`: ``{"<subtask>": ["<app id>", ...]}``, every attempt that reached a session, in
  attempt order (subtasks without one are left out);
- :data:`ADMITTED_APP_IDS_KEY`: ``{"<subtask>": "<app id>"}``, the admitted attempt's.

XComs are JSON in Airflow's metadata database: each map costs about 40 bytes per entry, so a map
whose JSON exceeds :data:`XCOM_MAX_BYTES` is not pushed; a log line says so and where to find the ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from airflow_provider_speculative.store.layout import StageLayout

APP_IDS_KEY = "spark_app_ids"
ADMITTED_APP_IDS_KEY = "spark_admitted_app_ids"
# Per key: about 3,000 subtasks with one attempt each (Spark's own ids are 20-30 characters).
XCOM_MAX_BYTES = 128 * 1024
# The id is written by the attempt (untrusted): anything longer than any Spark id is not one.
MAX_APP_ID_CHARS = 256


def _app_id(layout: StageLayout, subtask: int, attempt: int) -> str | None:
    heartbeat = layout.read_json(layout.heartbeat(subtask, attempt))
    app_id = heartbeat.get("app_id") if isinstance(heartbeat, dict) else None
    return app_id if isinstance(app_id, str) and 0 < len(app_id) <= MAX_APP_ID_CHARS else None


def stage_app_ids(layout: StageLayout, parallelism: int) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each subtask's application ids (attempts with a session, in attempt order) and its admitted attempt's."""
    every: dict[str, list[str]] = {}
    admitted: dict[str, str] = {}
    for subtask in range(parallelism):
        marker = layout.read_json(layout.admitted(subtask))
        winner = marker.get("attempt") if isinstance(marker, dict) else None
        ids: list[str] = []
        for number in layout.attempt_numbers(subtask):
            app_id = _app_id(layout, subtask, number)
            if app_id is None:
                continue
            ids.append(app_id)
            if number == winner:
                admitted[str(subtask)] = app_id
        if ids:
            every[str(subtask)] = ids
    return every, admitted


def app_id_xcoms(layout: StageLayout, parallelism: int, log: Callable[..., Any]) -> dict[str, Any]:
    """The XComs of the stage's application ids by key; a map over :data:`XCOM_MAX_BYTES` is left out and logged."""
    every, admitted = stage_app_ids(layout, parallelism)
    xcoms: dict[str, Any] = {}
    for key, value in ((APP_IDS_KEY, every), (ADMITTED_APP_IDS_KEY, admitted)):
        size = len(json.dumps(value))
        if size > XCOM_MAX_BYTES:
            log("stage %s: XCom %r not pushed: its %d subtasks take %d bytes of JSON, over the %d-byte bound; "
                "`airflow speculative status --output json` lists every attempt's application id",
                layout.stage, key, len(value), size, XCOM_MAX_BYTES)
            continue
        xcoms[key] = value
    return xcoms
