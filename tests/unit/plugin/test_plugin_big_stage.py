"""/api/stage on a 32,768-subtask stage: a bounded page of subtasks plus totals by state, never the whole stage."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_provider_speculative.store.layout import StageLayout

DAG, RUN, STAGE = "big_ui", "manual__2026-03-01T00:00:00+00:00", "scan"
N = 32768
T0 = 1_800_000_000.0
# Subtasks with attempts (the rest wait): admitted, failed, and one running attempt (heartbeat fresh).
ADMITTED = range(0, 300)
FAILED = range(300, 350)
RUNNING = 32767


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _attempt(layout: StageLayout, subtask: int, state: str | None, at: float) -> None:
    _write(layout.claim(subtask, 0), {"created_at": at, "node": "n1", "target": "local-a", "speculative": False,
                                      "reason": "initial attempt"})
    status: dict[str, Any] = {"deploying_at": at, "node": "n1", "pid": 999_999_999, "pgid": 1}
    if state:
        status.update(state=state, end_at=at + 5, exit_code=0 if state == "FINISHED" else 1)
    _write(layout.status(subtask, 0), status)
    _write(layout.heartbeat(subtask, 0), {"phase": state or "RUNNING", "node": "n1", "at": at + 5})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One running stage of 32,768 subtasks: 300 admitted, 50 failed, one running, the rest waiting."""
    root = tmp_path_factory.mktemp("big-store")
    layout = StageLayout(root, DAG, RUN, STAGE)
    _write(layout.plan, {"stage": STAGE, "dag_id": DAG, "run_id": RUN, "store_root": str(root), "parallelism": N,
                         "upstreams": [], "consumers": [], "speculation_blocker": None, "inputs": {},
                         "subtasks": [{"inputs": {}} for _ in range(N)]})
    for subtask in ADMITTED:
        _attempt(layout, subtask, "FINISHED", T0 + subtask)
        _write(layout.admitted(subtask), {"attempt": 0})
    for subtask in FAILED:
        _attempt(layout, subtask, "FAILED", T0 + subtask)
    _attempt(layout, RUNNING, None, T0)
    # More controller events than the view lists.
    layout.journal.write_text("".join(json.dumps({"at": T0 + i, "event": "cancel", "subtask": i, "attempt": 0,
                                                  "reason": "x" * 40}) + "\n" for i in range(1000)))
    _write(layout.summary, {"speculation": "on", "blocked_nodes": {}})
    return root


@pytest.fixture(scope="module")
def client(store: Path) -> TestClient:
    """The plugin app on the big store, with Airflow's access checks replaced by an allow-all."""
    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=store)
    for dependency in app.state.access.values():
        app.dependency_overrides[dependency] = lambda: None
    return TestClient(app)


def _get(client: TestClient, **params: Any) -> Any:
    # The running attempt's heartbeat is fresh at every request (stale after 30 s, it would be presumed lost).
    layout = StageLayout(client.app.state.store, DAG, RUN, STAGE)  # type: ignore[attr-defined]
    _write(layout.heartbeat(RUNNING, 0), {"phase": "RUNNING", "node": "n1", "at": time.time()})
    response = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": STAGE, **params})
    assert response.status_code == 200, response.text
    return response


def test_a_poll_answers_one_bounded_page_and_totals_by_state(client: TestClient) -> None:
    from airflow_provider_speculative.plugin.app import DEFAULT_SUBTASK_PAGE
    from airflow_provider_speculative.plugin.model import MAX_EVENTS

    response = _get(client)
    body = response.json()
    # The whole stage as one document was ~16 MiB (issue 38); a page stays far below 1 MiB.
    assert len(response.content) < 512 * 1024, len(response.content)
    assert body["subtask_page"] == {"offset": 0, "limit": DEFAULT_SUBTASK_PAGE, "count": DEFAULT_SUBTASK_PAGE,
                                    "total": N}
    assert [s["subtask"] for s in body["subtasks"]] == list(range(DEFAULT_SUBTASK_PAGE))
    assert body["subtask_totals"] == {"admitted": len(ADMITTED), "running": 1, "failed": len(FAILED),
                                      "waiting": N - len(ADMITTED) - len(FAILED) - 1}
    # Aggregates still cover every subtask, not the page.
    assert body["progress"] == {"admitted": len(ADMITTED), "parallelism": N}
    assert body["attempts_total"] == len(ADMITTED) + len(FAILED) + 1 and body["state"] == "running"
    assert len(body["events"]) == MAX_EVENTS and body["events_total"] == 1000
    assert body["events"][-1]["subtask"] == 999  # the latest


def test_pages_cover_every_subtask_once_in_order(client: TestClient) -> None:
    seen: list[int] = []
    limit = 2000
    for offset in range(0, N + 1, limit):  # the last page is short, one past the end is empty
        body = _get(client, offset=offset, limit=limit).json()
        assert body["subtask_page"]["offset"] == offset and body["subtask_page"]["total"] == N
        assert body["subtask_page"]["count"] == len(body["subtasks"]) == min(limit, max(0, N - offset))
        seen += [s["subtask"] for s in body["subtasks"]]
    assert seen == list(range(N))
    assert _get(client, offset=N, limit=10).json()["subtasks"] == []


def test_a_page_lists_its_subtasks_attempts(client: TestClient) -> None:
    body = _get(client, offset=250, limit=150).json()
    by_subtask = {s["subtask"]: s for s in body["subtasks"]}
    assert sorted(by_subtask) == list(range(250, 400))
    assert by_subtask[250]["admitted"] == 0 and by_subtask[250]["attempts"][0]["state"] == "FINISHED"
    assert by_subtask[349]["admitted"] is None and by_subtask[349]["attempts"][0]["state"] == "FAILED"
    assert by_subtask[399]["attempts"] == [] and by_subtask[399]["admitted"] is None
    last = _get(client, offset=N - 1, limit=1).json()["subtasks"]
    assert [s["subtask"] for s in last] == [RUNNING] and last[0]["attempts"][0]["live"] is True


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 2001}, {"offset": -1}, {"offset": "x"},
                                    {"limit": "NaN"}, {"offset": 10**9}])
def test_a_bad_page_is_a_422_naming_the_field(client: TestClient, params: dict[str, Any]) -> None:
    response = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": STAGE, **params})
    assert response.status_code == 422, response.text
    assert next(iter(params)) in response.text


def test_the_run_view_carries_totals_not_subtasks(client: TestClient) -> None:
    from airflow_provider_speculative.plugin.model import MAX_EVENTS

    response = client.get("/api/run", params={"dag_id": DAG, "run_id": RUN})
    assert response.status_code == 200 and len(response.content) < 128 * 1024, len(response.content)
    (stage,) = response.json()["stages"]
    assert "subtasks" not in stage and sum(stage["subtask_totals"].values()) == N
    assert stage["subtask_totals"]["admitted"] == len(ADMITTED) == stage["progress"]["admitted"]
    assert len(stage["events"]) == MAX_EVENTS and stage["events_total"] == 1000 and stage["restarts_total"] == 0
