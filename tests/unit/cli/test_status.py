"""`airflow speculative status`: readable times, ISO JSON, the --watch loop against a store a thread advances,
and the read model's heartbeat liveness (what the UI uses)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.cli.commands import (
    attempt_rows,
    format_duration,
    format_progress,
    format_rerun,
    format_time,
    format_until,
    iso_time,
    json_report,
    report_lines,
    watch,
)
from airflow_provider_speculative.control.readmodel import (
    HEARTBEAT_STALE_AFTER,
    heartbeat_alive,
    latest_run_id,
    run_progress,
    run_report,
)
from airflow_provider_speculative.exceptions import NotFoundError
from airflow_provider_speculative.store.layout import StageLayout
from tests.integration.spark_helpers import wait_for

CET = timezone(timedelta(hours=1))
NOW = datetime(2026, 1, 2, 14, 0, 0, tzinfo=CET).timestamp()
DAG, RUN = "demo", "manual__2026-01-02T00:00:00+00:00"


def test_times_are_local_with_the_date_only_when_not_today() -> None:
    assert format_time(NOW + 7.4, NOW, CET) == "14:00:07"
    assert format_time(NOW - 86400, NOW, CET) == "2026-01-01 14:00:00"
    assert format_time(NOW + 120, NOW, CET, seconds=False) == "14:02"
    assert format_time(None, NOW, CET) == "-"
    # The same instant in another zone is another wall-clock time.
    assert format_time(NOW, NOW, UTC) == "13:00:00"


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.25, "250ms"), (4.26, "4.3s"), (42.4, "42s"), (59.6, "1m 00s"), (303, "5m 03s"),
    (7500, "2h 05m"), (3 * 86400 + 4 * 3600 + 59, "3d 4h"), (-3, "0ms"),
])
def test_durations(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_block_expiry_is_relative_to_now() -> None:
    assert format_until(NOW + 300, NOW, CET) == "until 14:05 (in 5m 00s)"
    assert format_until(NOW - 180, NOW, CET) == "expired at 13:57 (3m 00s ago)"
    assert format_until(NOW + 86400, NOW, CET) == "until 2026-01-03 14:00 (in 1d 0h)"


def test_iso_times_carry_the_offset() -> None:
    assert iso_time(NOW + 0.5, CET) == "2026-01-02T14:00:00.500+01:00"
    assert iso_time(None) is None
    assert datetime.fromisoformat(iso_time(NOW)).timestamp() == NOW  # type: ignore[arg-type]


def _report() -> dict[str, Any]:
    attempt = {"attempt": 0, "state": "FINISHED", "target": "local-a", "node": "local-a", "speculative": False,
               "start": NOW - 65, "end": NOW - 5, "exit_code": 0, "cause": None, "admitted": True, "app_id": None,
               "launched_at": NOW - 66, "startup_seconds": None, "duration": 60.0, "last_seen": NOW - 5}
    running = {**attempt, "attempt": 1, "state": "RUNNING", "start": NOW - 30, "end": None, "exit_code": None,
               "admitted": False, "speculative": True, "launched_at": NOW - 31}
    return {"dag_id": DAG, "run_id": RUN, "stages": [{
        "stage": "scan", "parallelism": 2, "upstreams": [], "consumers": ["aggregate"], "committed": False,
        "expired": None, "sink": None, "speculation": "on", "numSlowExecutionVertices": 1,
        "numEffectiveSpeculativeExecutions": 0, "blocked_nodes": {"local-b": NOW + 300}, "baseline_seconds": 20.0,
        "failed": False, "journal_events": 3,
        "subtasks": [{"subtask": 0, "admitted": 0, "current": 0, "reused": False, "attempts": [attempt]},
                     {"subtask": 1, "admitted": None, "current": 1, "reused": False, "attempts": [running]}]}]}


def test_table_has_readable_times_block_expiry_and_durations() -> None:
    lines = report_lines(_report(), now=NOW, tz=CET)
    rows = attempt_rows(_report(), now=NOW, tz=CET)
    text = "\n".join(lines) + json.dumps(rows)
    assert "1795" not in text and "1767" not in text  # no epoch seconds anywhere
    assert "(times in local time, UTC+01:00)" in lines[0]
    assert "blocked nodes: local-b until 14:05 (in 5m 00s)" in lines[1]
    assert lines[2] == "  parallelism: fixed"
    assert list(rows[0].values())[:9] == ["scan", "0", "0", "FINISHED", "local-a", "local-a", "13:58:55",
                                         "13:59:55", "1m 00s"]
    assert (rows[1]["start"], rows[1]["end"], rows[1]["duration"]) == ("13:59:30", "-", "30s+")  # so far
    assert (rows[0]["flags"], rows[1]["flags"]) == ("admitted,current", "current,speculative")


@pytest.mark.parametrize("output", ["table", "plain", "json", "yaml"])
def test_status_prints_airflows_output_formats(output: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    import yaml

    from airflow_provider_speculative.cli import commands

    monkeypatch.setattr("airflow_provider_speculative.control.readmodel.run_report", lambda *a, **k: _report())
    monkeypatch.setattr("airflow_provider_speculative.settings.store_root", lambda config: tmp_path)
    commands.status(SimpleNamespace(dag_id=DAG, run_id=RUN, stage=None, output=output, watch=False))
    out = capsys.readouterr().out
    if output == "json":
        assert json.loads(out)["stages"][0]["subtasks"][1]["attempts"][0]["speculative"] is True
    elif output == "yaml":
        assert yaml.safe_load(out)["stages"][0]["blocked_nodes_epoch"] == {"local-b": NOW + 300}
    elif output == "plain":  # rows only, for pipes: Airflow's plain table
        lines = out.splitlines()
        assert lines[0].split()[:4] == ["stage", "subtask", "attempt", "state"] and len(lines) == 3
        assert lines[2].split()[:5] == ["scan", "1", "1", "RUNNING", "local-a"]
    else:  # the stage lines, then Airflow's rich table (as `airflow dags list` prints it)
        assert out.startswith(f"DAG {DAG} run {RUN} (times in local time")
        header = next(line for line in out.splitlines() if "subtask" in line)
        assert header.split()[:5] == ["stage", "|", "subtask", "|", "attempt"]
        assert any(line.split("|")[3].strip() == "RUNNING" for line in out.splitlines() if line.count("|") > 5)


def test_table_cells_from_the_store_cannot_drive_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from airflow_provider_speculative.cli import commands

    report = _report()
    report["stages"][0]["subtasks"][0]["attempts"][0]["node"] = "\x1b]8;;http://evil\x07[bold red]node[/]\x1b[2J"
    monkeypatch.setattr("airflow_provider_speculative.control.readmodel.run_report", lambda *a, **k: report)
    monkeypatch.setattr("airflow_provider_speculative.settings.store_root", lambda config: tmp_path)
    for output in ("table", "plain"):
        commands.status(SimpleNamespace(dag_id=DAG, run_id=RUN, stage=None, output=output, watch=False))
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out  # no escape sequence reaches the terminal
        assert "\\x1b]8;;http://evil\\x07[bold red]node[/]" in out  # shown, as inert text


def test_json_has_iso_times_and_keeps_epochs_under_their_own_keys() -> None:
    doc = json.loads(json.dumps(json_report(_report(), now=NOW, tz=CET)))
    stage = doc["stages"][0]
    assert stage["blocked_nodes"] == {"local-b": "2026-01-02T14:05:00.000+01:00"}
    assert stage["blocked_nodes_epoch"] == {"local-b": NOW + 300}
    done, running = (s["attempts"][0] for s in stage["subtasks"])
    assert done["start"] == "2026-01-02T13:58:55.000+01:00" and done["start_epoch"] == NOW - 65
    assert done["duration_seconds"] == 60 and running["duration_seconds"] == 30 and running["end"] is None
    assert doc["generated_at"] == "2026-01-02T14:00:00.000+01:00"


def test_progress_frame_counts_admitted_running_speculative_and_slow() -> None:
    report = _report()
    progress = run_progress(report)
    assert progress["stages"] == [{"stage": "scan", "state": "running", "admitted": 1, "total": 2, "running": 1,
                                   "speculative": 1, "slow": 1}]
    assert progress["pending_stages"] == ["aggregate"] and not progress["done"]
    frame = format_progress(report, progress, NOW, CET, run_state="running").splitlines()
    assert cells(frame[1]) == ["stage", "state", "admitted", "running", "speculative", "slow", "blocked nodes"]
    assert cells(frame[3]) == ["scan", "running", "1/2", "1", "1", "1", "local-b until 14:05 (in 5m 00s)"]
    assert cells(frame[4])[:2] == ["aggregate", "not planned"]
    assert frame[0] == f"DAG {DAG} run {RUN} at 14:00:00, Airflow run running"


def cells(line: str) -> list[str]:
    """The cells of a row of Airflow's table style (columns separated by ``|``)."""
    return [cell.strip() for cell in line.split("|")]


def test_progress_cells_show_markup_and_control_characters_as_written() -> None:
    report = _report()
    report["stages"][0]["stage"] = progress_stage = "[bold]scan\x1b[2J"
    progress = run_progress(report)
    frame = format_progress(report, progress, NOW, CET)
    assert "[bold]scan\\x1b[2J" in frame and "\x1b" not in frame
    assert progress["stages"][0]["stage"] == progress_stage


def test_rerun_output_names_both_parts_of_the_region() -> None:
    text = format_rerun({"dag_id": DAG, "run_id": RUN, "dry_run": False, "no_downstream": False,
                         "region": {"scan": [1], "aggregate": [0, 1]}, "requested": {"scan": [1]},
                         "downstream": {"aggregate": [0, 1]}, "cleared_tasks": ["aggregate", "scan"],
                         "stage_tasks": {"scan": "scan", "aggregate": "aggregate"}})
    assert text.splitlines() == [
        f"Rerunning in DAG {DAG} run {RUN}:", "  named:", "    stage scan: subtasks 1",
        "  downstream (consumers of the named subtasks, transitively):", "    stage aggregate: subtasks 0, 1",
        "Cleared tasks: aggregate, scan"]


def test_rerun_dry_run_lists_running_hybrid_consumers_that_restart() -> None:
    text = format_rerun({"dag_id": DAG, "run_id": RUN, "dry_run": True, "no_downstream": True,
                         "region": {"scan": [1], "copy": [1]}, "requested": {"scan": [1]},
                         "downstream": {"copy": [1]}, "in_flight": {"copy": [1]}})
    assert text.splitlines()[-2:] == [
        "  running consumers of hybrid exchanges that read a rerun partition (they restart with it):",
        "    stage copy: subtasks 1"]


# -- the store behind --watch and the UI ---------------------------------------------------------


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def _stage(root: Path, stage: str, parallelism: int, consumers: list[str]) -> StageLayout:
    layout = StageLayout(root, DAG, RUN, stage)
    _write(layout.plan, {"stage": stage, "store_root": str(root), "parallelism": parallelism, "upstreams": [],
                         "consumers": consumers, "subtasks": [{"inputs": {}}] * parallelism})
    return layout


def _running(layout: StageLayout, subtask: int, number: int, at: float, speculative: bool = False) -> None:
    # A supervisor on another host: liveness comes from alive_at (the pid means nothing here).
    _write(layout.claim(subtask, number), {"target": "local-a", "node": "local-a", "speculative": speculative,
                                           "created_at": at})
    _write(layout.status(subtask, number), {"pid": 1, "pgid": 1, "host": "elsewhere", "deploying_at": at,
                                            "alive_at": at})
    _write(layout.heartbeat(subtask, number), {"phase": "RUNNING", "node": "local-a", "at": at})


def _finish(layout: StageLayout, subtask: int, number: int, at: float) -> None:
    status = json.loads(layout.status(subtask, number).read_text())
    _write(layout.status(subtask, number), {**status, "state": "FINISHED", "end_at": at, "exit_code": 0})
    _write(layout.admitted(subtask), {"attempt": number})


class Frames(io.StringIO):
    """A thread-safe output that the test can read while watch() writes to it."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def frames(out: Frames) -> list[str]:
    """The frames drawn so far (rich writes each whole, after the cursor moves that erase the last)."""
    text = _CSI.sub("", out.text())
    return [f"DAG {part}" for part in text.split("DAG ")[1:]]


def row(out: Frames, stage: str) -> list[str]:
    """The stage's row of the last frame, split into cells."""
    drawn = frames(out)
    last = drawn[-1] if drawn else ""
    return next((cells(line) for line in last.splitlines() if cells(line)[:1] == [stage]), [])


def test_watch_follows_a_live_run_until_every_stage_committed(tmp_path: Path) -> None:
    now = time.time()
    scan = _stage(tmp_path, "scan", 2, ["aggregate"])
    _running(scan, 0, 0, now)
    _running(scan, 1, 0, now)
    out, result = Frames(), {}
    thread = threading.Thread(target=lambda: result.update(watch(
        tmp_path, DAG, RUN, out=out, interval=0.05, run_state=lambda: "running", in_place=True)), daemon=True)
    thread.start()
    wait_for(lambda: row(out, "scan") == ["scan", "running", "0/2", "2", "0", "0", "-"], 10,
             "a frame with both scan subtasks running")

    _running(scan, 1, 1, time.time(), speculative=True)
    wait_for(lambda: row(out, "scan")[:5] == ["scan", "running", "0/2", "3", "1"], 10, "the speculative attempt",
             interval=0.02)
    _finish(scan, 1, 1, time.time())
    _finish(scan, 0, 0, time.time())
    _write(scan.committed, {"subtasks": {}})
    wait_for(lambda: row(out, "scan")[:3] == ["scan", "committed", "2/2"], 10, "scan committed", interval=0.02)
    assert row(out, "aggregate")[:2] == ["aggregate", "not planned"]
    assert thread.is_alive(), "the run is not over while a consumer has not planned"

    aggregate = _stage(tmp_path, "aggregate", 1, [])
    _running(aggregate, 0, 0, time.time())
    _finish(aggregate, 0, 0, time.time())
    _write(aggregate.committed, {"subtasks": {}})
    thread.join(timeout=10)
    assert not thread.is_alive(), "watch must return once every stage committed"
    assert result["all_committed"] and result["done"]
    assert len(frames(out)) >= 4 and "\x1b[1A" in out.text()  # each frame redraws the last one in place
    assert row(out, "scan")[:3] == ["scan", "committed", "2/2"]
    assert row(out, "aggregate")[:3] == ["aggregate", "committed", "1/1"]


def test_watch_stops_when_the_airflow_run_finished_and_waits_for_a_queued_run(tmp_path: Path) -> None:
    states = iter(["queued", "queued", "running", "failed"])
    out = Frames()
    calls = []

    def state() -> str:
        calls.append(1)
        if len(calls) == 3:  # the run plans its first stage while being watched
            _running(_stage(tmp_path, "scan", 1, []), 0, 0, time.time())
        return next(states)

    progress = watch(tmp_path, DAG, RUN, out=out, interval=0.0, run_state=state, in_place=False)
    assert len(calls) == 4 and not progress["done"]
    assert "Airflow run failed" in out.text().split("\n\n")[-1]
    with pytest.raises(NotFoundError):  # a run Airflow does not know is an error, not an endless wait
        watch(tmp_path / "empty", DAG, RUN, out=out, interval=0.0, run_state=lambda: None)


def test_watch_prints_each_refresh_in_the_output_format(tmp_path: Path) -> None:
    scan = _stage(tmp_path, "scan", 2, [])
    _running(scan, 0, 0, time.time())
    _running(scan, 1, 0, time.time())
    for output in ("json", "yaml", "plain"):
        out = Frames()
        progress = watch(tmp_path, DAG, RUN, out=out, interval=0.0, output=output, in_place=True,
                         clock=iter([NOW, NOW + 2]).__next__, max_frames=2)
        text = out.text()
        assert "\x1b" not in text and not progress["done"]  # never redrawn in place, whatever the terminal
        if output == "json":
            documents = [json.loads(line) for line in text.splitlines()]  # one document per line
            assert [d["at_epoch"] for d in documents] == [NOW, NOW + 2]
            assert documents[0]["stages"] == [{"stage": "scan", "state": "running", "admitted": 0, "total": 2,
                                               "running": 2, "speculative": 0, "slow": 0, "blocked_nodes": {}}]
            assert documents[0]["dag_id"] == DAG and documents[0]["done"] is False
        elif output == "yaml":
            import yaml

            documents = list(yaml.safe_load_all(text))
            assert len(documents) == 2 and documents[1]["stages"][0]["running"] == 2
        else:
            first, second = text.split("\n\n")
            assert first.splitlines()[0].startswith(f"DAG {DAG} run {RUN} at ")
            assert first.splitlines()[2].split() == ["scan", "running", "0/2", "2", "0", "0", "-"]
            assert "|" not in first and second.splitlines()[2] == first.splitlines()[2]


def test_heartbeat_liveness_uses_the_newest_sign_of_life() -> None:
    assert heartbeat_alive({"deploying_at": 100.0}, {"at": 120.0}, 100 + HEARTBEAT_STALE_AFTER + 10)
    assert heartbeat_alive({"deploying_at": 100.0, "alive_at": 125.0}, {}, 150.0)
    assert not heartbeat_alive({"deploying_at": 100.0, "alive_at": 105.0}, {"at": 110.0},
                               110 + HEARTBEAT_STALE_AFTER)
    assert not heartbeat_alive({}, {}, 0.0)


def test_heartbeat_mode_shows_a_local_attempt_without_process_as_running(tmp_path: Path) -> None:
    """A pid that does not exist on this host (another machine's attempt) does not make it failed."""
    scan = _stage(tmp_path, "scan", 1, [])
    now = time.time()
    _write(scan.claim(0, 0), {"target": "local-a", "node": "local-a", "created_at": now - 40})
    _write(scan.status(0, 0), {"pid": 999_999_999, "pgid": 999_999_999, "deploying_at": now - 40,
                               "alive_at": now - 3})
    _write(scan.heartbeat(0, 0), {"phase": "RUNNING", "node": "local-a", "at": now - 1})

    def state(**kwargs: Any) -> tuple[str, str | None]:
        (a,) = run_report(tmp_path, DAG, RUN, **kwargs)["stages"][0]["subtasks"][0]["attempts"]
        return a["state"], a["cause"]

    assert state(liveness="process")[0] == "FAILED"  # the pid lookup on this host finds nothing
    assert state(liveness="heartbeat") == ("RUNNING", None)
    late = now + HEARTBEAT_STALE_AFTER + 1
    assert state(liveness="heartbeat", now=late) == ("FAILED", "presumed lost: no heartbeat for 30 s")


def test_table_shows_the_parallelism_decision_and_skew_warnings() -> None:
    from airflow_provider_speculative.core.parallelism import decide_parallelism, describe_decision

    report = _report()
    decision = decide_parallelism(total_bytes=3 * 2**30, per_subtask=2**30, minimum=1, maximum=16,
                                  bounds={"files": 2}, files=2)
    warning = "input 'rows': subpartition 17 holds 61% of the bytes; not split (stage does not declare splittable_skew)"
    split = "input 'rows': subpartition 5 holds 55% of the bytes; split across 2 consumers by producer range"
    report["stages"][0].update(parallelism_line=describe_decision(decision), plan_warnings=[warning],
                               skew_splits=[split])
    lines = report_lines(report, now=NOW, tz=CET)
    assert lines[2] == ("  parallelism: auto: 3.0 GiB / 1.0 GiB per subtask -> 3, within [1, 16], 2 source files: "
                        "2 (bounded by files)")
    assert lines[3] == "  warning: " + warning
    assert lines[4] == "  skew: " + split


def test_stages_are_listed_in_pipeline_order_not_by_name(tmp_path: Path) -> None:
    for stage, upstreams in (("zz_scan", []), ("b_join", ["zz_scan", "a_dim"]), ("a_dim", []), ("c_top", ["b_join"])):
        layout = _stage(tmp_path, stage, 1, [])
        plan = json.loads(layout.plan.read_text())
        _write(layout.plan, {**plan, "upstreams": upstreams, "dag_id": DAG, "run_id": RUN})
    assert [s["stage"] for s in run_report(tmp_path, DAG, RUN)["stages"]] == ["a_dim", "zz_scan", "b_join", "c_top"]


def test_status_without_a_run_id_shows_the_dags_latest_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import os
    from types import SimpleNamespace

    from airflow_provider_speculative.cli import commands

    with pytest.raises(NotFoundError, match="no speculative stages recorded for dag 'demo'"):
        latest_run_id(tmp_path, DAG)
    for run, mtime in (("scheduled__2026-01-01", 1_000.0), ("manual__late:name+1", 2_000.0), ("older", 500.0)):
        layout = StageLayout(tmp_path, DAG, run, "scan")
        _write(layout.plan, {"stage": "scan", "store_root": str(tmp_path), "parallelism": 1, "upstreams": [],
                             "consumers": [], "subtasks": [{"inputs": {}}], "dag_id": DAG, "run_id": run})
        os.utime(layout.plan, (mtime, mtime))
    # The newest plan's own run id, not its (sanitised) directory name.
    assert latest_run_id(tmp_path, DAG) == "manual__late:name+1"
    monkeypatch.setattr("airflow_provider_speculative.settings.store_root", lambda config: tmp_path)
    commands.status(SimpleNamespace(dag_id=DAG, run_id=None, stage=None, output="json", watch=False))
    captured = capsys.readouterr()
    assert json.loads(captured.out)["run_id"] == "manual__late:name+1"
    assert "latest run in the store is manual__late:name+1" in captured.err


def test_a_damaged_store_with_a_stage_cycle_still_lists_every_stage_once() -> None:
    from airflow_provider_speculative.control.readmodel import pipeline_order

    plans = [{"stage": "b", "upstreams": ["a"]}, {"stage": "a", "upstreams": ["b"]}, {"stage": "c", "upstreams": []}]
    assert [p["stage"] for p in pipeline_order(plans)] == ["a", "b", "c"]


def test_logs_prints_the_tail_of_the_latest_attempt_and_follows_until_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from airflow_provider_speculative.cli import commands

    layout = _stage(tmp_path, "scan", 2, [])
    plan = json.loads(layout.plan.read_text())
    _write(layout.plan, {**plan, "dag_id": DAG, "run_id": RUN})
    for number in (0, 1):
        _write(layout.claim(1, number), {"target": "local-a"})
    layout.log(1, 0).write_text("old attempt\n")
    layout.log(1, 1).write_text("".join(f"row {i}\n" for i in range(1000)))
    _write(layout.status(1, 1), {"deploying_at": 1.0})  # still running
    monkeypatch.setattr("airflow_provider_speculative.settings.store_root", lambda config: tmp_path)
    args = SimpleNamespace(dag_id=DAG, run_id=RUN, stage="scan", subtask=1, attempt=None, tail_bytes=100,
                           output="table", follow=False, interval=0.01)
    commands.logs(args)
    captured = capsys.readouterr()
    assert captured.out.endswith("row 999\n") and "row 0\n" not in captured.out and "old attempt" not in captured.out
    assert "stage scan subtask 1 attempt 1:" in captured.err and "last" in captured.err

    # --follow prints what the attempt appends, and returns once its launcher recorded the end.
    reads = []

    def appending_sleep(seconds: float) -> None:
        reads.append(seconds)
        with open(layout.log(1, 1), "a") as log:
            log.write("final line\n")
        _write(layout.status(1, 1), {"deploying_at": 1.0, "end_at": 2.0, "exit_code": 0})

    monkeypatch.setattr("time.sleep", appending_sleep)
    commands.logs(SimpleNamespace(**{**vars(args), "follow": True}))
    assert capsys.readouterr().out.endswith("row 999\nfinal line\n") and len(reads) == 1

    commands.logs(SimpleNamespace(**{**vars(args), "attempt": 0, "output": "json"}))
    body = json.loads(capsys.readouterr().out)
    assert (body["attempt"], body["text"], body["truncated"]) == (0, "old attempt\n", False)
    with pytest.raises(SystemExit):
        commands.logs(SimpleNamespace(**{**vars(args), "attempt": 5}))
    assert "no attempt 5 (attempts: 0, 1)" in capsys.readouterr().err


def test_status_takes_airflows_own_output_argument_and_watch_honours_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from argparse import Namespace

    from airflow.cli.cli_config import ARG_OUTPUT

    from airflow_provider_speculative import settings
    from airflow_provider_speculative.cli import commands
    from airflow_provider_speculative.cli.definition import get_cli_commands

    status_command = next(c for c in get_cli_commands()[0].subcommands if c.name == "status")
    assert ARG_OUTPUT in status_command.args
    seen: dict[str, Any] = {}
    monkeypatch.setattr(settings, "store_root", lambda config: tmp_path)
    monkeypatch.setattr(commands, "watch", lambda *args, **kwargs: seen.update(kwargs))
    commands.status(Namespace(dag_id=DAG, run_id=RUN, stage=None, output="json", watch=True, interval=1.0))
    assert seen["output"] == "json"
