"""The UI plugin in a real api-server, driven by headless Chromium.

Reuses the finished ``spec_q1`` run that test_speculation_spark.py leaves in the session's store (this
module sorts after it); run alone, it makes that run itself with one dag.test() (real Spark, minutes).
The api-server gets a private AIRFLOW_HOME, a free port and SimpleAuthManager users with known
passwords, and reads the session's metadata DB, so Airflow's own DAG-run and task pages load too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pendulum
import psutil
import pytest

from airflow_provider_speculative.devtools.faults import injected
from airflow_provider_speculative.store.files import atomic_write_json, read_json, read_jsonl
from airflow_provider_speculative.store.layout import StageLayout
from tests.conftest import REPO, TEST_ENV
from tests.integration.dag_faults import SPEC_Q1
from tests.integration.spark_helpers import HERE, load_dag, wait_for
from tests.processes import free_port

pytestmark = [pytest.mark.timeout(1800)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "test-artifacts"
STORE = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
# tester reads; editor may also clear task instances (a rerun); outsider has no role, no DAG access.
USERS = {"tester": ("viewer", "tester-pass"), "editor": ("user", "editor-pass"), "outsider": ("", "outsider-pass")}
HISTORY = TEST_ENV["AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL"]  # the session sets it, as a deployment would
STARTUP_TIMEOUT = 300  # the api-server imports all of Airflow; slow on a loaded 2-CPU machine
PAGE_TIMEOUT_MS = 180_000


# -- a finished run ------------------------------------------------------------------------------


def _finished_spec_q1_run() -> str | None:
    """run_id of a spec_q1 run in the session store whose stages are committed and that has a speculative attempt."""
    base = STORE / "spec_q1"
    for run_dir in sorted(base.iterdir()) if base.is_dir() else []:
        plans = {p.parent.name: read_json(p) for p in run_dir.glob("*/plan.json")}
        if set(plans) != {"scan", "aggregate"} or not all((run_dir / s / "committed.json").is_file() for s in plans):
            continue
        run_id = plans["scan"]["run_id"]
        scan = StageLayout(STORE, "spec_q1", run_id, "scan")
        if any((read_json(scan.claim(s, n)) or {}).get("speculative")
               for s in range(plans["scan"]["parallelism"]) for n in scan.attempt_numbers(s)):
            return run_id
    return None


@pytest.fixture(scope="module")
def finished_run(airflow_db: Path, request: pytest.FixtureRequest) -> str:
    """The finished spec_q1 run: the one test_speculation_spark.py made, else one made here."""
    run_id = _finished_spec_q1_run()
    if run_id is None:
        request.getfixturevalue("tpch_data")
        dag = load_dag("spec_q1", HERE / "dags")
        # Not 2026-03-01: a failed earlier run may hold that logical date in the session's DB.
        with injected(SPEC_Q1):
            run = dag.test(logical_date=pendulum.datetime(2026, 3, 2, tz="UTC"))
        assert run.state == "success"
        run_id = _finished_spec_q1_run()
        assert run_id == run.run_id, "dag.test() finished but left no run with a speculative attempt"
    return run_id


# -- the api-server ------------------------------------------------------------------------------


class ApiServer:
    """A running ``airflow api-server`` subprocess with its base URL and log."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "api-server.log"
        passwords = home / "passwords.json"
        passwords.write_text(json.dumps({user: password for user, (_, password) in USERS.items()}))
        self.env = {
            **os.environ, **TEST_ENV,
            "AIRFLOW_HOME": str(home),
            # The session's DB: dag.test() recorded the run and the serialized DAG there.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{Path(TEST_ENV['AIRFLOW_HOME']) / 'airflow.db'}",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, (r, _) in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "speculative-ui-test-secret-0123456789abcdef",
            "AIRFLOW__METRICS__STATSD_ON": "False",
            "AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL": HISTORY,
        }
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), "api-server", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, cwd=home)

    def tail(self, lines: int = 60) -> str:
        """The end of the server's log, for failure messages."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def healthy(self) -> bool:
        """True once the server answers its health endpoint; fails fast if the process died."""
        if self.proc.poll() is not None:
            raise AssertionError(f"api-server exited with {self.proc.returncode}:\n{self.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200
        return False

    def token(self, user: str) -> str:
        """A JWT for ``user`` from the auth manager's token endpoint."""
        response = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": USERS[user][1]},
                              timeout=60)
        response.raise_for_status()
        return response.json()["access_token"]

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after a grace period)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def api_server(finished_run: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """The api-server with the plugin, serving the session's store and DB."""
    server = ApiServer(tmp_path_factory.mktemp("api-server-home"))
    try:
        wait_for(server.healthy, STARTUP_TIMEOUT, f"the api-server on {server.url}\n(log: {server.log})")
        yield server
    finally:
        server.stop()


def _get(server: ApiServer, path: str, token: str | None = None, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}{path}", params=params or None, headers=headers, timeout=60,
                     follow_redirects=False)


# -- the API through the real server -------------------------------------------------------------


def test_endpoints_refuse_requests_without_dag_access(api_server: ApiServer, finished_run: str):
    params = {"dag_id": "spec_q1", "run_id": finished_run}
    for path in ("/speculative/api/run", "/speculative/api/stage"):
        query = {**params, "task_id": "scan"} if path.endswith("stage") else params
        assert _get(api_server, path, **query).status_code == 401
        assert _get(api_server, path, "not-a-jwt", **query).status_code == 403
        assert _get(api_server, path, api_server.token("outsider"), **query).status_code == 403
    # A browser without a session is sent to the login page and back.
    page = httpx.get(f"{api_server.url}/speculative/ui/run", params=params, headers={"Accept": "text/html"},
                     timeout=60, follow_redirects=False)
    assert page.status_code == 307 and "/auth/login?next=" in page.headers["location"]


def test_endpoints_serve_the_run_to_a_dag_reader(api_server: ApiServer, finished_run: str):
    token = api_server.token("tester")
    run = _get(api_server, "/speculative/api/run", token, dag_id="spec_q1", run_id=finished_run).json()
    assert [s["stage"] for s in run["stages"]] == ["scan", "aggregate"]
    assert run["edges"] == [{"from": "scan", "to": "aggregate", "input": "partials", "distribution": "all_to_all",
                             "mode": "blocking"}]
    assert run["run_state"] == "success" and run["done"] is True
    assert [s["progress"] for s in run["stages"]] == [{"admitted": 3, "parallelism": 3},
                                                      {"admitted": 1, "parallelism": 1}]

    stage = _get(api_server, "/speculative/api/stage", token, dag_id="spec_q1", run_id=finished_run,
                 task_id="scan").json()
    attempts = [a for s in stage["subtasks"] for a in s["attempts"]]
    assert sum(a["admitted"] for a in attempts) == 3 and any(a["speculative"] for a in attempts)
    assert stage["baseline_seconds"] > 0 and "local-b" in {b["node"] for b in stage["blocked"]}
    # History links name each admitted attempt's own Spark application (recorded by its heartbeat).
    assert all(a["app_id"] for a in attempts if a["admitted"])
    assert all(a["spark_history"] == f"{HISTORY}/history/{a['app_id']}/" for a in attempts if a["admitted"])

    # Airflow's extra-links API computes the plugin's links for the stage task.
    links = _get(api_server, f"/api/v2/dags/spec_q1/dagRuns/{quote(finished_run, safe='')}/taskInstances/scan/links",
                 token).json()["extra_links"]
    stage_link = links["Speculative stage view"]
    assert stage_link.startswith("/speculative/ui/stage?dag_id=spec_q1&run_id=") and stage_link.endswith("task_id=scan")
    assert links["Spark history (admitted attempts)"].startswith("/speculative/ui/spark?")
    assert _get(api_server, stage_link, token).status_code == 200
    history = _get(api_server, links["Spark history (admitted attempts)"], token)
    assert history.status_code == 200 and history.text.count(HISTORY) == 3

    plugins = _get(api_server, "/api/v2/plugins", token).json()["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "speculative"]
    assert {v["destination"] for v in ours["external_views"]} == {"dag_run", "task_instance"}


# -- the views in Chromium -----------------------------------------------------------------------


def _login(page: Any, server: ApiServer, user: str) -> None:
    page.goto(f"{server.url}/auth/login")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(USERS[user][1])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


@pytest.fixture(scope="module")
def browser_page(api_server: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A logged-in headless Chromium page (the system browser, driven by Playwright)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium "
                    "(`make browser`, or apt-get install -y chromium chromium-driver)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000},
            # Playwright's wait_for_function evaluates a string in the page, which the plugin's strict CSP
            # forbids; the CSP itself is tested in test_ui_hostile_browser.py.
            bypass_csp=True)
        try:
            page = context.new_page()
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            _login(page, api_server, "tester")
            assert "_token" in {c["name"] for c in context.cookies()}
            yield page
        finally:
            context.close()


def test_run_view_in_the_dag_run_tab(api_server: ApiServer, finished_run: str, browser_page: Any):
    page = browser_page
    page.goto(f"{api_server.url}/dags/spec_q1/runs/{quote(finished_run, safe='')}")
    page.get_by_text("Speculative stages", exact=True).first.click()  # the plugin's tab, as a user finds it
    page.wait_for_url(lambda url: url.endswith("/plugin/speculative-run"))
    view = page.frame_locator("iframe[title='Speculative stages']")
    view.locator("body[data-done='true']").wait_for(state="attached")
    rows = view.locator("#stages .stage-row")
    assert rows.count() == 2
    assert rows.nth(0).locator("td").all_text_contents()[:3] == ["scan", "committed", "3 / 3"]
    assert "all_to_all · blocking" in view.locator("#stage-graph").inner_text()
    assert view.locator("#stage-graph [data-stage='aggregate']").count() == 1
    assert "auto-refresh stopped" in view.locator("#live").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui-run-view.png"))


def test_stage_view_in_the_task_instance_tab(api_server: ApiServer, finished_run: str, browser_page: Any):
    page = browser_page
    page.goto(f"{api_server.url}/dags/spec_q1/runs/{quote(finished_run, safe='')}/tasks/scan/plugin/speculative-stage")
    view = page.frame_locator("iframe[title='Speculative stage']")
    view.locator("body[data-done='true']").wait_for(state="attached")
    summary = read_json(StageLayout(STORE, "spec_q1", finished_run, "scan").summary)

    assert view.locator(".subtask-row").count() == 3
    assert view.locator(".attempt.admitted .badge-admitted").count() == 3  # one admitted attempt per subtask
    speculative = view.locator(".attempt.speculative")
    assert speculative.count() >= 1 and speculative.first.locator(".badge-spec").inner_text() == "speculative"
    assert view.locator(".attempt.CANCELED").count() >= 1  # the loser of the race, drawn as cancelled
    # Every admitted attempt shows where its time went, and the stage its medians (core/breakdown.py).
    assert view.locator(".phase-spark").count() >= 3 and view.locator(".phase-start").count() >= 3
    assert view.locator("#breakdown-line").inner_text().startswith("time per admitted attempt (median of 3, s):")
    for metric, words in (("numSlowExecutionVertices", "slow subtasks now"),
                          ("numEffectiveSpeculativeExecutions", "copies that won")):
        card = view.locator(f"#metric-{metric}")
        assert card.inner_text().splitlines() == [words, str(summary[metric])]
        assert metric in (card.get_attribute("title") or "")  # Flink's name stays in the tooltip
    assert "slow-task baseline" in view.locator("#metric-baseline").inner_text()
    assert view.locator("#blocked-nodes tr[data-node='local-b']").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui-stage-view.png"))
    # The whole view, outside Airflow's fixed-height frame (the same page the tab embeds).
    page.goto(f"{api_server.url}/speculative/ui/stage?dag_id=spec_q1&run_id={quote(finished_run, safe='')}"
              "&task_id=scan")
    page.locator("body[data-done='true']").wait_for(state="attached")
    page.screenshot(path=str(ARTIFACTS / "ui-stage-view-full.png"), full_page=True)


def _live_stage(root: Path, status: dict[str, Any]) -> StageLayout:
    """A one-subtask stage in the api-server's store whose attempt 0 is this test process (so it is alive)."""
    layout = StageLayout(root, "ui_live_probe", "live-run", "scan")
    atomic_write_json(layout.plan, {"stage": "scan", "store_root": str(root), "parallelism": 1, "upstreams": [],
                                    "consumers": [], "subtasks": [{"inputs": {}}]})
    atomic_write_json(layout.claim(0, 0), {"target": "local-a", "node": "local-a", "speculative": False,
                                           "reason": "initial attempt", "created_at": time.time()})
    atomic_write_json(layout.heartbeat(0, 0), {"phase": "RUNNING", "node": "local-a", "at": time.time()})
    atomic_write_json(layout.status(0, 0), status)
    return layout


def test_stage_view_refreshes_while_the_stage_runs(api_server: ApiServer, browser_page: Any):
    me = psutil.Process()
    layout = _live_stage(STORE, {"pid": me.pid, "create_time": me.create_time(), "deploying_at": time.time()})
    page = browser_page
    page.goto(f"{api_server.url}/speculative/ui/stage?dag_id=ui_live_probe&run_id=live-run&task_id=scan")
    page.wait_for_function("Number(document.body.dataset.refreshes || 0) >= 2")  # polled without a reload
    assert page.locator(".attempt[data-attempt='0']").get_attribute("data-state") == "RUNNING"
    assert page.locator("#live").get_attribute("data-state") == "live"

    # The attempt finishes and finalize commits it: the open page shows it and stops polling.
    status = read_json(layout.status(0, 0))
    atomic_write_json(layout.status(0, 0), {**status, "state": "FINISHED", "end_at": time.time(), "exit_code": 0})
    atomic_write_json(layout.admitted(0), {"attempt": 0})
    atomic_write_json(layout.committed, {"subtasks": {}})
    page.locator("body[data-done='true']").wait_for(state="attached")
    assert page.locator(".attempt[data-attempt='0']").get_attribute("data-admitted") == "true"
    assert page.locator("#stage-state").text_content() == "committed"
    refreshes = page.evaluate("document.body.dataset.refreshes")
    with pytest.raises(Exception, match="Timeout"):  # nothing polls any more
        page.wait_for_function(f"Number(document.body.dataset.refreshes) > {refreshes}", timeout=5_000)


# -- rerun from the stage view (last: it clears the finished run's tasks) -------------------------


def _rerun(server: ApiServer, run_id: str, token: str | None, body: dict[str, Any],
           headers: dict[str, str] | None = None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.url}/speculative/api/rerun", params={"dag_id": "spec_q1", "run_id": run_id,
                                                                     "task_id": "scan"},
                      json=body, headers={**auth, **(headers or {})}, timeout=60)


POLLERS = 45
# Seconds for the median answer of Airflow's own API while the pollers run. Threads blocked on the FIFO
# would leave it unanswered, so this tells a hang from a busy machine; speed is bench/'s to measure.
BOUND = 10.0


def test_45_pollers_of_a_fifo_log_leave_airflows_own_api_answering(api_server: ApiServer, finished_run: str):
    """45 stage pages polling a stage whose attempt log is a FIFO: Airflow's own routes keep answering."""
    import statistics
    import threading

    log = StageLayout(STORE, "spec_q1", finished_run, "scan").log(0, 0)
    original = log.read_bytes()
    log.unlink()
    os.mkfifo(log)  # what a stage application could leave behind (SECURITY.md): never to be opened blocking
    token = api_server.token("tester")
    headers = {"Authorization": f"Bearer {token}"}
    params = {"dag_id": "spec_q1", "run_id": finished_run, "task_id": "scan"}
    stop = threading.Event()
    done = [0] * POLLERS
    bad: list[Any] = []

    def poller(i: int) -> None:
        with httpx.Client(base_url=api_server.url, headers=headers, timeout=60) as client:
            while not stop.is_set():
                stage = client.get("/speculative/api/stage", params=params)
                served = client.get("/speculative/api/log", params={**params, "subtask": 0, "attempt": 0})
                if stage.status_code != 200 or served.status_code != 404:
                    bad.append((stage.status_code, served.status_code, served.text[:200]))
                done[i] += 1
                stop.wait(2.0)  # the stage page's cadence

    threads = [threading.Thread(target=poller, args=(i,), daemon=True) for i in range(POLLERS)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: min(done) >= 1, 120, "every poller answered once")
        timings: dict[str, list[float]] = {"/api/v2/monitor/health": [], "/api/v2/dags/spec_q1": [],
                                           f"/api/v2/dags/spec_q1/dagRuns/{quote(finished_run, safe='')}": []}
        with httpx.Client(base_url=api_server.url, headers=headers, timeout=60) as client:
            for _ in range(10):
                for route, samples in timings.items():
                    started = time.monotonic()
                    response = client.get(route)
                    samples.append(time.monotonic() - started)
                    assert response.status_code == 200, (route, response.status_code, response.text[:200])
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
        log.unlink()
        log.write_bytes(original)
    assert not [t for t in threads if t.is_alive()], "a poller is still blocked"
    assert not bad, bad[:3]  # the FIFO is refused (404), never read
    medians = {route: round(statistics.median(samples), 3) for route, samples in timings.items()}
    slowest = {route: round(max(samples), 3) for route, samples in timings.items()}
    assert all(m < BOUND for m in medians.values()), (medians, slowest, sum(done))


def test_rerun_needs_the_right_to_clear_tasks_and_a_same_origin_request(api_server: ApiServer, finished_run: str):
    assert _rerun(api_server, finished_run, None, {}).status_code == 401
    assert _rerun(api_server, finished_run, api_server.token("tester"), {}).status_code == 403  # a reader only
    editor = api_server.token("editor")
    preview = _rerun(api_server, finished_run, editor, {"subtasks": [0]})
    assert preview.status_code == 200, preview.text
    assert preview.json()["region"] == {"scan": [0], "aggregate": [0]} and preview.json()["dry_run"] is True
    assert _rerun(api_server, finished_run, editor, {"subtasks": [0]},
                  {"Origin": "https://evil.example"}).status_code == 403
    assert (StageLayout(STORE, "spec_q1", finished_run, "scan").committed.is_file())  # a preview changes nothing


def test_rerun_button_reruns_the_chosen_region(api_server: ApiServer, finished_run: str, browser_page: Any):
    scan = StageLayout(STORE, "spec_q1", finished_run, "scan")
    page = browser_page
    # The module's browser is a reader's: sign in again as a user who may clear tasks (one Playwright per process).
    page.context.clear_cookies()
    _login(page, api_server, "editor")
    page.goto(f"{api_server.url}/speculative/ui/stage?dag_id=spec_q1&run_id={quote(finished_run, safe='')}"
              "&task_id=scan")
    page.locator("body[data-done='true']").wait_for(state="attached")
    page.locator("#rerun-subtasks").fill("0, x")
    page.locator("#rerun-preview").click()
    assert "whole numbers" in page.locator("#rerun-error").inner_text()
    page.locator("#rerun-subtasks").fill("2")
    page.locator("#rerun-preview").click()
    region = page.locator("#rerun-region li")
    region.first.wait_for()
    assert region.all_inner_texts() == ["stage scan: subtasks 2 (named)", "stage aggregate: subtasks 0 (downstream)"]
    assert scan.admitted(2).is_file()  # previewed, not done
    page.locator("#rerun-confirm").click()
    done = page.locator("#rerun-done")
    done.wait_for()
    assert "cleared tasks aggregate, scan" in done.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui-rerun.png"))
    # Exactly the region: subtask 2's admission and the stage's commit are withdrawn, the others stay.
    assert not scan.admitted(2).exists() and scan.admitted(0).is_file() and not scan.committed.exists()
    assert read_jsonl(scan.journal)[-1]["reason"] == "rerun from the UI by editor"
    states = _task_states(finished_run)
    assert states["scan"] is None and states["aggregate"] is None  # cleared: the scheduler runs them again
    # Airflow's audit log has the clear, by whom and which subtasks, as Airflow's own Clear records it.
    assert _audit_rows(finished_run) == [("aggregate", "editor", {"stage": "aggregate", "subtasks": [0]}),
                                         ("scan", "editor", {"stage": "scan", "subtasks": [2]})]


def _audit_rows(run_id: str) -> list[tuple[str | None, str | None, Any]]:
    """The run's speculative_rerun rows of Airflow's audit log: task, owner and extra, by task."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Log).where(Log.dag_id == "spec_q1", Log.run_id == run_id,
                                                 Log.event == "speculative_rerun")).all()
        return sorted((row.task_id, row.owner, json.loads(row.extra or "null")) for row in rows)


def _task_states(run_id: str) -> dict[str, str | None]:
    """The run's task instance states in the session's metadata DB (the one the api-server cleared them in)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.state).where(
            TaskInstance.dag_id == "spec_q1", TaskInstance.run_id == run_id)).all()
    return {task: None if state is None else str(state) for task, state in rows}
