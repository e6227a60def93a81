"""Hostile strings in the store and the configuration never become script: URLs, headers, pages (no Spark)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.urls import http_url_problem, safe_http_url
from airflow_provider_speculative.exceptions import ConfigError, PipelineError
from airflow_provider_speculative.store.layout import StageLayout

DAG, RUN = "hostile", "manual__2026-03-01T00:00:00+00:00"
T0 = 1_800_000_000.0
EVIL = "javascript:alert(1)//x"
STATIC = Path(__file__).resolve().parents[3] / "airflow_provider_speculative" / "plugin" / "static"


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def hostile_store(root: Path, *, history: str = EVIL, app_id: str = "app-1", log_host: str | None = None) -> Path:
    """A committed one-subtask stage whose plan carries ``history`` as its own spark_history_url.

    The plan is written by hand, as an old version or an attacker with store access could: parse-time
    validation never saw it.
    """
    layout = StageLayout(root, DAG, RUN, "scan")
    config = SpeculativeConfig().to_json()
    config["spark_history_url"] = history
    _write(layout.plan, {"stage": "scan", "dag_id": DAG, "run_id": RUN, "store_root": str(root), "parallelism": 2,
                         "upstreams": [], "consumers": [], "inputs": {}, "config": config,
                         "subtasks": [{"inputs": {}}, {"inputs": {}}]})
    _write(layout.claim(0, 0), {"created_at": T0, "node": "n1", "target": "local-a", "speculative": False,
                                "reason": "initial attempt"})
    _write(layout.status(0, 0), {"deploying_at": T0, "node": "n1", "pid": 999_999_999, "pgid": 1,
                                 "state": "FINISHED", "end_at": T0 + 5, "exit_code": 0})
    _write(layout.heartbeat(0, 0), {"phase": "FINISHED", "node": "n1", "at": T0 + 5, "app_id": app_id})
    _write(layout.admitted(0), {"attempt": 0})
    if log_host is not None:  # subtask 1 runs: its log names the driver's Spark UI
        _write(layout.claim(1, 0), {"created_at": T0, "node": "n1", "target": "local-a", "speculative": False})
        import os
        import time

        import psutil
        _write(layout.status(1, 0), {"deploying_at": time.time(), "node": "n1", "pid": os.getpid(), "pgid": 1,
                                     "create_time": psutil.Process().create_time()})
        _write(layout.heartbeat(1, 0), {"phase": "RUNNING", "node": "n1", "at": time.time()})
        layout.log(1, 0).write_text("Successfully started service 'SparkUI' on port 4041.\n"
                                    f"Starting executor ID driver on host {log_host}\n")
    return root


def _client(root: Path, authorized: bool = True) -> TestClient:
    from airflow_provider_speculative.plugin.app import create_app

    app = create_app(store=root)
    if authorized:
        for dependency in app.state.access.values():
            app.dependency_overrides[dependency] = lambda: None
    return TestClient(app)


PARAMS = {"dag_id": DAG, "run_id": RUN, "task_id": "scan"}


# -- the URL check itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://history:18080", "https://h.example/spark/", "http://10.0.0.1:18080/x?y=1"])
def test_http_urls_with_a_host_are_accepted(url: str):
    assert http_url_problem(url) is None and safe_http_url(url) == url


@pytest.mark.parametrize("url", [
    EVIL, "JavaScript:alert(1)", " javascript:alert(1)", "java\tscript:alert(1)", "data:text/html,<script>",
    "vbscript:x", "banana", "/relative/path", "//host/x", "http://", "http:///x", "ftp://h/x", "file:///etc/passwd",
    'http://h/"onmouseover="alert(1)', "http://h/<script>", "http://h:port/", "", None, 42,
])
def test_anything_else_is_not_a_link(url: Any):
    assert http_url_problem(url) is not None and safe_http_url(url) is None


@pytest.mark.parametrize("value", [EVIL, "banana", "data:text/html,x", "http://"])
def test_spark_history_url_is_refused_when_parsed_naming_the_option(value: str):
    with pytest.raises(ConfigError, match=r"\[speculative\] spark_history_url = .*absolute http\(s\) URL"):
        SpeculativeConfig().with_overrides({"spark_history_url": value}, "test")
    assert SpeculativeConfig().with_overrides({"spark_history_url": " http://h:1/ "}, "t").spark_history_url \
        == "http://h:1/"
    assert SpeculativeConfig().with_overrides({"spark_history_url": ""}, "t").spark_history_url == ""


@pytest.mark.parametrize("where", ["pipeline", "stage"])
def test_a_pipeline_or_stage_history_url_fails_at_dag_parse(where: str):
    from airflow_provider_speculative.pipeline import Pipeline, parquet_source

    config = {"spark_history_url": "javascript:alert(document.domain)//x"}
    p = Pipeline("p", config=config if where == "pipeline" else None)
    p.stage("s", application="/apps/a.py", parallelism=1, inputs={"rows": parquet_source("/data/rows")},
            config=config if where == "stage" else None)
    with pytest.raises(PipelineError, match=r"spark_history_url = 'javascript:.*scheme javascript: is not"):
        p.graph()


def test_a_bad_deployment_history_url_means_no_link_not_a_broken_page(monkeypatch: pytest.MonkeyPatch):
    from types import SimpleNamespace

    from airflow_provider_speculative.links import SparkHistoryLink, spark_history_url

    monkeypatch.setenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", EVIL)
    assert spark_history_url() == ""
    assert SparkHistoryLink().get_link(None, ti_key=SimpleNamespace(dag_id=DAG, run_id=RUN, task_id="scan")) == ""


# -- a hostile plan already in the store -------------------------------------------------------------


def test_hostile_plan_in_the_store_yields_no_link_in_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The deployment's own URL is valid: the stage's hostile one must not fall back to a link either.
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", "http://history:18080")
    client = _client(hostile_store(tmp_path))
    body = client.get("/api/stage", params=PARAMS).json()
    attempt = body["subtasks"][0]["attempts"][0]
    assert attempt["admitted"] and attempt["spark_history"] is None
    assert "javascript" not in json.dumps(body).lower()
    run = client.get("/api/run", params={"dag_id": DAG, "run_id": RUN}).json()
    assert "javascript" not in json.dumps(run).lower()

    page = client.get("/ui/spark", params=PARAMS, follow_redirects=False)
    assert page.status_code == 200 and "javascript" not in page.text.lower() and "<a " not in page.text


def test_a_stage_url_that_is_valid_wins_and_the_app_id_stays_one_path_segment(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", "http://history:18080")
    client = _client(hostile_store(tmp_path, history="https://own-history/", app_id='x"/../<img src=x>'))
    attempt = client.get("/api/stage", params=PARAMS).json()["subtasks"][0]["attempts"][0]
    assert attempt["spark_history"] == "https://own-history/history/x%22%2F..%2F%3Cimg%20src%3Dx%3E/"
    redirect = client.get("/ui/spark", params=PARAMS, follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"] == attempt["spark_history"]


def test_a_driver_host_from_the_log_that_breaks_the_url_gives_no_spark_ui_link(tmp_path: Path):
    client = _client(hostile_store(tmp_path, log_host='evil"onclick=alert(1)'))
    running = client.get("/api/stage", params=PARAMS).json()["subtasks"][1]["attempts"][0]
    assert running["live"] and running["spark_ui"] is None
    (tmp_path / "other").mkdir()
    client = _client(hostile_store(tmp_path / "other", log_host="10.1.2.3"))
    running = client.get("/api/stage", params=PARAMS).json()["subtasks"][1]["attempts"][0]
    assert running["spark_ui"] == "http://10.1.2.3:4041/"


# -- headers and pages -------------------------------------------------------------------------------


@pytest.mark.parametrize("path,authorized,status", [
    ("/api/stage", True, 200), ("/api/run", True, 200), ("/ui/stage", True, 200), ("/ui/run", True, 200),
    ("/ui/spark", True, 404), ("/static/speculative.js", True, 200), ("/static/speculative.css", True, 200),
    ("/api/stage", False, 401), ("/ui/stage", False, 401), ("/api/nothing-here", True, 404),
])
def test_every_response_carries_a_strict_csp_and_nosniff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         path: str, authorized: bool, status: int):
    monkeypatch.delenv("AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL", raising=False)
    response = _client(hostile_store(tmp_path), authorized).get(path, params=PARAMS, follow_redirects=False)
    assert response.status_code == status, response.text
    csp = {d.split()[0]: d.split()[1:] for d in response.headers["content-security-policy"].split("; ")}
    assert csp["default-src"] == ["'self'"] and csp["script-src"] == ["'self'"]
    assert csp["object-src"] == ["'none'"] and csp["base-uri"] == ["'none'"] and csp["frame-ancestors"] == ["'self'"]
    assert not any("unsafe" in value for values in csp.values() for value in values)
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("page", ["run.html", "stage.html"])
def test_pages_have_no_inline_script_or_handler(page: str):
    html = (STATIC / page).read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, flags=re.S | re.I)
    assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"\son[a-z]+\s*=", html, flags=re.I) and "style=" not in html
    assert "javascript:" not in html.lower()


def test_the_script_never_parses_data_as_html():
    script = (STATIC / "speculative.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setTimeout(\"", "javascript:"):
        assert sink not in script, sink
    # Every href goes through h(), which drops a URL attribute that is not http(s).
    assert 'url.protocol === "http:" || url.protocol === "https:"' in script
