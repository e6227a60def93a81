"""Integration fixtures shared across test files: one pool of Spark Connect servers per session, and the
same pool as the connections the Connect test DAGs (tests/integration/dags/connect_q1.py) name."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_speculative.devtools.localcluster import (
    LocalCluster,
    connection_definitions,
    free_base_port,
    jar_paths,
    port_owner,
    s3a_jars,
)
from airflow_provider_speculative.hooks.objectstore import settings_from_environment, spark_s3_conf
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.roots import forget_stores, open_store
from tests import services
from tests.integration.connect_runner import ConnectPool

# Not used by any benchmark (bench 15120-15140/4120-4140,
# demo 15130/4130, the CLI's default 15002/4050).
SHARED_BASE_PORT, SHARED_UI_BASE_PORT = 15150, 4150
SERVERS = 2


def _ports() -> tuple[int, int]:
    # Another session on this machine (engineers share it) may hold the fixed range: then any free one.
    if all(port_owner(SHARED_BASE_PORT + i) is None and port_owner(SHARED_UI_BASE_PORT + i) is None
           for i in range(SERVERS)):
        return SHARED_BASE_PORT, SHARED_UI_BASE_PORT
    return free_base_port(SERVERS), free_base_port(SERVERS)


# The JVM's default tiered compilation (C1 then C2), overriding LIGHT_JVM_OPTIONS' C1-only setting.
PRODUCTION_JIT_OPTION = "-XX:TieredStopAtLevel=4"


# An object in the pool's warm-up store that the warm-up did not write (test_s3_store.py checks it is kept).
WARM_UP_NEIGHBOUR = "_warm-up/theirs/data.bin"


@pytest.fixture(scope="session")
def shared_connect_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectPool]:
    """Two Connect servers of one core each for the whole session (a server costs ~15 s to start).

    Also defined as Airflow connections ``spark_connect_shared_a`` and ``spark_connect_shared_b`` for
    tests that run a DAG. Stopped, and checked gone, when the session ends.
    """
    cluster = LocalCluster(tmp_path_factory.mktemp("shared-connect-pool"))
    base_port, ui_base_port = _ports()
    # The servers serve s3:// from the session's S3 endpoint (test_s3_sources.py): its keys reach s3a through
    # the servers' environment, its address through configuration, as `local-cluster start --s3` does.
    os.environ.update(services.s3().environment())
    conf = {**spark_s3_conf(settings_from_environment()), "spark.jars": ",".join(jar_paths(s3a_jars()))}
    # The pool's servers compile hot code as users' JVMs do (C2), not with the suite's light C1-only JIT: the
    # speed check and the slow-node and speculation tests time their answers against production constants.
    # A later -XX option wins, and the driver's extra options follow SPARK_SUBMIT_OPTS on the command line.
    conf["spark.driver.extraJavaOptions"] = PRODUCTION_JIT_OPTION
    # The warm-up also writes and reads an exchange there, as `local-cluster start --s3` does on an S3 store.
    services.s3().create_bucket("speculative-store")
    warm_up_store = f"s3://speculative-store/warm-up-{uuid.uuid4().hex[:12]}"
    # Someone else's object in that store: the warm-up deletes only the prefix it claimed.
    open_store(warm_up_store).replace(WARM_UP_NEIGHBOUR, b"not the provider's")
    started, _ = cluster.start(servers=SERVERS, base_port=base_port, ui_base_port=ui_base_port, cores=1, conf=conf,
                               warm_up_store=warm_up_store)
    env = {name.replace("LOCAL", "SHARED"): value for name, value in connection_definitions(started).items()}
    os.environ.update(env)
    try:
        yield ConnectPool(tuple(started), warm_up_store=warm_up_store)
    finally:
        for name in env:
            os.environ.pop(name, None)
        cluster.stop()
        left = [s.name for s in started if cluster.process(s) is not None]
        assert not left, f"Connect servers still running after the session: {left}"


@pytest.fixture(scope="module")
def connect_pool(shared_connect_pool: ConnectPool) -> Iterator[dict[str, object]]:
    """The session's two Connect servers (one core each), also as connections spark_connect_test_a/b."""
    started = list(shared_connect_pool.servers)
    env = {name.replace("LOCAL", "TEST"): value for name, value in connection_definitions(started).items()}
    os.environ.update(env)
    try:
        yield {s.url + "/": s for s in started}
    finally:
        for name in env:
            os.environ.pop(name, None)


@pytest.fixture
def s3_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, StoreBackend]]:
    """A fresh store root on the suite's S3 endpoint, configured as this process's ``store_path``."""
    server = services.s3()
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    server.create_bucket("speculative-store")
    root = f"s3://speculative-store/{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", root)
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE", "true")
    forget_stores()
    yield root, open_store(root)
    forget_stores()
