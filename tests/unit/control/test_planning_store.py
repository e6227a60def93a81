"""Planning over the configured store's backend: a POSIX directory and an S3 root (the in-memory backend installed).

The planner opens ``[speculative] store_path`` through ``settings.configured_store``, builds every layout over that
backend, writes plan.json by name and records the root (a path, or the URL: never a credential) as the plan's
``store_root``. Speed records and probe claims go through the same backend. On the S3 root every file-system call on
a store path is refused (``tests/unit/store/no_store_paths.py``); local sources and the application are still read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_speculative import settings
from airflow_provider_speculative.control.controller import StageController
from airflow_provider_speculative.control.planning import RunInfo, StagePlanner
from airflow_provider_speculative.control.speedcheck import prepare_if_needed
from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.core.plan import load_plan
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store import changes, roots
from airflow_provider_speculative.store.backend import PosixBackend, StoreBackend
from airflow_provider_speculative.store.layout import StageLayout, StorePath
from airflow_provider_speculative.store.speeds import (
    claim_probe,
    claim_speed_check,
    read_history,
    record_speeds,
    speed_check_claimed_at,
    speed_name,
)
from tests.factories import Clock, stage_plan
from tests.unit.control.test_controller import FakeBackend
from tests.unit.control.test_speed_check import URLS, Servers
from tests.unit.devtools.test_runner import CONFIG, _graph
from tests.unit.store.memory import MemoryBackend
from tests.unit.store.no_store_paths import refuse_store_paths

S3_ROOT = "s3://lake/speculative"
SECRET = "wJalrXUtnFEMI-planning-secret-K7MDENG"


@dataclass
class Store:
    """The store under test: its backend, what plans record as its root, and the config naming it."""

    backend: StoreBackend
    root: str
    config: SpeculativeConfig
    on_s3: bool


@pytest.fixture(params=["posix", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """``[speculative] store_path`` on a POSIX tmp dir, or on an S3 root served by the in-memory backend."""
    roots.forget_stores()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # what an S3 root would be opened with: never recorded
    if request.param == "s3":
        backend: StoreBackend = MemoryBackend(S3_ROOT)
        roots.install_store(backend)
        # Set past the parse-time check (core/config.py refuses s3:// unless the experimental opt-in is on).
        config = dataclasses.replace(CONFIG, store_path=S3_ROOT)
        yield Store(backend, S3_ROOT, config, True)
    else:
        root = tmp_path / "store"
        config = CONFIG.with_overrides({"store_path": str(root)}, "test")
        yield Store(PosixBackend(root), str(root), config, False)
    roots.forget_stores()


def _planner(tmp_path: Path, store: Store, **run: Any) -> StagePlanner:
    return StagePlanner(_graph(tmp_path), "scan", sink=None, declared_sink=None, config=store.config,
                        targets=lambda *_: {"a": {"kind": "fake", "command": ["app.py"], "env": {}},
                                            "b": {"kind": "fake", "command": ["app.py"], "env": {}}},
                        run=RunInfo(dag_id="d", run_id="r", try_number=1, clear_number=0, **run))


def _decided(backend: StoreBackend) -> int:
    """How many plan decisions the stage's journal holds, read by name."""
    return sum(e["event"] == "plan_decided" for e in backend.read_journal("d/r/scan/journal.jsonl"))


def _refuse(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return refuse_store_paths(monkeypatch, S3_ROOT) if store.on_s3 else []


def test_planning_writes_its_plan_by_name_in_the_configured_store(tmp_path: Path, store: Store,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, store)
    refused = _refuse(store, monkeypatch)
    planner.start()
    plan = planner.plan({})

    assert planner.store.url == store.backend.url
    assert isinstance(planner.layout.plan, StorePath) is store.on_s3
    # plan.json by name, its root what the store is: the POSIX path as always, or the URL.
    stored = store.backend.read_json("d/r/scan/plan.json")
    assert stored == json.loads(json.dumps(plan)) and plan["store_root"] == store.root
    assert StageLayout.of_plan(stored).store.url == store.backend.url
    assert load_plan(stored, "test")["parallelism"] == 2
    # The run and the root are owned, the task's state and the plan's decision recorded, all by name.
    assert store.backend.claimed("d/r")
    assert store.backend.read_json("d/r/scan/task.json")["state"] == "deferred"
    assert _decided(store.backend) == 1
    assert SECRET not in store.backend.read("d/r/scan/plan.json").decode()
    # A retry plans the same: the previous plan is read, its admissions checked through the attempt observer.
    again = _planner(tmp_path, store).plan({})
    assert again["fingerprint"] == plan["fingerprint"]
    assert _decided(store.backend) == 2
    assert refused == []


def test_the_planner_opens_the_configured_store_once_per_process(tmp_path: Path, store: Store,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "airflow_config", lambda: store.config)
    first, second = _planner(tmp_path, store), _planner(tmp_path, store)
    if store.on_s3:
        assert first.store is second.store is store.backend is settings.configured_store()
    assert first.layout == second.layout and first.layout.store_root == store.root
    assert first.watch_entry("scan")["store"] == store.root and SECRET not in repr(first.watch_entry("scan"))


def test_speed_records_and_probe_claims_go_through_the_backend(tmp_path: Path, store: Store,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, store)
    refused = _refuse(store, monkeypatch)
    backend = planner.store
    record_speeds(backend, {"a": 1.0, "b": 3.5}, 1000.0, "d/r/scan")
    assert backend.read_json(speed_name("b"))["slowness"] == 3.5
    assert read_history(backend, ["a", "b"], 1001.0, run="d/r") == ({"a": 1.0, "b": 3.5}, frozenset({"a", "b"}))
    assert claim_probe(backend, "b", "d/r2", 1002.0) and not claim_probe(backend, "b", "d/r2", 1003.0)
    assert claim_speed_check(backend, URLS, "d/r3", 1004.0) and not claim_speed_check(backend, URLS, "d/r3", 1005.0)
    assert speed_check_claimed_at(backend, URLS, "d/r3") == 1004.0
    # What the operator and the start trigger warm while the stage plans: read from the planner's store.
    assert prepare_if_needed(planner.store, {}, "d/r", 86400.0) is False
    assert refused == []


class ByNameBackend(FakeBackend):
    """The controller tests' fake attempts, with claims and change notices by name (no path of the store)."""

    def claim(self, subtask: int, attempt: int, record: dict[str, Any]) -> bool:
        return self.layout.create_json(self.layout.claim(subtask, attempt), record)

    def launch(self, spec: Any) -> None:
        self.launched.append(spec)
        self.attempts[(spec.subtask, spec.attempt)] = Attempt(spec.subtask, spec.attempt, spec.target,
                                                              AttemptState.RUNNING, deploying_at=self.clock())
        changes.post(self.layout.store, self.layout.name(self.layout.dir), spec.subtask, spec.attempt)

    def set(self, subtask: int, attempt: int, state: Any) -> None:
        self.attempts[(subtask, attempt)] = dataclasses.replace(self.attempts[(subtask, attempt)], state=state,
                                                                end_at=self.clock())
        changes.post(self.layout.store, self.layout.name(self.layout.dir), subtask, attempt)


def test_the_controllers_speed_check_goes_through_the_layouts_backend(
        tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = stage_plan(store.root, parallelism=4)
    for spec in plan["targets"].values():
        spec["kind"] = "spark_connect"
    layout = StageLayout.of_plan(plan)
    assert layout.store.url == store.backend.url
    layout.claim_run()
    layout.replace_json(layout.plan, plan)
    # An earlier DAG run found local-b slow: this run checks both (its claim and records by name), and launches.
    record_speeds(layout.store, {"local-a": 1.0, "local-b": 4.0}, Clock().now - 3600.0, "d/r0/scan")
    refused = _refuse(store, monkeypatch)
    clock = Clock()
    backend = ByNameBackend(layout, clock)
    check = Servers({"sc://a:15002/": 0.05, "sc://b:15002/": 0.06})
    controller = StageController.open(plan, clock=clock, backends={"local-a": backend, "local-b": backend},
                                      observer=backend, target_env={n: {REMOTE_ENV: u} for n, u in URLS.items()},
                                      speed_check=check)
    assert sorted(check.calls) == sorted(URLS.values())
    events = [e["event"] for e in store.backend.read_journal("d/r/scan/journal.jsonl")]
    assert "speed_check" in events
    record = store.backend.read_json(speed_name("local-b"))
    assert record["from"] == "d/r/speed-check"
    assert controller.scheduler.target_history.keys() == {"local-a", "local-b"}
    controller.step()
    assert backend.launched and store.backend.exists("d/r/scan/subtask=0/attempt=0/claim.json")
    assert refused == []
