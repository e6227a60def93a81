"""A StageLayout over its store's backend: a POSIX directory or an S3 root URL (the in-memory double in the cache)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative.store import files, roots
from airflow_provider_speculative.store.backend import PosixBackend, S3Backend, UnsafeStoreNameError
from airflow_provider_speculative.store.layout import NotALocalPathError, RunNotOwnedError, StageLayout, StorePath
from airflow_provider_speculative.store.roots import S3Settings, install_store, open_store
from tests.factories import stage_plan
from tests.unit.store.memory import MemoryBackend

S3_ROOT = "s3://lake/spec/store"
DAG, RUN, STAGE = "dag", "manual__2026-11-28T00:00:00+00:00", "scan"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


@pytest.fixture(autouse=True)
def _fresh_stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    roots.forget_stores()
    # As in an attempt's runtime: no Airflow layer resolving connections (settings.py's is put back after).
    monkeypatch.setattr(roots, "_resolver", None)
    yield
    roots.forget_stores()


@pytest.fixture(params=["posix", "s3-memory"])
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> StageLayout:
    """The stage's layout from its plan, on a POSIX tmp dir or on an S3 root served by the in-memory backend."""
    if request.param == "posix":
        root: str = str(tmp_path / "store")
    else:
        install_store(MemoryBackend(S3_ROOT))
        root = S3_ROOT
    return StageLayout.of_plan(stage_plan(root, dag_id=DAG, run_id=RUN, stage=STAGE))


def test_of_plan_opens_the_plans_store_root_once_per_process(layout: StageLayout, tmp_path: Path) -> None:
    plan = stage_plan(layout.store_root, dag_id=DAG, run_id=RUN, stage=STAGE)
    again = StageLayout.of_plan(plan, "other")
    assert again.name(again.dir) == f"dag/{layout.name(layout.run_dir).split('/')[1]}/other"
    if isinstance(layout.store, PosixBackend):
        # An old plan's store_root (a path) loads as it always did: real paths under that directory.
        assert layout.root == tmp_path / "store" and type(layout.plan) is not StorePath
        assert layout == StageLayout(tmp_path / "store", DAG, RUN, STAGE)
        assert layout.store_root == str(tmp_path / "store")
    else:
        assert again.store is layout.store is open_store(S3_ROOT)
        assert layout.store_root == S3_ROOT and str(layout.root) == S3_ROOT
        # A layout built from another one's root finds the backend this process opened for it.
        assert StageLayout(layout.root, DAG, RUN, "x").store is layout.store


def test_names_are_the_same_on_both_stores(layout: StageLayout) -> None:
    posix = StageLayout(Path("/srv/store"), DAG, RUN, STAGE)
    for pick in (lambda x: x.plan, lambda x: x.journal, lambda x: x.claim(3, 7), lambda x: x.data(0, 1),
                 lambda x: x.admitted(2), lambda x: x.blocklist, lambda x: x.commit_hold()[1]):
        assert layout.name(pick(layout)) == posix.name(pick(posix))
    assert layout.run_prefix == posix.run_prefix == "dag/manual__2026-11-28T00_00_00_00_00-" + \
        posix.run_prefix.rsplit("-", 1)[1]


def test_documents_go_through_the_store_by_name(layout: StageLayout) -> None:
    assert layout.read_json(layout.plan) is None and not layout.exists(layout.claim(0, 0))
    assert layout.create_json(layout.claim(0, 0), {"target": "t"})
    assert not layout.create_json(layout.claim(0, 0), {"target": "u"})
    layout.replace_json(layout.committed, {"subtasks": {}})
    assert layout.store.read_json(layout.name(layout.committed)) == {"subtasks": {}}
    assert layout.read_json(layout.claim(0, 0)) == {"target": "t"}
    assert layout.attempt_numbers(0) == [0]
    assert layout.wait_for(layout.committed, timeout=0, interval=0.01)
    with pytest.raises(RunNotOwnedError, match=str(layout.committed).replace("+", r"\+")):
        layout.delete(layout.committed)  # the run's prefix carries no marker yet
    layout.claim_run()
    assert layout.delete(layout.committed) and not layout.exists(layout.committed)
    assert layout.delete_tree(layout.subtask_dir(0)) == 1 and layout.attempt_numbers(0) == []


def test_a_name_outside_the_root_is_refused(layout: StageLayout) -> None:
    other = StageLayout.over(MemoryBackend("s3://other/root"), DAG, RUN, STAGE)
    with pytest.raises(UnsafeStoreNameError):
        layout.name(Path("/elsewhere/plan.json") if isinstance(layout.store, PosixBackend) else other.plan)


def test_every_file_system_call_on_an_s3_layout_path_fails_loudly() -> None:
    install_store(MemoryBackend(S3_ROOT))
    layout = StageLayout.of_plan(stage_plan(S3_ROOT, dag_id=DAG, run_id=RUN, stage=STAGE))
    path = layout.claim(0, 0)
    assert isinstance(path, Path) and str(path) == f"{S3_ROOT}/{layout.name(path)}"
    assert repr(path) == f"StorePath({str(path)!r})" and path.name == "claim.json"
    calls: list[Any] = [
        lambda: open(path), lambda: os.stat(path), lambda: os.path.exists(path), lambda: os.fspath(path),
        path.exists, path.is_file, path.read_text, path.read_bytes, path.unlink, path.resolve,
        lambda: path.write_text("x"), lambda: layout.dir.mkdir(parents=True), lambda: list(layout.dir.iterdir()),
        lambda: files.read_json(path), lambda: files.atomic_write_json(path, {}),
        lambda: files.create_exclusive_json(path, {}), lambda: PosixBackend(layout.root).read_json("x.json")]
    for call in calls:
        with pytest.raises(NotALocalPathError, match=r"not a local directory: read and write it through layout\.store"):
            call()
    # Nothing was written anywhere, least of all a local "s3:" directory below the working directory.
    assert not os.path.lexists("s3:") and layout.read_json(path) is None


def test_s3_roots_share_one_backend_per_url_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = open_store("s3://lake/spec/store/")
    assert isinstance(store, S3Backend) and store.url == S3_ROOT
    assert open_store("s3a://lake/spec/store") is store is open_store(S3_ROOT, conn_id="spec_s3")
    explicit = S3Settings(access_key="AKIDOTHER", secret_key="other-secret", region="eu-west-1")
    assert open_store(S3_ROOT, credentials=explicit) is not store
    assert open_store(S3_ROOT, credentials=S3Settings(access_key="AKIDOTHER", secret_key="other-secret",
                                                      region="eu-west-1")) is open_store(S3_ROOT, credentials=explicit)
    assert open_store("s3://lake/other") is not store
    # A POSIX root holds nothing to share: a backend of the path as given, never cached.
    assert isinstance(open_store("file:///srv/store"), PosixBackend) and open_store("/srv/store").root == Path(
        "/srv/store")
    shown = " ".join([repr(store), repr(StageLayout.over(store, DAG, RUN, STAGE)), repr(roots._opened),
                      str(StageLayout.over(store, DAG, RUN, STAGE).plan)])
    assert SECRET not in shown and "other-secret" not in shown


def test_a_connection_id_is_resolved_by_the_airflow_layer_else_the_environment_serves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    plan = stage_plan(S3_ROOT, dag_id=DAG, run_id=RUN, stage=STAGE, config={"s3_conn_id": "spec_s3"})
    # No resolver registered (an attempt's runtime): the AWS environment, whatever the plan's connection.
    runtime = StageLayout.of_plan(plan).store
    assert runtime is open_store(S3_ROOT)
    asked: list[str] = []

    def resolver(conn_id: str) -> S3Settings:
        asked.append(conn_id)
        return S3Settings(access_key="AKIDCONN", secret_key="conn-secret", source=f"connection {conn_id!r}")

    roots.resolve_connections_with(resolver)
    airflow = StageLayout.of_plan(plan).store
    assert airflow is not runtime and StageLayout.of_plan(plan, "other").store is airflow
    assert asked == ["spec_s3"]  # resolved once, when the root was first opened with it
    assert "conn-secret" not in repr(airflow) and "conn-secret" not in repr(plan)


def test_a_posix_root_cannot_be_served_by_a_backend_without_paths() -> None:
    with pytest.raises(Exception, match="must be a PosixBackend"):
        install_store(MemoryBackend("file:///srv/store"))
