"""docker/docker-compose.yml runs the same topology and command lines as the loopback test harness.

No Docker engine is needed: the compose file is parsed and compared with the functions that build the
harness's commands (tests/integration/standalone_cluster.py) and the provider's placement builders.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from airflow_provider_speculative.core.config import SpeculativeConfig, store_root_path
from airflow_provider_speculative.core.placement import standalone_discovery_script, standalone_pin_conf
from tests.integration.standalone_cluster import (
    connect_server_command,
    master_command,
    worker_command,
    worker_properties,
)

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SPARK_CLASS = "/opt/spark/bin/spark-class"
SPARK_SUBMIT = "/opt/spark/bin/spark-submit"
MASTER_URL = "spark://spark-master:7077"
WORKERS = {"spark-worker-a": "spark-connect-a", "spark-worker-b": "spark-connect-b"}
AIRFLOW = {"airflow-api-server": ["api-server"], "airflow-scheduler": ["scheduler"],
           "airflow-dag-processor": ["dag-processor"], "airflow-triggerer": ["triggerer"]}
STORE = "/opt/speculative/store"
# The provider's commit protocol jar, built into the image (docker/Dockerfile).
COMMIT_JAR = "/opt/speculative/jars/speculative-commit-protocol.jar"
CONF_DIR = "/opt/speculative/spark"
# Per worker: one executor for its spark-submit target and one for its Connect server.
NODE_UNITS = 2


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_services_are_the_documented_topology(compose: dict) -> None:
    assert set(compose["services"]) == {"postgres", "airflow-init", *AIRFLOW, "spark-master", *WORKERS,
                                        *WORKERS.values()}
    for name, command in AIRFLOW.items():
        assert compose["services"][name]["command"] == command
        assert compose["services"][name]["image"] == "airflow-speculative:latest"


def test_spark_commands_are_the_harness_commands(compose: dict) -> None:
    services = compose["services"]
    assert services["spark-master"]["command"] == master_command(SPARK_CLASS, "spark-master", 7077, 8081)
    for worker, connect in WORKERS.items():
        assert services[worker]["hostname"] == worker
        assert services[worker]["command"] == worker_command(
            SPARK_CLASS, MASTER_URL, worker, 7078, 8082, "/opt/spark-work", f"{CONF_DIR}/worker-{worker}.conf",
            cores=2, memory="2g")
        assert services[connect]["command"] == connect_server_command(
            SPARK_SUBMIT, MASTER_URL, worker, connect, 15002, connect, jars=COMMIT_JAR)
        # Spark services run the JVM directly, not through Airflow's entrypoint.
        assert services[worker]["entrypoint"] == ["/usr/bin/dumb-init", "--"]


def test_worker_node_resources_match_the_builders() -> None:
    for worker in WORKERS:
        script = f"{CONF_DIR}/discover-{worker}.sh"
        assert (DOCKER / "spark" / f"worker-{worker}.conf").read_text() == worker_properties(worker, script, NODE_UNITS)
        discover = DOCKER / "spark" / f"discover-{worker}.sh"
        assert discover.read_text() == standalone_discovery_script(worker, NODE_UNITS)
        assert discover.stat().st_mode & 0o111, f"{discover} must be executable"


def test_targets_are_one_per_worker_pinned_to_it(compose: dict) -> None:
    env = compose["services"]["airflow-triggerer"]["environment"]
    config = SpeculativeConfig().with_overrides({"targets": env["AIRFLOW__SPECULATIVE__TARGETS"]}, "compose")
    assert [t.node_label for t in config.targets] == list(WORKERS)
    for target in config.targets:
        pin = standalone_pin_conf(target.node_label)
        assert {k: target.conf[k] for k in pin} == pin and target.conn_id == "spark_cluster"
        # Drivers run in the triggerer (client mode); executors must reach them by its hostname.
        assert target.conf["spark.driver.host"] == compose["services"]["airflow-triggerer"]["hostname"]
    conn = json.loads(env["AIRFLOW_CONN_SPARK_CLUSTER"])
    assert conn["host"] == MASTER_URL and conn["extra"]["deploy-mode"] == "client"
    for name, connect in zip(("A", "B"), WORKERS.values(), strict=True):
        assert json.loads(env[f"AIRFLOW_CONN_SPARK_CONNECT_{name}"])["host"] == f"sc://{connect}"


def test_store_is_one_shared_volume_at_the_same_path_everywhere(compose: dict) -> None:
    assert "speculative-store" in compose["volumes"]
    env = compose["services"]["airflow-scheduler"]["environment"]
    assert store_root_path(env["AIRFLOW__SPECULATIVE__STORE_PATH"]) == STORE
    # Whoever plans, drives, runs or shows attempts reads and writes the same store.
    for name in [*AIRFLOW, *WORKERS, *WORKERS.values()]:
        assert f"speculative-store:{STORE}" in compose["services"][name]["volumes"], name


def test_published_ports_are_loopback_only(compose: dict) -> None:
    published = {name: s.get("ports", []) for name, s in compose["services"].items() if s.get("ports")}
    assert published == {"airflow-api-server": ["127.0.0.1:8080:8080"], "spark-master": ["127.0.0.1:8081:8081"]}


def test_image_has_java_and_the_provider() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM apache/airflow:3.3." in dockerfile and "-python3.11" in dockerfile
    assert "openjdk-17" in dockerfile and "pip install" in dockerfile and "/opt/provider" in dockerfile


def test_image_builds_the_commit_jar_where_the_servers_and_attempts_look_for_it() -> None:
    """Exchanges in the compose deployment are written through the provider's commit protocol, as locally."""
    from airflow_provider_speculative.backends.commitjar import JAR_ENV
    from airflow_provider_speculative.store.manifest import COMMIT_JAR_PREFIX

    dockerfile = (DOCKER / "Dockerfile").read_text()
    # javac compiles it: a JDK, not only a runtime.
    assert "openjdk-17-jdk-headless" in dockerfile and "jre-headless" not in dockerfile
    assert "python -m airflow_provider_speculative.backends.commitjar --output" in dockerfile
    assert f"mv /tmp/commit-jar/speculative-commit-*.jar {COMMIT_JAR}" in dockerfile
    assert f"ENV {JAR_ENV}={COMMIT_JAR}" in dockerfile
    assert COMMIT_JAR.rsplit("/", 1)[1].startswith(COMMIT_JAR_PREFIX)


def test_every_long_running_service_has_a_health_check_and_restarts(compose: dict) -> None:
    """As in Airflow's own compose file: a service that is up is also checked to be healthy."""
    for name, service in compose["services"].items():
        if name == "airflow-init":
            assert service["restart"] == "no"  # a one-shot migration
            continue
        assert service.get("restart") == "always", name
        check = service.get("healthcheck") or {}
        assert check.get("test") and check.get("interval"), f"{name} has no health check"
    # The scheduler's check needs its health endpoint switched on.
    env = compose["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "True"
    assert "8974/health" in " ".join(compose["services"]["airflow-scheduler"]["healthcheck"]["test"])
    # Spark services start in order, each after the one it registers with is healthy.
    for worker, connect in WORKERS.items():
        assert compose["services"][worker]["depends_on"]["spark-master"]["condition"] == "service_healthy"
        assert compose["services"][connect]["depends_on"][worker]["condition"] == "service_healthy"


def test_the_asset_events_connection_points_at_the_api_server_and_parses(compose: dict) -> None:
    """Sink stages end in the triggerer: the connection reaches the api-server service the others use."""
    from types import SimpleNamespace

    from airflow_provider_speculative.hooks.asset_events import AssetApiConnection

    env = compose["services"]["airflow-triggerer"]["environment"]
    conn = json.loads(env["AIRFLOW_CONN_SPECULATIVE_API"])
    parsed = AssetApiConnection.from_connection(
        SimpleNamespace(conn_id="speculative_api", host=conn["host"], schema="", port=None, login=conn["login"],
                        password=conn["password"], extra_dejson=conn.get("extra") or {}), "docker-compose.yml")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"{parsed.base_url}/execution/"
