"""The stage's S3 credentials reach its attempts: ``[speculative] s3_conn_id`` resolved once per stage run in the
controller's process and handed over in the launch environment only (never plan.json, a journal, argv or a log)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.backends.supervised import SupervisedBackend
from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.core.contract import S3_ENV, attempt_env, inherited_env
from airflow_provider_speculative.core.plan import plan_uses_s3
from airflow_provider_speculative.exceptions import PlanError
from airflow_provider_speculative.store.roots import S3Settings, environment_of, settings_from_environment
from airflow_provider_speculative.triggers.controller import StageControllerTrigger
from tests.factories import Clock, stage_plan, write_plan
from tests.unit.control.test_controller import FakeBackend

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYCONNSECRET"
TOKEN = "FwoGZXIvYXdzEXAMPLE-SESSION-TOKEN"
CONN = {"conn_type": "aws", "login": "AKIDCONNECTION", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1", "aws_session_token": TOKEN}}
SOURCE = "s3://lake/tpch/lineitem/part-0.parquet"


def s3_source_plan(root: Path | str, conn_id: str = "spec_s3") -> dict[str, Any]:
    """A plan on ``root`` whose one subtask reads a source object on S3, with ``s3_conn_id`` = ``conn_id``."""
    return stage_plan(root, parallelism=1, config={"s3_conn_id": conn_id}, output={},
                      subtasks=[{"inputs": {"lineitem": {"files": [{"path": SOURCE, "size": 10}]}},
                                 "input_bytes": 10}])


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aws connection ``spec_s3`` as a deployment defines it (an AIRFLOW_CONN_ variable)."""
    monkeypatch.setenv("AIRFLOW_CONN_SPEC_S3", json.dumps(CONN))


def test_the_aws_environment_of_credentials_reads_back_as_the_same_credentials() -> None:
    settings = S3Settings(endpoint_url="http://127.0.0.1:9", region="eu-west-1", access_key="AKID",
                          secret_key=SECRET, session_token=TOKEN)
    env = environment_of(settings)
    assert set(env) == set(S3_ENV)
    back = settings_from_environment(env)
    assert (back.endpoint_url, back.region, back.access_key, back.secret_key, back.session_token) == (
        settings.endpoint_url, settings.region, settings.access_key, settings.secret_key, settings.session_token)
    # A field that is not set is absent (an empty variable would still shadow nothing, but says nothing either).
    assert environment_of(S3Settings(access_key="AKID", secret_key=SECRET)) == {
        "AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": SECRET}


def test_a_stage_uses_s3_when_its_store_or_a_source_is_there(tmp_path: Path) -> None:
    assert plan_uses_s3(stage_plan("s3://lake/store"))
    assert plan_uses_s3(s3_source_plan(tmp_path))
    assert plan_uses_s3(stage_plan(tmp_path, inputs={"dim": {"files": [{"path": "s3a://lake/dim.parquet"}]}}))
    assert not plan_uses_s3(stage_plan(tmp_path))


def test_the_trigger_resolves_the_connection_for_a_stage_on_s3(connection: None, tmp_path: Path) -> None:
    env = asyncio.run(StageControllerTrigger._attempt_env(stage_plan("s3://lake/store", output={},
                                                                     config={"s3_conn_id": "spec_s3"})))
    assert {k: env[k] for k in S3_ENV} == {
        "AWS_ACCESS_KEY_ID": "AKIDCONNECTION", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN,
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert "AWS_ACCESS_KEY_ID" in asyncio.run(StageControllerTrigger._attempt_env(s3_source_plan(tmp_path)))
    # No S3 in the stage, or no connection configured: nothing added, attempts inherit the launcher's environment.
    assert not set(S3_ENV) & set(asyncio.run(StageControllerTrigger._attempt_env(
        stage_plan(tmp_path, output={}, config={"s3_conn_id": "spec_s3"}))))
    assert not set(S3_ENV) & set(asyncio.run(StageControllerTrigger._attempt_env(s3_source_plan(tmp_path, ""))))


def test_a_connection_that_cannot_be_read_fails_naming_it_never_its_text(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    from airflow.sdk import BaseHook

    async def broken(conn_id: str) -> Any:
        raise RuntimeError(f"cannot parse aws://AKID:{SECRET}@host")

    monkeypatch.setattr(BaseHook, "aget_connection", staticmethod(broken))
    with pytest.raises(PlanError) as raised:
        asyncio.run(StageControllerTrigger._attempt_env(s3_source_plan(tmp_path)))
    message = str(raised.value)
    assert "'spec_s3'" in message and "RuntimeError" in message and SECRET not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_the_targets_own_s3_environment_wins_whole_over_the_connection() -> None:
    connection = environment_of(S3Settings(endpoint_url="http://conn:9", access_key="AKIDCONN", secret_key=SECRET,
                                           session_token=TOKEN))
    extra = {**connection, "SINK_DSN": "postgres://sink"}
    assert attempt_env({}, {}, extra, {"FAULT": "1"}) == {**extra, "FAULT": "1"}
    own = {"AWS_ACCESS_KEY_ID": "AKIDTARGET", "AWS_SECRET_ACCESS_KEY": "target-secret"}
    env = attempt_env(own, {"SPECULATIVE_SPARK_REMOTE": "sc://a"}, extra)
    # The target's keys, without the connection's token or endpoint mixed in; the rest of the run's env stays.
    assert env == {**own, "SPECULATIVE_SPARK_REMOTE": "sc://a", "SINK_DSN": "postgres://sink"}
    assert attempt_env({}, {"AWS_REGION": "us-west-2"}, extra)["AWS_REGION"] == "us-west-2"


def test_the_attempts_s3_set_replaces_the_launchers_whole() -> None:
    launcher = {"PATH": "/bin", "AWS_SESSION_TOKEN": "launcher-token", "AWS_ENDPOINT_URL": "http://launcher:9",
                "AWS_PROFILE": "ops"}
    env = inherited_env(launcher, {"AWS_ACCESS_KEY_ID": "AKIDCONN", "AWS_SECRET_ACCESS_KEY": SECRET})
    assert env == {"PATH": "/bin", "AWS_PROFILE": "ops", "AWS_ACCESS_KEY_ID": "AKIDCONN",
                   "AWS_SECRET_ACCESS_KEY": SECRET}
    assert inherited_env(launcher, {"X": "1"}) == {**launcher, "X": "1"}  # no S3 set: the launcher's, as before


def test_a_launcher_in_spark_connect_mode_does_not_pass_it_on() -> None:
    """A launcher that once opened a Connect session in-process (pyspark set these) starts classic drivers."""
    launcher = {"PATH": "/bin", "SPARK_CONNECT_MODE_ENABLED": "1", "SPARK_REMOTE": "sc://127.0.0.1:15002",
                "SPARK_LOCAL_REMOTE": "1"}
    assert inherited_env(launcher, {"X": "1"}) == {"PATH": "/bin", "X": "1"}
    # What the attempt's own environment sets is kept.
    assert inherited_env(launcher, {"SPARK_REMOTE": "sc://b"}) == {"PATH": "/bin", "SPARK_REMOTE": "sc://b"}


def _store_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_the_secret_reaches_the_attempt_in_its_environment_only(connection: None, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    plan = s3_source_plan(tmp_path / "store")
    layout = write_plan(plan)
    env = asyncio.run(StageControllerTrigger._attempt_env(plan))
    clock = Clock()
    backend = FakeBackend(layout, clock)
    controller = StageController.open(plan, clock=clock, extra_env=env,
                                      backends={"local-a": backend, "local-b": backend}, observer=backend)
    controller.step()
    [spec] = backend.launched
    assert spec.env["AWS_SECRET_ACCESS_KEY"] == SECRET and spec.env["AWS_SESSION_TOKEN"] == TOKEN
    assert not any(SECRET in arg or TOKEN in arg for arg in spec.command)
    # Not in plan.json, the journal, claims, slots or any other document of the store.
    stored = _store_bytes(tmp_path / "store")
    assert stored and SECRET.encode() not in stored and TOKEN.encode() not in stored
    assert SECRET not in json.dumps(controller.summary(), default=str)

    # The supervisor gets it in its environment, never on its command line (``ps`` shows argv).
    started: list[tuple[list[str], dict[str, str]]] = []

    def call(argv: list[str], **kw: Any) -> int:
        started.append((argv, kw["env"]))
        layout.replace_json(layout.status(spec.subtask, spec.attempt), {"state": "RUNNING", "pid": 999_999_999})
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "launcher-token")
    SupervisedBackend(layout).launch(spec)
    [(argv, launched)] = started
    assert not any(SECRET in arg or TOKEN in arg for arg in argv)
    assert (launched["AWS_SECRET_ACCESS_KEY"], launched["AWS_SESSION_TOKEN"]) == (SECRET, TOKEN)
    assert os.environ["AWS_SESSION_TOKEN"] == "launcher-token"  # the launcher's own environment is untouched
    assert SECRET.encode() not in _store_bytes(tmp_path / "store")
    assert SECRET not in caplog.text and TOKEN not in caplog.text  # no log line of the launch names them
