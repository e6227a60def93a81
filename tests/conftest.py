"""Test-wide isolation: a private AIRFLOW_HOME, store, output and StatsD port, set before Airflow is imported."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under CI=true a skip fails unless its reason is a host limit listed in tests/skips.py.
from tests.skips import pytest_runtest_makereport  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".data" / "tpch" / "lineitem"
SESSION_DIR = Path(tempfile.mkdtemp(prefix="speculative-tests-"))


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


STATSD_PORT = _free_udp_port()
# Every JVM the suite starts does seconds of work on tiny data, so its cost is start-up and JIT: the C1-only
# JIT and the serial GC halve it on a 2-core machine (bench/README.md, "Spark conf of every target").
# The shared Connect pool, whose answers the speed check times, keeps C2 (tests/integration/conftest.py).
LIGHT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TEST_ENV = {
    "AIRFLOW_HOME": str(SESSION_DIR / "airflow"),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "integration" / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__SPECULATIVE__STORE_PATH": str(SESSION_DIR / "store"),
    "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[1]"}',
    "AIRFLOW__METRICS__STATSD_ON": "True",
    "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
    "AIRFLOW__METRICS__STATSD_PORT": str(STATSD_PORT),
    "SPECULATIVE_EXAMPLE_DATA": str(DATA),
    "SPECULATIVE_EXAMPLE_OUTPUT": str(SESSION_DIR / "output"),
    # As in a real deployment, workers and the api-server share [speculative]: operator extra links
    # are computed by the worker when the task ends (Airflow 3 stores them in XCom).
    "AIRFLOW__SPECULATIVE__SPARK_HISTORY_URL": "http://spark-history.invalid:18080",
    # The targets the suite was written for (two local targets, 2 slots each), whatever the host's cores:
    # unset, [speculative] targets follows the cores (settings.host_default_targets), machine by machine.
    "AIRFLOW__SPECULATIVE__TARGETS": json.dumps([
        {"name": name, "conn_id": "spark_default", "slots": 2, "conf": {"spark.ui.enabled": "false"}}
        for name in ("local-a", "local-b")]),
    # The fork servers the tests start (backends/forkserver.py) are the session's: stopped at its end.
    "XDG_RUNTIME_DIR": str(SESSION_DIR / "run"),
    # Light JVMs for what spark-submit starts (attempt drivers, Connect servers, the attempts of Airflow
    # deployments: they inherit this environment) and for standalone masters and workers. Options the caller
    # set come after these, so they win.
    **{name: " ".join(filter(None, (LIGHT_JVM_OPTIONS, os.environ.get(name))))
       for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")},
}
(SESSION_DIR / "run").mkdir()
os.environ.update(TEST_ENV)


@pytest.fixture(autouse=True)
def airflow_deprecations_fail_our_code() -> Iterator[None]:
    """Airflow's deprecations are shown, and fail the test where this package or its tests cause them.

    The next Airflow release removes what they name; hidden, that breaks silently.
    """
    from airflow.exceptions import AirflowProviderDeprecationWarning, RemovedInAirflow4Warning
    from airflow.utils.deprecation_tools import DeprecatedImportWarning

    categories = (RemovedInAirflow4Warning, AirflowProviderDeprecationWarning, DeprecatedImportWarning)
    with warnings.catch_warnings():
        for category in categories:
            warnings.filterwarnings("default", category=category)
        for category in categories:  # later filters win: ours fail
            for module in ("airflow_provider_speculative", "tests"):
                warnings.filterwarnings("error", category=category, module=module)
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the session's fork servers (they would idle on for ten minutes) and its PostgreSQL and Redis."""
    from airflow_provider_speculative.backends import forkserver
    from tests import services

    forkserver.stop_servers()
    services.stop_all()


@pytest.fixture(autouse=True)
def _no_target_speed_history() -> None:
    """Every test starts without the target speed records earlier tests left in the session's store.

    Placement reads them (core/speed.py): a test whose fault injection slowed ``local-b`` would make the
    next test's first wave avoid it. A test that wants history writes it itself.
    """
    for record in (SESSION_DIR / "store" / "_targets").glob("*/speed.json"):
        record.unlink(missing_ok=True)
    for probes in (SESSION_DIR / "store" / "_targets").glob("*/probes"):
        shutil.rmtree(probes, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata DB in the session's AIRFLOW_HOME."""
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **TEST_ENV})
    return Path(TEST_ENV["AIRFLOW_HOME"])


@pytest.fixture(scope="session")
def tpch_data() -> Path:
    """The lineitem parts `make data` generates (make test generates them before pytest runs)."""
    if not (DATA / ".done").exists():
        pytest.skip(f"TPC-H data missing at {DATA}: run `make data`")
    return DATA
