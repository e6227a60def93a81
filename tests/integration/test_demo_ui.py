"""`make ui`'s script for real: Airflow starts on a demo-like home, the run view opens in Chromium with the
printed login, and Ctrl-C (SIGINT) stops every process it started, the run's Spark attempts included.

One Airflow start (about a minute on a 2-CPU machine): the lean example DAG small_q1, not tpch_q1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.conftest import DATA, REPO
from tests.integration.airflow_cluster import describe, processes_mentioning, tail, wait_until

pytestmark = [pytest.mark.timeout(1200)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "test-artifacts"
SCRIPT = REPO / "scripts" / "demo_ui.py"


def _port() -> int:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from demo_ui import PORTS, free_port
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return free_port(PORTS)


class Output:
    """The script's stdout, collected by a thread so the test can poll it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)


def test_make_ui_script_serves_the_run_view_and_stops_everything_on_ctrl_c(tmp_path: Path, tpch_data: Path):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` (apt-get install -y chromium chromium-driver)")
    from playwright.sync_api import sync_playwright

    home, store = tmp_path / "airflow", tmp_path / "store"
    # What `make ui` passes: the demo's environment (here with the small test DAG), nothing else of ours.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPECULATIVE_"))}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "integration" / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__SPECULATIVE__STORE_PATH": str(store),
                "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
                "SPECULATIVE_EXAMPLE_DATA": str(DATA), "SPECULATIVE_EXAMPLE_OUTPUT": str(tmp_path / "output")})
    port = _port()
    # One warm-up round, not four: what is tested is that the pool serves the run, not how warm it is.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--port", str(port), "--dag-id", "small_q1",
                             "--logical-date", "2026-06-01T00:00:00+00:00", "--warm-up-rounds", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    out = Output(proc)
    started: set[int] = set()

    def diagnostics() -> str:
        logs = "\n".join(f"===== {p.name}\n{tail(p, 30)}" for p in sorted((home / "ui-logs").glob("*.log")))
        return f"script output:\n{out.text()}\n{logs}"

    try:
        def ready() -> re.Match[str] | None:
            assert proc.poll() is None, f"the script exited with {proc.returncode}\n{diagnostics()}"
            return re.search(r"Run view: +(\S+)\nLogin: +(\S+) / (\S+)", out.text())

        found = wait_until(ready, 600, "the script to print the run view and the login", interval=1,
                           on_timeout=diagnostics)
        url, user, password = found.groups()
        assert url.startswith(f"http://127.0.0.1:{port}/dags/small_q1/runs/")
        assert url.endswith("/plugin/speculative-run")

        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 1000})
            try:
                page = context.new_page()
                page.set_default_timeout(240_000)
                page.goto(f"http://127.0.0.1:{port}/auth/login")
                page.get_by_label("Username").fill(user)
                page.get_by_label("Password").fill(password)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(lambda u: "/auth/login" not in u)
                page.goto(url)
                view = page.frame_locator("iframe[title='Speculative stages']")
                view.locator("#stages .stage-row[data-stage='scan']").wait_for()
                assert view.locator("#live").get_attribute("data-state") == "live"
                # The run is really running: an attempt was launched by the triggerer started by the script.
                wait_until(lambda: list(store.rglob("status.json")), 300, "the first attempt to start",
                           on_timeout=diagnostics)
                # On the script's warm pool, not on spark-submit targets.
                assert "targets: local-a (Spark Connect on port" in out.text()
                claim = json.loads(next(store.rglob("claim.json")).read_text())
                assert claim["kind"] == "spark_connect" and claim["target"] in ("local-a", "local-b"), claim
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "ui-make-ui-run-view.png"))
            finally:
                context.close()

        # Everything the script started, before Ctrl-C: its children (components, their workers) and the
        # attempts, which run in sessions of their own.
        with contextlib.suppress(psutil.NoSuchProcess):
            started = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        started |= {p.pid for p in processes_mentioning(str(tmp_path))}
        assert len(started) >= 4, describe([psutil.Process(p) for p in started if psutil.pid_exists(p)])

        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal delivers to the script
        assert proc.wait(timeout=120) == 0, diagnostics()
        wait_until(lambda: "local-b: stopped" in out.text(), 10, "the script's last lines", interval=0.2)
        assert "stopped Airflow" in out.text() and "local-a: stopped" in out.text()

        def left() -> list[psutil.Process]:
            alive = []
            for pid in started | {p.pid for p in processes_mentioning(str(tmp_path))}:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p)
            return alive

        # The script returned only after its clean-up, so this should hold at once; the short poll absorbs
        # a process still being reaped by init.
        wait_until(lambda: not left(), 15, "every process the script started to be gone", interval=0.5,
                   on_timeout=lambda: describe(left()))
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=120)
        for pid in started:
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        for p in processes_mentioning(str(tmp_path)):
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
