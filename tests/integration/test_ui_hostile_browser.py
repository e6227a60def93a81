"""A hostile plan in the store, rendered by the stage view in real Chromium: no script runs, no script link.

No Spark and no api-server: the plugin's own FastAPI app is served by uvicorn in a thread on a socket
this test binds, with Airflow's access check replaced (test_ui_plugin.py covers auth in the real server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.plugin_app import served_plugin
from tests.unit.plugin.test_plugin_hostile import DAG, EVIL, PARAMS, RUN, hostile_store

pytestmark = [pytest.mark.timeout(60)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCRIPT_TEXT = "<img src=x onerror=alert(2)><script>alert(3)</script>"


@pytest.fixture(scope="module")
def plugin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The plugin app on a hostile store, served on a socket that listens before the server thread starts."""


    root = hostile_store(tmp_path_factory.mktemp("hostile-store"), history=EVIL, app_id=SCRIPT_TEXT)
    layout = StageLayout(root, DAG, RUN, "scan")
    # Strings DAG authors and attempts control, shown as text: a node name and a failure cause.
    claim = json.loads(layout.claim(0, 0).read_text())
    atomic_write_json(layout.claim(0, 0), {**claim, "node": SCRIPT_TEXT, "reason": SCRIPT_TEXT})
    atomic_write_json(layout.committed, {"subtasks": {"0": {"attempt": 0}}, "sink": None})
    layout.log(0, 0).write_text(f"INFO starting\n{SCRIPT_TEXT}\n</pre>{SCRIPT_TEXT}\nERROR the end\n")
    with served_plugin(root, backlog=16) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's chromium driven by Playwright), started once for the module."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` (apt-get install -y chromium chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page that records every dialog and console message."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.dialogs = []  # type: ignore[attr-defined]
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        # The page must work under its own policy: a violation would mean the CSP breaks the view.
        page.console = []  # type: ignore[attr-defined]
        page.on("console", lambda m: page.console.append(m.text))
        yield page
    finally:
        context.close()


def _links(page: Any) -> list[str]:
    return page.eval_on_selector_all("a", "els => els.map(e => e.getAttribute('href'))")


def _assert_harmless(page: Any) -> None:
    assert page.dialogs == [], page.dialogs
    assert not [m for m in page.console if "Content Security Policy" in m], page.console
    hrefs = _links(page)
    assert hrefs and all(h.startswith(("http://", "https://", "run?", "stage?", "log?")) for h in hrefs), hrefs
    assert page.locator("a[href^='javascript' i], a[href^='data' i]").count() == 0
    assert page.locator("img, script:not([src])").count() == 0  # the hostile text stayed text


def test_stage_view_of_a_hostile_plan_runs_no_script(plugin_url: str, page: Any):
    # The recorder works: a dialog opened from outside the page is seen (and dismissed).
    page.goto("about:blank")
    page.evaluate("() => alert('probe')")
    assert page.dialogs == ["probe"]
    page.dialogs.clear()

    response = page.goto(f"{plugin_url}/ui/stage?{urlencode(PARAMS)}")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.locator("body[data-done='true']").wait_for(state="attached")
    row = page.locator("#attempts .attempt-row[data-subtask='0']")
    assert row.count() == 1 and SCRIPT_TEXT in row.inner_text()  # rendered, as text
    # The hostile history URL gave no link at all; the only link is the attempt's log page.
    assert [row.locator("a").nth(i).inner_text() for i in range(row.locator("a").count())] == ["log"]
    _assert_harmless(page)


def test_attempt_log_page_shows_a_hostile_log_as_text(plugin_url: str, page: Any):
    page.goto(f"{plugin_url}/ui/stage?{urlencode(PARAMS)}")
    page.locator("body[data-done='true']").wait_for(state="attached")
    page.locator("#attempts .attempt-row[data-subtask='0'] a.log-link").click()
    page.locator("body[data-page='log'][data-done='true']").wait_for(state="attached")
    text = page.locator("#log-text").inner_text()
    assert text.startswith("INFO starting") and text.count(SCRIPT_TEXT) == 2 and text.rstrip().endswith("the end")
    assert "scan/subtask=0/attempt=0/spark-submit.log" in page.locator("#log-path").inner_text()
    _assert_harmless(page)


def test_stage_view_drops_a_script_url_even_if_the_server_sent_one(plugin_url: str, page: Any):
    """The page's own check, should a future server bug (or a proxy) put a javascript: URL in the JSON."""
    def tamper(route: Any) -> None:
        body = route.fetch().json()
        for sub in body["subtasks"]:
            for attempt in sub["attempts"]:
                attempt["spark_history"] = EVIL
                attempt["spark_ui"] = " JavaScript:alert(4)"
        route.fulfill(json=body)

    page.route("**/api/stage?*", tamper)
    page.goto(f"{plugin_url}/ui/stage?{urlencode(PARAMS)}")
    page.locator("body[data-done='true']").wait_for(state="attached")
    assert page.locator("#attempts .attempt-row").count() == 1
    _assert_harmless(page)
