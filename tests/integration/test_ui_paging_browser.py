"""The stage view of a stage bigger than one page, in real Chromium: totals, a page of rows, next/previous.

No Spark and no api-server: the plugin's own FastAPI app is served by uvicorn in a thread (as in
test_ui_hostile_browser.py, whose Chromium fixtures this module reuses) on a store of 1,200 subtasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from airflow_provider_speculative.store.layout import StageLayout
from tests.integration.test_ui_hostile_browser import browser, page  # noqa: F401  (fixtures)
from tests.plugin_app import served_plugin

pytestmark = [pytest.mark.timeout(120)]

DAG, RUN, STAGE, N = "paged_ui", "manual__2026-03-01T00:00:00+00:00", "scan", 1200
PARAMS = {"dag_id": DAG, "run_id": RUN, "task_id": STAGE}
T0 = 1_800_000_000.0


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture(scope="module")
def plugin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The plugin app on a committed stage of 1,200 subtasks (one finished, admitted attempt each)."""


    root = tmp_path_factory.mktemp("paged-store")
    layout = StageLayout(root, DAG, RUN, STAGE)
    _write(layout.plan, {"stage": STAGE, "dag_id": DAG, "run_id": RUN, "store_root": str(root), "parallelism": N,
                         "upstreams": [], "consumers": [], "speculation_blocker": None, "inputs": {},
                         "subtasks": [{"inputs": {}} for _ in range(N)]})
    for i in range(N):
        _write(layout.claim(i, 0), {"created_at": T0, "node": "n1", "target": "local-a", "speculative": False,
                                    "reason": "initial attempt"})
        _write(layout.status(i, 0), {"deploying_at": T0, "node": "n1", "pid": 999_999_999, "pgid": 1,
                                     "state": "FINISHED", "end_at": T0 + 5, "exit_code": 0})
        _write(layout.admitted(i), {"attempt": 0})
    _write(layout.summary, {"speculation": "on", "blocked_nodes": {}})
    _write(layout.committed, {"subtasks": {}, "sink": None})
    with served_plugin(root, backlog=16) as url:
        yield url


def _rows(page: Any) -> list[int]:  # noqa: F811
    return page.eval_on_selector_all("#attempts tr.attempt-row", "rs => rs.map(r => Number(r.dataset.subtask))")


def test_the_stage_view_pages_through_subtasks_with_totals(plugin_url: str, page: Any) -> None:  # noqa: F811
    page.goto(f"{plugin_url}/ui/stage?{urlencode(PARAMS)}")
    page.wait_for_selector("#subtask-range")
    assert page.text_content("#subtask-range") == f"subtasks 0-499 of {N}"
    assert page.text_content("#subtask-totals") == f"{N} admitted, 0 running, 0 failed, 0 waiting"
    assert _rows(page) == list(range(500)) and page.is_disabled("#subtasks-prev")
    page.click("#subtasks-next")
    page.wait_for_selector("#subtask-range:has-text('subtasks 500-')")
    assert _rows(page) == list(range(500, 1000))
    page.click("#subtasks-next")
    page.wait_for_selector("#subtask-range:has-text('subtasks 1000-')")
    assert page.text_content("#subtask-range") == f"subtasks 1000-1199 of {N}"
    assert _rows(page) == list(range(1000, N)) and page.is_disabled("#subtasks-next")
    page.click("#subtasks-prev")
    page.wait_for_selector("#subtask-range:has-text('subtasks 500-')")
    assert not [m for m in page.console if "Content Security Policy" in m], page.console
