"""Record a committed stage's asset events through the api-server, once per task try (hooks/asset_events.py).

The trigger that committed the stage calls :func:`publish_asset_events`, then ends the task from the
triggerer. A triggerer can die between the POST and the task's end; its successor commits again (a
no-op) and calls this again. So before the first POST the intent is written to the stage's
``asset_events.json`` (the try's key and the time), and each recorded event after it. A successor that
finds the intent without the record looks the event up by the key in its extra before it posts: one
event per asset and task try, as a worker's outlet would record. A clear starts a new try, so a rerun
records a new event, as a worker would.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Protocol

from airflow_provider_speculative.core.asset_events import KEY_FIELD
from airflow_provider_speculative.core.events import Event
from airflow_provider_speculative.store import journal as journals
from airflow_provider_speculative.store.layout import StageLayout

# A clock difference between this host and the api-server's that the lookup of an earlier POST tolerates.
CLOCK_SLACK_SECONDS = 300.0


class AssetApi(Protocol):
    """What publishing needs of the REST API (hooks.asset_events.AssetEventsApi)."""

    def asset_id(self, uri: str) -> int:
        """The asset's id."""

    def find_event(self, asset_id: int, since: str, match: Any) -> dict[str, Any] | None:
        """An event of the asset since ``since`` whose extra ``match`` accepts."""

    def create_event(self, asset_id: int, extra: dict[str, Any], partition_key: str | None) -> dict[str, Any]:
        """Record one event."""


def publish_asset_events(api: AssetApi, layout: StageLayout, assets: list[dict[str, Any]], extra: dict[str, Any],
                         key: str, partition_key: str | None) -> dict[str, int]:
    """Record one event for each outlet asset (the sink's gets ``extra``); return {uri: event id}.

    ``assets``: ``[{"uri": ..., "sink": bool}]``. Raises hooks.asset_events.AssetApiError when the
    api-server refuses or does not answer; what was recorded before stays recorded.
    """
    path = layout.asset_events
    state = layout.read_json(path) or {}
    if state.get("key") != key:
        state = {"key": key, "intent_at": time.time(), "events": {}}
        layout.replace_json(path, state)
        resumed = False
    else:
        resumed = True
    since = datetime.fromtimestamp(float(state["intent_at"]) - CLOCK_SLACK_SECONDS, UTC).isoformat()
    recorded: dict[str, int] = {str(k): int(v) for k, v in (state.get("events") or {}).items()}
    for asset in assets:
        uri = str(asset["uri"])
        if uri in recorded:
            continue
        body = {**(extra if asset.get("sink") else {}), KEY_FIELD: key}
        asset_id = api.asset_id(uri)
        found = api.find_event(asset_id, since, lambda e: e.get(KEY_FIELD) == key) if resumed else None
        event = found or api.create_event(asset_id, body, partition_key)
        recorded[uri] = int(event.get("id", 0) or 0)
        layout.replace_json(path, {**state, "events": recorded})
        journals.record_stage(layout, Event.ASSET_EVENT_RECORDED, uri=uri, event_id=recorded[uri],
                              found_earlier=found is not None, by="triggerer")
    return recorded
