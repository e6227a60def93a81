"""Asset events recorded through the api-server: once per task try, also when a triggerer died mid-way."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_speculative.control.asset_events import publish_asset_events
from airflow_provider_speculative.core.asset_events import KEY_FIELD, commit_key
from airflow_provider_speculative.exceptions import ConfigError
from airflow_provider_speculative.hooks.asset_events import AssetApiConnection, AssetApiError
from airflow_provider_speculative.store.layout import StageLayout

SINK = "file:///out/q3"
OTHER = "file:///out/marker"


class RecordingApi:
    """The api-server's asset events as a list (the real one is exercised in test_e2e_scheduler)."""

    def __init__(self, fail_on_create: bool = False) -> None:
        self.events: list[dict[str, Any]] = []
        self.creates = 0
        self.lookups = 0
        self.fail_on_create = fail_on_create

    def asset_id(self, uri: str) -> int:
        return {SINK: 1, OTHER: 2}[uri]

    def find_event(self, asset_id: int, since: str, match: Any) -> dict[str, Any] | None:
        self.lookups += 1
        return next((e for e in self.events if e["asset_id"] == asset_id and match(e["extra"])), None)

    def create_event(self, asset_id: int, extra: dict[str, Any], partition_key: str | None) -> dict[str, Any]:
        self.creates += 1
        event = {"id": len(self.events) + 100, "asset_id": asset_id, "extra": extra, "partition_key": partition_key}
        self.events.append(event)
        if self.fail_on_create:
            raise AssetApiError("the answer was lost")  # the server recorded it; the caller does not know
        return event


@pytest.fixture
def layout(tmp_path: Path) -> StageLayout:
    layout = StageLayout(tmp_path, "tpch_q3", "manual__1", "top")
    layout.dir.mkdir(parents=True)
    return layout


ASSETS = [{"uri": SINK, "sink": True}, {"uri": OTHER, "sink": False}]


def test_one_event_per_asset_with_the_extra_on_the_sink_only(layout: StageLayout):
    api = RecordingApi()
    key = commit_key("tpch_q3", "manual__1", "top", 1)
    recorded = publish_asset_events(api, layout, ASSETS, {"records": 10}, key, "2026-01-01T00:00:00")
    assert recorded == {SINK: 100, OTHER: 101}
    assert [e["extra"] for e in api.events] == [{"records": 10, KEY_FIELD: key}, {KEY_FIELD: key}]
    assert {e["partition_key"] for e in api.events} == {"2026-01-01T00:00:00"}
    journal = [json.loads(line) for line in layout.journal.read_text().splitlines()]
    assert [(e["event"], e["uri"], e["found_earlier"]) for e in journal] == [
        ("asset_event_recorded", SINK, False), ("asset_event_recorded", OTHER, False)]


def test_a_second_call_for_the_same_try_records_nothing_new(layout: StageLayout):
    api = RecordingApi()
    key = commit_key("tpch_q3", "manual__1", "top", 1)
    first = publish_asset_events(api, layout, ASSETS, {}, key, None)
    assert publish_asset_events(api, layout, ASSETS, {}, key, None) == first
    assert api.creates == 2 and api.lookups == 0


def test_a_successor_finds_the_event_whose_answer_was_lost(layout: StageLayout):
    """The triggerer died after the api-server recorded the event: its successor must not record it again."""
    api = RecordingApi(fail_on_create=True)
    key = commit_key("tpch_q3", "manual__1", "top", 1)
    with pytest.raises(AssetApiError):
        publish_asset_events(api, layout, ASSETS[:1], {"records": 10}, key, None)
    api.fail_on_create = False
    assert publish_asset_events(api, layout, ASSETS[:1], {"records": 10}, key, None) == {SINK: 100}
    assert api.creates == 1 and len(api.events) == 1
    journal = [json.loads(line) for line in layout.journal.read_text().splitlines()]
    assert [e["found_earlier"] for e in journal] == [True]


def test_a_new_try_records_a_new_event(layout: StageLayout):
    """A cleared task (a rerun) records again, as a worker's outlet would."""
    api = RecordingApi()
    publish_asset_events(api, layout, ASSETS[:1], {}, commit_key("d", "r", "top", 1), None)
    publish_asset_events(api, layout, ASSETS[:1], {}, commit_key("d", "r", "top", 2), None)
    assert api.creates == 2 and api.lookups == 0


def _conn(**fields: Any) -> SimpleNamespace:
    base = {"conn_id": "speculative_api", "host": "http://api:8080", "schema": "", "port": None, "login": "u",
            "password": "secret-pw", "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


def test_connection_needs_an_http_url_and_credentials():
    conn = AssetApiConnection.from_connection(_conn(), "pipeline 'p', stage 's'")
    assert conn.base_url == "http://api:8080" and "secret-pw" not in repr(conn)
    assert AssetApiConnection.from_connection(_conn(host="api", schema="https", port=8443), "w").base_url == \
        "https://api:8443"
    token = AssetApiConnection.from_connection(_conn(login="", password="", extra_dejson={"token": "t0k"}), "w")
    assert token.token == "t0k" and "t0k" not in repr(token)
    for bad, message in ((_conn(host="javascript://x/alert"), "scheme"),
                         (_conn(login="", password=""), "login and password"),
                         (_conn(extra_dejson={"verfy": False}), "unknown extras"),
                         (_conn(host="http://api:8080/\"><script>"), "not allowed")):
        with pytest.raises(ConfigError, match=message) as info:
            AssetApiConnection.from_connection(bad, "pipeline 'p', stage 's'")
        assert "pipeline 'p', stage 's'" in str(info.value) and "speculative_api" in str(info.value)
