"""Clusters without a cluster: placement builders, blocked nodes at launch, lost nodes, remote hosts, file:// stores."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_provider_speculative.backends.spark_submit import conf_value, with_blocked_nodes
from airflow_provider_speculative.backends.supervised import REMOTE_ALIVE_TIMEOUT, SupervisedBackend
from airflow_provider_speculative.core.config import SpeculativeConfig, Target, store_root_path
from airflow_provider_speculative.core.messages import BlockNode, Launch
from airflow_provider_speculative.core.placement import (
    blocked_nodes_submission,
    cluster_manager,
    kubernetes_pod_template,
    node_resource_name,
    standalone_discovery_script,
    standalone_pin_conf,
    standalone_worker_conf,
    yarn_exclude_conf,
)
from airflow_provider_speculative.core.scheduler import StageScheduler
from airflow_provider_speculative.core.states import AttemptState
from airflow_provider_speculative.exceptions import ConfigError
from airflow_provider_speculative.runtime.context import node_of
from airflow_provider_speculative.store.files import atomic_write_json
from airflow_provider_speculative.store.layout import StageLayout
from tests.unit.core.scheduler_helpers import step

# -- placement builders ---------------------------------------------------------------------------


def test_standalone_worker_and_target_agree_on_the_node_resource() -> None:
    assert node_resource_name("127.0.0.2") == "node_127_0_0_2"
    assert node_resource_name("spark-worker-a") == "node_spark_worker_a"
    worker = standalone_worker_conf("127.0.0.2", "/opt/discover.sh")
    assert worker == {"spark.worker.resource.node_127_0_0_2.amount": "1",
                      "spark.worker.resource.node_127_0_0_2.discoveryScript": "/opt/discover.sh"}
    assert standalone_pin_conf("127.0.0.2") == {"spark.executor.resource.node_127_0_0_2.amount": "1"}
    # The discovery script prints the resource JSON Spark expects.
    line = next(ln for ln in standalone_discovery_script("127.0.0.2").splitlines() if ln.startswith("echo"))
    assert json.loads(line[len("echo '"):-1]) == {"name": "node_127_0_0_2", "addresses": ["0"]}


def test_yarn_exclude_lists_blocked_nodes_once_sorted() -> None:
    assert yarn_exclude_conf(["n2", "n1", "n2"]) == {"spark.yarn.exclude.nodes": "n1,n2"}
    assert yarn_exclude_conf([]) == {}


def test_kubernetes_template_excludes_blocked_nodes_in_every_selector_term() -> None:
    template = kubernetes_pod_template(["n2", "n1"])
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                            "values": ["n1", "n2"]}]}]
    # An existing template keeps its terms; the exclusion is ANDed into each (terms are ORed).
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"team": "a"}}, "spec": {"affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spark"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["batch"]}]}]}}}}}
    merged = kubernetes_pod_template(["n1"], base)
    merged_terms = merged["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert [len(t["matchExpressions"]) for t in merged_terms] == [2, 2]
    assert all(t["matchExpressions"][-1]["values"] == ["n1"] for t in merged_terms)
    assert merged["metadata"] == {"labels": {"team": "a"}}
    assert len(base["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]) == 1  # base untouched
    assert kubernetes_pod_template([]) == {"apiVersion": "v1", "kind": "Pod"}


@pytest.mark.parametrize(("master", "manager"), [
    ("local[1]", "local"), ("spark://h:7077", "standalone"), ("yarn", "yarn"),
    ("k8s://https://api:6443", "kubernetes"), ("mesos://x", "other"), (None, "other")])
def test_cluster_manager_from_master(master: str | None, manager: str) -> None:
    assert cluster_manager(master) == manager


def test_blocked_nodes_submission_per_cluster_manager() -> None:
    assert blocked_nodes_submission("spark://h:7077", ["n1"], "/t.json") == ({}, None)
    assert blocked_nodes_submission("local[2]", ["n1"], "/t.json") == ({}, None)
    assert blocked_nodes_submission("yarn", [], "/t.json") == ({}, None)
    assert blocked_nodes_submission("yarn", ["n1"], "/t.json") == ({"spark.yarn.exclude.nodes": "n1"}, None)
    conf, template = blocked_nodes_submission("k8s://https://api", ["n1"], "/t.json")
    assert conf == {"spark.kubernetes.executor.podTemplateFile": "/t.json",
                    "spark.kubernetes.driver.podTemplateFile": "/t.json"}
    assert template == kubernetes_pod_template(["n1"])


# -- blocked nodes added to a spark-submit command at launch --------------------------------------

YARN = ["spark-submit", "--master", "yarn", "--conf", "spark.yarn.exclude.nodes=old", "--name", "x",
        "--deploy-mode", "cluster", "/apps/q1.py", "--plan", "p.json", "--subtask", "0"]


def test_yarn_command_gets_the_blocklist_before_the_application(tmp_path: Path) -> None:
    command, template, _ = with_blocked_nodes(YARN, ("n2", "n1"), tmp_path)
    assert template is None
    application = command.index("/apps/q1.py")
    assert command[application:] == YARN[YARN.index("/apps/q1.py"):]  # application and its args unchanged
    assert command[application - 2:application] == ["--conf", "spark.yarn.exclude.nodes=n1,n2,old"]
    assert conf_value(command, "spark.yarn.exclude.nodes") == "old"  # the first; spark-submit keeps the last
    assert [a for a in command if a.startswith("spark.yarn.exclude.nodes=")][-1] == "spark.yarn.exclude.nodes=n1,n2,old"


def test_kubernetes_command_gets_a_pod_template_merged_with_the_targets(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    team: a\n")
    command = ["spark-submit", "--master", "k8s://https://api:6443", "--conf",
               f"spark.kubernetes.executor.podTemplateFile={base}", "/apps/q1.py", "--plan", "p.json"]
    out, template, path = with_blocked_nodes(command, ("n1",), tmp_path / "attempt")
    assert path == tmp_path / "attempt" / "pod-template.json"
    assert template["metadata"] == {"labels": {"team": "a"}}
    assert template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}
    assert f"spark.kubernetes.executor.podTemplateFile={path}" in out
    assert out.index(f"spark.kubernetes.executor.podTemplateFile={path}") < out.index("/apps/q1.py")


def test_standalone_and_local_commands_are_unchanged(tmp_path: Path) -> None:
    for master in ("spark://127.0.0.1:7100", "local[1]"):
        command = ["spark-submit", "--master", master, "/apps/q1.py"]
        assert with_blocked_nodes(command, ("n1",), tmp_path)[:2] == (command, None)


# -- lost nodes ------------------------------------------------------------------------------------


def test_attempt_that_lost_its_node_blocks_it_and_reruns_on_another_node() -> None:
    cluster = (Target("w1", slots=1, node="127.0.0.2"), Target("w2", slots=1, node="127.0.0.3"))
    sched = StageScheduler(parallelism=2, config=SpeculativeConfig(targets=cluster, block_slow_node_duration=600))
    step(sched, 0.0)
    step(sched, 1.0, [replace(sched.attempts[s][0], state=AttemptState.RUNNING, deploying_at=1.0) for s in (0, 1)])
    lost = replace(sched.attempts[1][0], state=AttemptState.FAILED, end_at=20.0, node="127.0.0.3",
                   failure={"kind": "node_lost", "node": "127.0.0.3"}, cause="node lost: ...")
    actions = step(sched, 20.0, [lost])
    assert [(a.node, a.until) for a in actions if isinstance(a, BlockNode)] == [("127.0.0.3", 620.0)]
    assert [a for a in actions if isinstance(a, Launch)] == []  # w1 is busy and w2's node is blocked
    done = replace(sched.attempts[0][0], state=AttemptState.FINISHED, end_at=30.0)
    assert [(a.subtask, a.target) for a in step(sched, 30.0, [done]) if isinstance(a, Launch)] == [(1, "w1")]


def test_an_ordinary_failure_blocks_nothing() -> None:
    sched = StageScheduler(parallelism=1, config=SpeculativeConfig())
    step(sched, 0.0)
    failed = replace(sched.attempts[0][0], state=AttemptState.FAILED, end_at=5.0, cause="boom")
    assert [a for a in step(sched, 5.0, [failed]) if isinstance(a, BlockNode)] == []


def test_node_is_the_one_executor_host_else_the_target_label() -> None:
    assert node_of(["127.0.0.2"], "w1") == "127.0.0.2"
    assert node_of([], "w1") == "w1"
    assert node_of(["127.0.0.2", "127.0.0.3"], "w1") == "w1"


# -- liveness of attempts supervised on another host ----------------------------------------------


def test_remote_supervisor_liveness_comes_from_alive_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = StageLayout(tmp_path, "d", "r", "s")
    backend = SupervisedBackend(layout)
    assert backend.claim(0, 0, {"target": "w1", "node": "n1", "created_at": 0.0})
    other = f"not-{socket.gethostname()}"
    now = time.time()
    signals: list[tuple[int, int]] = []
    monkeypatch.setattr("os.killpg", lambda pgid, sig: signals.append((pgid, sig)))
    # The remote pid does not exist here (beyond pid_max): only alive_at can say it is alive.
    status = {"state": "DEPLOYING", "pid": 99_999_999, "pgid": 99_999_999, "host": other,
              "deploying_at": now - 100, "alive_at": now - 2}
    atomic_write_json(layout.status(0, 0), status)
    assert backend.poll(0, 0, now).state == AttemptState.DEPLOYING
    late = now + REMOTE_ALIVE_TIMEOUT + 1
    gone = backend.poll(0, 0, late)
    assert gone.state == AttemptState.FAILED and "disappeared" in gone.cause
    # Cancelling a remote attempt only writes cancel.json (the remote supervisor acts on it) ...
    backend.cancel(0, 0, "test")
    assert (layout.attempt_dir(0, 0) / "cancel.json").exists()
    assert backend.reap(0, 0, now) is False
    assert backend.reap(0, 0, now + backend.kill_grace + 1) is False
    assert signals == []  # a remote process group id is never signalled here
    # ... and it is reaped once the remote supervisor recorded the end.
    atomic_write_json(layout.status(0, 0), {**status, "state": "CANCELED", "end_at": now + 1})
    assert backend.reap(0, 0, now + 1) is True


# -- store root as a file:// URL ------------------------------------------------------------------


def test_store_root_accepts_paths_and_file_urls() -> None:
    assert store_root_path("/shared/store") == "/shared/store"
    assert store_root_path("file:///shared/store") == "/shared/store"
    assert store_root_path("file://localhost/shared/my%20store") == "/shared/my store"
    assert SpeculativeConfig().with_overrides({"store_path": "file:///x"}, "t").store_path == "file:///x"


@pytest.mark.parametrize(("url", "named"), [("s3://bucket/store", "'s3'"), ("hdfs://nn:8020/store", "'hdfs'"),
                                            ("file://otherhost/store", "'otherhost'"), ("file://relative", "host")])
def test_store_root_refuses_other_schemes_naming_them(url: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        SpeculativeConfig().with_overrides({"store_path": url}, "pipeline 'p'")
    assert "store_path" in str(info.value) and "pipeline 'p'" in str(info.value)


def test_settings_store_root_resolves_a_file_url(tmp_path: Path) -> None:
    from airflow_provider_speculative.settings import store_root

    config = SpeculativeConfig().with_overrides({"store_path": f"file://{tmp_path}/store"}, "t")
    assert store_root(config) == tmp_path / "store"
