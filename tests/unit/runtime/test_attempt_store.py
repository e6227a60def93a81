"""An attempt's runtime over its plan's store: a POSIX tmp dir, or an S3 root (the in-memory backend installed).

``--plan`` is ``str(layout.plan)``: a path on POSIX, the plan's ``s3://`` URL on S3, read by name through
``store/roots.py`` with the AWS environment (an attempt has no Airflow connection). Heartbeat, failure, change notices,
the claim an unmodified application checks and the sink's data URL all go by name; on the S3 root every
file-system call on a store path is refused (``tests/unit/store/no_store_paths.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.core.plan import PLAN_VERSION
from airflow_provider_speculative.core.spark_submit import WRAPPER_MARK
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.runtime import context as runtime
from airflow_provider_speculative.runtime.context import StageContext
from airflow_provider_speculative.runtime.unmodified import ApplicationFailed, UnmodifiedAttempt
from airflow_provider_speculative.sinks.parquet import ParquetSink
from airflow_provider_speculative.store import changes, roots
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.layout import StageLayout, StorePath
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
SECRET = "wJalrXUtnFEMI-runtime-secret-K7MDENG"


class S3Memory(MemoryBackend):
    """The in-memory S3 root, with the URL Spark would write an object of it at (s3a, as S3Backend's)."""

    def _spark_url(self, name: str) -> str:
        return f"s3a://lake/speculative/{name}"


@dataclass
class Attempt:
    """A stage's plan written in the store under test, and what the attempt is started with."""

    store: StoreBackend
    layout: StageLayout
    plan_arg: str
    on_s3: bool
    refused: list[str]


@pytest.fixture(params=["posix", "s3"])
def attempt(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Attempt]:
    roots.forget_stores()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    on_s3 = request.param == "s3"
    if on_s3:
        roots.install_store(S3Memory(S3_ROOT))
    root = S3_ROOT if on_s3 else str(tmp_path / "store")
    plan = stage_plan(root, parallelism=2, version=PLAN_VERSION, fingerprint="fp")
    layout = StageLayout.of_plan(plan)
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    layout.create_json(layout.claim(0, 0), {"target": "local-a", "created_at": 1.0, "speculative": True})
    refused = refuse_store_paths(monkeypatch, S3_ROOT) if on_s3 else []
    yield Attempt(layout.store, layout, str(layout.plan), on_s3, refused)
    roots.forget_stores()


def _context(attempt: Attempt, cls: type[StageContext] = StageContext) -> StageContext:
    return cls.from_argv(["--plan", attempt.plan_arg, "--subtask", "0", "--attempt", "0", "--target", "local-a"])


def test_the_plan_is_opened_from_a_path_or_its_url_and_the_attempt_writes_by_name(
        attempt: Attempt, monkeypatch: pytest.MonkeyPatch) -> None:
    assert attempt.plan_arg.startswith("s3://lake/speculative/d/r/scan/") is attempt.on_s3
    ctx = _context(attempt)
    assert ctx.layout == attempt.layout and ctx.layout.store.url == attempt.store.url
    assert isinstance(ctx.layout.dir, StorePath) is attempt.on_s3
    ctx._notify()
    assert set(changes.listed(attempt.store, "d/r/scan").values()) == {(0, 0)}

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(runtime.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        ctx.__exit__(RuntimeError, RuntimeError("boom"), None)
    attempt_dir = "d/r/scan/subtask=0/attempt=0"
    assert attempt.store.read_json(f"{attempt_dir}/failure.json")["error"] == "RuntimeError: boom"
    assert attempt.store.read_json(f"{attempt_dir}/heartbeat.json")["phase"] == "FAILED"
    assert attempt.refused == []


def test_the_sinks_data_url_is_the_stores_url_for_spark(attempt: Attempt, tmp_path: Path) -> None:
    ctx = _context(attempt)
    writer: Any = ctx._sink_writer(ParquetSink(str(tmp_path / "out")).to_json(), ctx.layout.data(0, 0))
    data = "d/r/scan/subtask=0/attempt=0/data"
    expected = f"s3a://lake/speculative/{data}" if attempt.on_s3 else str(PosixBackend(ctx.layout.root).path(data))
    assert writer.context.data_url == expected
    assert attempt.refused == []


def test_an_unmodified_application_reads_its_claim_by_name(attempt: Attempt) -> None:
    plan = attempt.layout.read_json(attempt.layout.plan)
    plan["parallelism"], plan["subtasks"] = 1, plan["subtasks"][:1]
    plan["application_args"] = [WRAPPER_MARK, "--application", "/app.py", "--"]
    attempt.layout.replace_json(attempt.layout.plan, plan)
    ctx = _context(attempt, UnmodifiedAttempt)
    assert isinstance(ctx, UnmodifiedAttempt)
    with pytest.raises(ApplicationFailed, match="attempt 0 is a speculative copy"):
        ctx.refuse_copies()
    assert attempt.refused == []


def test_a_missing_plan_or_one_naming_another_store_is_refused(attempt: Attempt) -> None:
    missing = attempt.plan_arg.replace("/d/r/scan/", "/d/r/other/")
    with pytest.raises(FileNotFoundError, match=r"plan not found: .*/d/r/other/plan\.json"):
        StageContext.from_argv(["--plan", missing, "--subtask", "0", "--attempt", "0"])
    if not attempt.on_s3:
        return
    plan = attempt.layout.read_json(attempt.layout.plan)
    attempt.layout.replace_json(attempt.layout.plan, {**plan, "store_root": "s3://elsewhere/store"})
    with pytest.raises(StoreError, match="names another store") as refused:
        _context(attempt)
    assert SECRET not in str(refused.value)
    with pytest.raises(StoreError, match=r"is not the URL of a stage's plan\.json"):
        runtime.read_attempt_plan(f"{S3_ROOT}/plan.json")


def test_an_attempt_on_an_object_store_keeps_hadoops_local_filesystem() -> None:
    """s3a buffers uploads through Hadoop's LocalFileSystem: the raw one is for exchanges on a local store only."""
    from airflow_provider_speculative.runtime.session import SESSION_DEFAULTS, session_defaults

    assert session_defaults(True) == SESSION_DEFAULTS
    assert "fs.file.impl" in SESSION_DEFAULTS and not any(k.startswith("fs.file.") for k in session_defaults(False))
    # On an object store the task commit moves each file once (a copy on S3), not twice.
    assert session_defaults(False)["mapreduce.fileoutputcommitter.algorithm.version"] == "2"
    assert "mapreduce.fileoutputcommitter.algorithm.version" not in session_defaults(True)


def test_a_spark_submit_driver_takes_s3as_endpoint_from_its_environment_never_a_key() -> None:
    """The stage's connection reaches a classic driver as the AWS environment: s3a reads the keys from it, and
    the session gets the endpoint (a private S3 service) as Hadoop settings; no key ever becomes a setting."""
    from airflow_provider_speculative.runtime.session import s3a_defaults

    env = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "s3a-secret", "AWS_SESSION_TOKEN": "s3a-token",
           "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1"}
    conf = s3a_defaults(env, local_store=False)
    assert conf["fs.s3a.endpoint"] == "http://127.0.0.1:9" and conf["fs.s3a.path.style.access"] == "true"
    assert conf["fs.s3a.endpoint.region"] == "eu-west-1" and conf["fs.s3.impl"].endswith("S3AFileSystem")
    assert not any(secret in " ".join([*conf, *conf.values()]) for secret in ("AKID", "s3a-secret", "s3a-token"))
    assert not any(key.startswith("spark.") for key in conf)
    # A local store without an endpoint in the environment: nothing (AWS S3 itself needs no endpoint).
    assert s3a_defaults({"AWS_ACCESS_KEY_ID": "AKID"}, local_store=True) == {}
    assert s3a_defaults(env, local_store=True)["fs.s3a.endpoint"] == "http://127.0.0.1:9"  # S3 sources
