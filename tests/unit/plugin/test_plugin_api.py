"""The UI plugin's JSON endpoints, pages and links against a hand-built store (no Spark, no api-server)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import psutil
import pytest
from fastapi.testclient import TestClient

from airflow_provider_speculative.store.layout import StageLayout
from tests.factories import stage_plan, write_plan

DAG, RUN = "spec_ui", "manual__2026-03-01T00:00:00+00:00"
T0 = 1_800_000_000.0


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


# A target whose command line carries a secret the UI must not show.
TARGETS = {"local-a": {"kind": "spark_submit", "command": ["spark-submit", "--conf", "secret=do-not-leak"]}}


def _attempt(layout: StageLayout, subtask: int, number: int, *, target: str, state: str | None,
             start: float, end: float | None = None, speculative: bool = False, reason: str = "initial attempt",
             live_pid: int | None = None, cause: str | None = None) -> None:
    _write(layout.claim(subtask, number), {"created_at": start - 0.5, "node": target, "target": target,
                                           "speculative": speculative, "reason": reason})
    status: dict[str, Any] = {"deploying_at": start, "node": target, "pid": live_pid or 999_999_999, "pgid": 1}
    if state:
        status.update(state=state, end_at=end, exit_code=0 if state == "FINISHED" else 143, cause=cause)
        _write(layout.heartbeat(subtask, number), {"phase": state, "node": target, "at": end,
                                                   "app_id": f"app-{layout.stage}-{subtask}-{number}"})
    if live_pid:
        status["create_time"] = psutil.Process(live_pid).create_time()
        _write(layout.heartbeat(subtask, number), {"phase": "RUNNING", "node": target, "at": start + 1})
        layout.log(subtask, number).write_text(
            "INFO Utils: Successfully started service 'SparkUI' on port 4041.\n"
            "INFO NettyBlockTransferService: Server created on 10.1.2.3:39535\n")
    _write(layout.status(subtask, number), status)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A finished scan (3 subtasks; subtask 1's speculative copy won; a node blocked) and a running aggregate."""
    scan = write_plan(stage_plan(
        tmp_path, dag_id=DAG, run_id=RUN, stage="scan", parallelism=3, consumers=["aggregate"],
        speculation_blocker=None, targets=TARGETS,
        inputs={"lineitem": {"kind": "source", "format": "parquet", "files": []}},
        subtasks=[{"inputs": {"lineitem": {}}} for _ in range(3)]))
    _attempt(scan, 0, 0, target="local-a", state="FINISHED", start=T0, end=T0 + 30)
    _attempt(scan, 1, 0, target="local-b", state="CANCELED", start=T0, end=T0 + 95, cause="cancelled (signal 15)")
    _attempt(scan, 1, 1, target="local-a", state="FINISHED", start=T0 + 60, end=T0 + 90, speculative=True,
             reason="speculative copy of a slow attempt")
    _attempt(scan, 2, 0, target="local-a", state="FAILED", start=T0, end=T0 + 10, cause="exit code 1")
    _attempt(scan, 2, 1, target="local-a", state="FINISHED", start=T0 + 11, end=T0 + 40,
             reason="restart after failure")
    for subtask, number in ((0, 0), (1, 1), (2, 1)):
        _write(scan.admitted(subtask), {"attempt": number})
    _write(scan.summary, {"speculation": "on", "numSlowExecutionVertices": 0, "numEffectiveSpeculativeExecutions": 1,
                          "peakSlowExecutionVertices": 1, "baseline_seconds": 45.0,
                          "blocked_nodes": {"local-b": time.time() + 600}})
    scan.journal.write_text("\n".join(json.dumps(e) for e in [
        {"at": T0, "event": "launch", "subtask": 0, "attempt": 0},
        {"at": T0 + 59, "event": "block_node", "node": "local-b", "until": T0 + 659, "reason": "slow"},
        {"at": T0 + 90, "event": "admit", "subtask": 1, "attempt": 1},
        {"at": T0 + 90, "event": "cancel", "subtask": 1, "attempt": 0, "reason": "attempt 1 finished first"},
    ]) + "\n")
    _write(scan.committed, {"subtasks": {}, "sink": None})

    aggregate = write_plan(stage_plan(
        tmp_path, dag_id=DAG, run_id=RUN, stage="aggregate", parallelism=2, upstreams=["scan"],
        speculation_blocker=None, targets=TARGETS,
        inputs={"partials": {"kind": "exchange", "upstream": "scan", "distribution": "all_to_all", "mode": "hybrid"}},
        subtasks=[{"inputs": {"partials": {}}} for _ in range(2)]))
    _attempt(aggregate, 0, 0, target="local-a", state="FINISHED", start=T0 + 100, end=T0 + 120)
    _write(aggregate.admitted(0), {"attempt": 0})
    _attempt(aggregate, 1, 0, target="local-a", state=None, start=time.time() - 5, live_pid=os.getpid())
    _write(aggregate.summary, {"speculation": "on", "baseline_seconds": None, "blocked_nodes": {}})
    return tmp_path


def _app(store: Path, authorized: bool) -> TestClient:
    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=store)
    if authorized:  # only this case replaces Airflow's check; the refused cases below go through it
        for dependency in app.state.access.values():
            app.dependency_overrides[dependency] = lambda: None
    return TestClient(app)


@pytest.mark.parametrize("url", [
    f"/api/run?dag_id={DAG}&run_id={RUN}",
    f"/api/stage?dag_id={DAG}&run_id={RUN}&task_id=scan",
    f"/ui/run?dag_id={DAG}&run_id={RUN}",
    f"/ui/stage?dag_id={DAG}&run_id={RUN}&task_id=scan",
    f"/api/log?dag_id={DAG}&run_id={RUN}&task_id=scan&subtask=0",
    f"/ui/log?dag_id={DAG}&run_id={RUN}&task_id=scan&subtask=0",
])
def test_requests_without_credentials_are_refused(store: Path, url: str):
    response = _app(store, authorized=False).get(url)
    assert response.status_code == 401, response.text
    assert "scan" not in response.text


def test_run_endpoint_has_graph_progress_and_reruns(store: Path):
    body = _app(store, authorized=True).get("/api/run", params={"dag_id": DAG, "run_id": RUN}).json()
    assert [s["stage"] for s in body["stages"]] == ["scan", "aggregate"]
    assert body["edges"] == [{"from": "scan", "to": "aggregate", "input": "partials", "distribution": "all_to_all",
                              "mode": "hybrid"}]
    assert body["sources"] == [{"stage": "scan", "input": "lineitem", "kind": "source", "format": "parquet"}]
    scan, aggregate = body["stages"]
    assert (scan["state"], scan["progress"]) == ("committed", {"admitted": 3, "parallelism": 3})
    assert (aggregate["state"], aggregate["progress"]) == ("running", {"admitted": 1, "parallelism": 2})
    assert scan["restarts"] == [{"subtask": 2, "attempt": 1, "target": "local-a", "node": "local-a",
                                 "state": "FINISHED", "cause": None}]
    assert [e["event"] for e in scan["events"]] == ["block_node", "cancel"]
    assert body["done"] is False and body["all_committed"] is False
    assert "do-not-leak" not in json.dumps(body)  # the plan's commands/env stay on the server


def test_stage_endpoint_has_attempts_metrics_and_blocked_nodes(store: Path):
    client = _app(store, authorized=True)
    body = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "group.scan"}).json()
    assert body["stage"] == "scan" and body["done"] is True
    slow = body["subtasks"][1]
    assert [(a["state"], a["speculative"], a["admitted"], a["node"]) for a in slow["attempts"]] == [
        ("CANCELED", False, False, "local-b"), ("FINISHED", True, True, "local-a")]
    assert (body["numEffectiveSpeculativeExecutions"], body["numSlowExecutionVertices"]) == (1, 0)
    assert body["baseline_seconds"] == 45.0
    assert [(b["node"], b["expired"]) for b in body["blocked"]] == [("local-b", False)]
    assert body["window"] == {"start": T0, "end": T0 + 95}

    live = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "aggregate"}).json()
    running = live["subtasks"][1]["attempts"][0]
    assert (running["state"], running["live"], running["spark_ui"]) == ("RUNNING", True, "http://10.1.2.3:4041/")
    assert live["done"] is False

    missing = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "report"})
    assert missing.status_code == 404 and "no speculative stage" in missing.json()["detail"]["message"]
    assert missing.json()["detail"]["done"] is False  # no DB here: the page keeps waiting for the stage
    assert client.get("/api/run", params={"dag_id": DAG, "run_id": "other"}).status_code == 404


def test_pages_and_assets_are_served(store: Path):
    client = _app(store, authorized=True)
    page = client.get("/ui/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "scan"})
    assert page.status_code == 200 and 'data-page="stage"' in page.text
    assert 'data-page="run"' in client.get("/ui/run", params={"dag_id": DAG, "run_id": RUN}).text
    script = client.get("/static/speculative.js")
    assert script.status_code == 200 and "../api/stage?" in script.text
    assert client.get("/static/icon.svg").status_code == 200


def test_spark_history_link_needs_a_configured_server(store: Path, monkeypatch: pytest.MonkeyPatch):
    from airflow_provider_speculative.links import SparkHistoryLink, StageViewLink

    client = _app(store, authorized=True)
    key = SimpleNamespace(dag_id=DAG, run_id=RUN, task_id="scan")
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "scan"}
    monkeypatch.delenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", raising=False)
    assert SparkHistoryLink().get_link(None, ti_key=key) == ""
    assert client.get("/ui/spark", params=params).status_code == 404

    monkeypatch.setenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", "http://history:18080/")
    link = SparkHistoryLink().get_link(None, ti_key=key)
    assert link.startswith("/speculative/ui/spark?") and "run_id=manual__2026-03-01T00%3A00%3A00%2B00%3A00" in link
    page = client.get("/ui/spark", params=params, follow_redirects=False)
    assert page.status_code == 200 and page.text.count("http://history:18080/") == 3  # one per admitted attempt
    # Each link is the admitted attempt's own application, never the history server's front page.
    for subtask, number in ((0, 0), (1, 1), (2, 1)):
        assert f"http://history:18080/history/app-scan-{subtask}-{number}/" in page.text
    agg = client.get("/ui/spark", params={**params, "task_id": "aggregate"}, follow_redirects=False)
    assert agg.status_code == 307 and agg.headers["location"].startswith("http://history:18080/history/app-aggregate-")

    stage_link = StageViewLink().get_link(None, ti_key=key)
    assert stage_link.startswith("/speculative/ui/stage?dag_id=spec_ui&run_id=")


def test_plugin_is_registered_through_the_entry_point():
    from importlib.metadata import entry_points

    from airflow.plugins_manager import is_valid_plugin

    (ep,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "speculative"]
    plugin_class = ep.load()
    assert is_valid_plugin(plugin_class)
    plugin = plugin_class()
    views = {v["destination"]: v for v in plugin.external_views}
    assert views["dag_run"]["href"] == "/speculative/ui/run?dag_id={DAG_ID}&run_id={RUN_ID}"
    assert views["task_instance"]["href"].endswith("task_id={TASK_ID}")
    assert all(v["url_route"] for v in views.values())
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/speculative"

    from airflow_provider_speculative.operators.stage import SparkStageOperator
    from airflow_provider_speculative.provider_info import get_provider_info

    # Links are declared by the provider (for deserialisation) and on the operator, not by the plugin.
    declared = get_provider_info()["extra-links"]
    assert {f"{type(link).__module__}.{type(link).__name__}" for link in SparkStageOperator.operator_extra_links} \
        == set(declared)
    assert get_provider_info()["plugins"][0]["plugin-class"] == f"{ep.module}.{ep.attr}"


def test_drop_in_file_does_not_register_the_plugin_twice():
    import runpy

    namespace = runpy.run_path(str(Path(__file__).resolve().parents[3] / "plugins" / "speculative_plugin.py"))
    assert "SpeculativePlugin" not in namespace  # the entry point already registers it


def test_an_attempt_on_another_host_is_running_while_it_beats(store: Path):
    """Liveness from heartbeat age: a pid unknown to the api-server's host does not make the attempt failed."""
    aggregate = StageLayout(store, DAG, RUN, "aggregate")
    now = time.time()
    _write(aggregate.status(1, 0), {"deploying_at": now - 50, "alive_at": now - 4, "node": "worker-7",
                                    "pid": 999_999_999, "pgid": 999_999_999, "host": "worker-7"})
    _write(aggregate.heartbeat(1, 0), {"phase": "RUNNING", "node": "worker-7", "at": now - 2})
    client = _app(store, authorized=True)
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "aggregate"}
    running = client.get("/api/stage", params=params).json()["subtasks"][1]["attempts"][0]
    assert (running["state"], running["live"]) == ("RUNNING", True)
    assert 1.5 < running["heartbeat_age"] < 30

    # Silent for longer than the threshold: presumed lost.
    _write(aggregate.status(1, 0), {"deploying_at": now - 90, "alive_at": now - 60, "node": "worker-7",
                                    "pid": 999_999_999, "pgid": 999_999_999, "host": "worker-7"})
    _write(aggregate.heartbeat(1, 0), {"phase": "RUNNING", "node": "worker-7", "at": now - 45})
    lost = client.get("/api/stage", params=params).json()["subtasks"][1]["attempts"][0]
    assert (lost["state"], lost["cause"]) == ("FAILED", "presumed lost: no heartbeat for 30 s")


def test_stage_view_carries_the_gc_expiry_marker(store: Path):
    scan = StageLayout(store, DAG, RUN, "scan")
    _write(scan.committed, {"committed_at": T0 + 100, "subtasks": {"0": {"attempt": 0}, "1": {"attempt": 1}}})
    _write(scan.dir / "expired.json", {"at": T0 + 90_000, "committed_at": T0 + 100, "reason": "retention passed",
                                       "attempts": {"0": 0, "1": 1}})
    client = _app(store, authorized=True)
    body = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "scan"}).json()
    assert body["expired"]["at"] == T0 + 90_000 and body["expired"]["attempts"] == {"0": 0, "1": 1}
    run = client.get("/api/run", params={"dag_id": DAG, "run_id": RUN}).json()
    assert run["stages"][0]["expired"] is not None and run["stages"][1]["expired"] is None
    assert "Results expired" in client.get("/static/speculative.js").text


def test_stage_view_shows_live_slots_per_target_and_a_wait(store: Path):
    aggregate = StageLayout(store, DAG, RUN, "aggregate")
    _write(aggregate.summary, {"speculation": "on", "blocked_nodes": {},
                               "slots": {"cluster": {"live": True, "capacity": 2, "held": 2, "free": 0, "reason": "",
                                                     "nodes": ["h1", "h2"], "checked_at": T0}},
                               "slot_status": "waiting for a free slot on targets cluster (held by running attempts)",
                               "lost_nodes": {"h3": "worker left the master's alive list (state DEAD)"}})
    client = _app(store, authorized=True)
    body = client.get("/api/stage", params={"dag_id": DAG, "run_id": RUN, "task_id": "aggregate"}).json()
    assert body["slots"]["cluster"]["free"] == 0 and body["slots"]["cluster"]["nodes"] == ["h1", "h2"]
    assert body["slot_status"].startswith("waiting for a free slot") and list(body["lost_nodes"]) == ["h3"]
    # The stage page renders them (a Slots table and the waiting message).
    script = client.get("/static/speculative.js").text
    assert 'id: "slots"' in script and 'id: "slot-status"' in script


def test_log_endpoint_serves_the_tail_of_an_attempt_log(store: Path):
    client = _app(store, authorized=True)
    scan = StageLayout(store, DAG, RUN, "scan")
    scan.log(2, 0).write_text("".join(f"line {i}\n" for i in range(5000)) + "Traceback: boom\n")
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "scan", "subtask": 2, "attempt": 0, "tail_bytes": 1000}
    body = client.get("/api/log", params=params).json()
    assert body["text"].endswith("Traceback: boom\n") and body["text"].startswith("line ")  # whole lines only
    assert body["truncated"] is True and len(body["text"]) <= 1000 and body["size"] > 1000
    # Relative to the store: no absolute path of the api-server's host.
    assert body["path"].startswith("spec_ui/") and body["path"].endswith("/scan/subtask=2/attempt=0/spark-submit.log")
    assert body["ended"] is True and body["done"] is True
    # Default attempt: the subtask's latest (attempt 1 wrote no log: it says so instead of failing).
    latest = client.get("/api/log", params={k: v for k, v in params.items() if k != "attempt"}).json()
    assert (latest["attempt"], latest["exists"], latest["text"]) == (1, False, "")
    # A live attempt: not done, so the page keeps polling.
    live = client.get("/api/log", params={**params, "task_id": "aggregate", "subtask": 1, "attempt": 0}).json()
    assert live["done"] is False and "SparkUI" in live["text"]


@pytest.mark.parametrize(("extra", "status", "words"), [
    ({"subtask": 7}, 404, "no subtask 7"),
    ({"subtask": -1}, 404, "no subtask -1"),
    ({"subtask": 2, "attempt": 9}, 404, "no attempt 9 (attempts: 0, 1)"),
    ({"subtask": 2, "tail_bytes": 0}, 422, "max_bytes"),
    ({"subtask": 2, "tail_bytes": 10**9}, 422, "max_bytes"),
    ({"subtask": 0, "task_id": "nope"}, 404, "no speculative stage"),
])
def test_log_endpoint_names_what_is_missing(store: Path, extra: dict[str, Any], status: int, words: str):
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "scan", **extra}
    response = _app(store, authorized=True).get("/api/log", params=params)
    assert response.status_code == status, response.text
    assert words in response.text


def _rerun_store(store: Path) -> None:
    """The fixture's plans as planning writes them, with what a rerun reads (config, max_parallelism)."""
    for stage in ("scan", "aggregate"):
        layout = StageLayout(store, DAG, RUN, stage)
        plan = json.loads(layout.plan.read_text())
        _write(layout.plan, {**plan, "config": {"failover_strategy": "region"},
                             "max_parallelism": plan["parallelism"]})


def test_rerun_endpoint_previews_then_invalidates_the_region(store: Path, monkeypatch: pytest.MonkeyPatch):
    _rerun_store(store)
    cleared: list[list[str]] = []
    monkeypatch.setattr("airflow_provider_speculative.control.rerun.clear_stage_tasks",
                        lambda dag_id, run_id, stages, **audit: cleared.append(stages) or {s: s for s in stages})
    client = _app(store, authorized=True)
    url = "/api/rerun?" + urlencode({"dag_id": DAG, "run_id": RUN, "task_id": "group.scan"})
    preview = client.post(url, json={"subtasks": [1]})  # dry_run is the default
    assert preview.status_code == 200, preview.text
    body = preview.json()
    assert body["dry_run"] is True and body["requested"] == {"scan": [1]}
    assert body["region"] == {"scan": [1], "aggregate": [0, 1]} and body["downstream"] == {"aggregate": [0, 1]}
    scan = StageLayout(store, DAG, RUN, "scan")
    assert scan.committed.is_file() and cleared == []  # a preview changes nothing

    done = client.post(url, json={"subtasks": [1], "dry_run": False}).json()
    assert done["cleared_tasks"] == ["aggregate", "scan"] and cleared == [["scan", "aggregate"]]
    assert done["invalidated"] == {"scan": [1], "aggregate": [0]}
    assert not scan.committed.exists() and not scan.admitted(1).exists() and scan.admitted(0).exists()
    events = [json.loads(line) for line in scan.journal.read_text().splitlines()]
    assert events[-1]["event"] == "rerun_invalidated" and events[-1]["reason"] == "rerun from the UI by an unnamed user"


@pytest.mark.parametrize(("body", "headers", "status", "words"), [
    ('{"subtasks": [1]}', {"Content-Type": "text/plain"}, 415, "application/json"),
    ("subtasks=1", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ('{"subtasks": [1]}', {"Content-Type": "application/json", "Origin": "https://evil.example"}, 403,
     "cross-origin rerun refused"),
    ('{"subtasks": [7]}', {"Content-Type": "application/json"}, 422, "no subtask [7]"),
    ('{"subtasks": [1], "force": true}', {"Content-Type": "application/json"}, 422, "force"),
    ('{"subtasks": "1"}', {"Content-Type": "application/json"}, 422, "subtasks"),
    ('{"subtasks": [NaN]}', {"Content-Type": "application/json"}, 422, "subtasks"),
    ('{"subtasks": [Infinity], "dry_run": false}', {"Content-Type": "application/json"}, 422, "subtasks"),
    ('{"subtasks": [' + "1," * 600_000 + '1]}', {"Content-Type": "application/json"}, 413, "at most 1048576 bytes"),
])
def test_rerun_endpoint_refuses_cross_site_and_bad_requests(store: Path, body: str, headers: dict[str, str],
                                                            status: int, words: str):
    _rerun_store(store)
    response = _app(store, authorized=True).post(
        "/api/rerun?" + urlencode({"dag_id": DAG, "run_id": RUN, "task_id": "scan"}), content=body, headers=headers)
    assert response.status_code == status, response.text
    assert words in response.text
    assert StageLayout(store, DAG, RUN, "scan").committed.is_file()  # nothing was invalidated


def test_rerun_endpoint_accepts_its_own_origin_and_needs_credentials(store: Path):
    _rerun_store(store)
    url = "/api/rerun?" + urlencode({"dag_id": DAG, "run_id": RUN, "task_id": "scan"})
    same = _app(store, authorized=True).post(url, json={}, headers={"Origin": "http://testserver"})
    assert same.status_code == 200 and same.json()["region"]["scan"] == [0, 1, 2]
    assert _app(store, authorized=False).post(url, json={}).status_code == 401


def test_the_whole_log_downloads_as_plain_text(store: Path):
    client = _app(store, authorized=True)
    scan = StageLayout(store, DAG, RUN, "scan")
    scan.log(2, 0).write_text("<script>alert(1)</script>\n" + "x" * 300_000)
    params = {"dag_id": DAG, "run_id": RUN, "task_id": "scan", "subtask": 2, "attempt": 0}
    response = client.get("/api/log/download", params=params)
    assert response.status_code == 200 and len(response.content) == scan.log(2, 0).stat().st_size
    assert response.headers["content-type"].startswith("text/plain")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert 'attachment; filename="spec_ui-scan-subtask2-attempt0.log"' == response.headers["content-disposition"]
    missing = client.get("/api/log/download", params={**params, "attempt": 1})
    assert missing.status_code == 404 and "has written no log yet" in missing.text
    assert _app(store, authorized=False).get("/api/log/download", params=params).status_code == 401


def _on_s3(root: Path) -> Any:
    """The store at ``root`` copied, object by object, into an in-memory store for an S3 root URL, in the cache."""
    from airflow_provider_speculative.store import roots
    from tests.unit.store.memory import MemoryBackend

    memory = MemoryBackend("s3://lake/speculative")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if path.name == "_owner.json":  # claimed by this store, as on POSIX
            memory.claim(path.parent.relative_to(root).as_posix() if path.parent != root else "")
        elif path.name == "journal.jsonl":  # on S3 a journal is one object per record
            for line in path.read_text().splitlines():
                memory.append_record(name, json.loads(line))
        else:
            memory.replace(name, path.read_bytes())
    roots.install_store(memory)
    return memory


def test_the_views_of_an_s3_root_are_the_views_of_the_same_posix_store(store: Path) -> None:
    from airflow_provider_speculative.store import roots

    memory = _on_s3(store)
    try:
        posix, s3 = _app(store, authorized=True), _app(memory, authorized=True)
        run = {"dag_id": DAG, "run_id": RUN}
        assert s3.get("/api/run", params=run).json()["stages"] == posix.get("/api/run", params=run).json()["stages"]
        for task in ("scan", "aggregate"):
            on_posix = posix.get("/api/stage", params={**run, "task_id": task}).json()
            on_s3 = s3.get("/api/stage", params={**run, "task_id": task}).json()
            # Attempt logs are local files: the driver's UI link read from one is not shown from S3. A live
            # attempt's age is measured at each request.
            for attempt in (a for view in (on_posix, on_s3) for s in view["subtasks"] for a in s["attempts"]):
                attempt["spark_ui"] = None
                if attempt["live"]:
                    attempt["duration"] = attempt["heartbeat_age"] = None
            assert {k: v for k, v in on_s3.items() if k != "now"} == {k: v for k, v in on_posix.items() if k != "now"}
        assert s3.get("/api/run", params={**run, "run_id": "other"}).status_code == 404
    finally:
        roots.forget_stores()
