"""Every store path StageLayout gives: the names existing stores hold, byte for byte."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_speculative.store import layout as layouts
from airflow_provider_speculative.store.layout import StageLayout


def test_stage_and_attempt_paths_keep_the_stored_names(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    stage = tmp_path / "dag" / "run" / "stage"
    attempt = stage / "subtask=3" / "attempt=1"
    pairs = [
        (layout.blocklist, tmp_path / "dag" / "run" / "blocklist.json"),
        (layout.plan, stage / "plan.json"),
        (layout.journal, stage / "journal.jsonl"),
        (layout.summary, stage / "summary.json"),
        (layout.committed, stage / "committed.json"),
        (layout.expired, stage / "expired.json"),
        (layout.task_state, stage / "task.json"),
        (layout.hybrid_wait, stage / "hybrid_wait.json"),
        (layout.asset_events, stage / "asset_events.json"),
        (layout.admitted(3), stage / "subtask=3" / "admitted.json"),
        (layout.claim(3, 1), attempt / "claim.json"),
        (layout.status(3, 1), attempt / "status.json"),
        (layout.heartbeat(3, 1), attempt / "heartbeat.json"),
        (layout.cancel(3, 1), attempt / "cancel.json"),
        (layout.failure(3, 1), attempt / "failure.json"),
        (layout.invalidated(3, 1), attempt / "invalidated.json"),
        (layout.connect(3, 1), attempt / "connect.json"),
        (layout.connect_cancel(3, 1), attempt / "connect-cancel.json"),
        (layout.pod_template(3, 1), attempt / "pod-template.json"),
        (layout.manifest(3, 1), attempt / "_SUCCESS"),
        (layout.log(3, 1), attempt / "spark-submit.log"),
        (layout.data(3, 1), attempt / "data"),
    ]
    assert [got for got, _ in pairs] == [want for _, want in pairs]


def test_name_constants_are_the_file_names_of_the_layout(tmp_path: Path) -> None:
    """Code with only a directory (the supervisor, the read model) joins these; they must match the layout."""
    layout = StageLayout(tmp_path, "dag", "run", "stage")
    assert layout.cancel(0, 0).name == layouts.CANCEL_FILE
    assert layout.failure(0, 0).name == layouts.FAILURE_FILE
    assert layout.invalidated(0, 0).name == layouts.INVALIDATED_FILE
    assert layout.claim(0, 0).name == layouts.CLAIM_FILE
    assert layout.status(0, 0).name == layouts.STATUS_FILE
    assert layout.heartbeat(0, 0).name == layouts.HEARTBEAT_FILE
    assert layout.manifest(0, 0).name == layouts.MANIFEST_FILE
    assert layout.admitted(0).name == layouts.ADMITTED_FILE
    assert layout.plan.name == layouts.PLAN_FILE
    assert layout.task_state.name == layouts.TASK_STATE_FILE
    assert layout.committed.name == layouts.COMMITTED_FILE
    assert layout.journal.name == layouts.JOURNAL_FILE
    assert layout.expired.name == layouts.EXPIRED_FILE
