"""The store itself on S3 (``experimental_s3_store``), end to end on the suite's S3 endpoint and Connect pool.

Q1 (``connect_q1``: a scan of two subtasks, an exchange, the final aggregate into a local Parquet sink)
runs through ``dag.test()`` with ``store_path = s3://…``: planning writes its plans by name, attempts
read their plans from the ``s3://`` URL and write their exchange output through s3a, the controller
observes and commits them by name, and the answer equals DuckDB's. No file of the run is written
under the local store root, and the S3 secret key is in no object of the store.
"""

from __future__ import annotations

import pendulum
import pytest

from airflow_provider_speculative.control.readmodel import run_report
from airflow_provider_speculative.store.layout import MANIFEST_FILE
from tests import services
from tests.conftest import TEST_ENV
from tests.integration.conftest import WARM_UP_NEIGHBOUR
from tests.integration.q1 import assert_q1_equal, duckdb_q1, read_q1_output
from tests.integration.spark_helpers import HERE, load_dag

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_q1_with_its_store_on_s3_equals_duckdb(airflow_db, tpch_data, connect_pool, s3_store, monkeypatch, tmp_path):
    from pathlib import Path

    _, store = s3_store
    server = services.s3()
    output = tmp_path / "output"
    monkeypatch.setenv("SPECULATIVE_EXAMPLE_OUTPUT", str(output))  # read when the DAG folder is parsed
    local_root = Path(TEST_ENV["AIRFLOW__SPECULATIVE__STORE_PATH"])
    before = {p for p in local_root.rglob("*")} if local_root.exists() else set()

    run = load_dag("connect_q1", HERE / "dags").test(logical_date=pendulum.datetime(2026, 5, 2, tz="UTC"))
    assert run.state == "success"
    assert_q1_equal(read_q1_output(output / "connect_q1" / "2026-05-02"), duckdb_q1(tpch_data))

    report = run_report(store, "connect_q1", run.run_id)
    assert {s["stage"] for s in report["stages"]} == {"scan", "aggregate"}
    assert all(s.get("committed") for s in report["stages"]), report["stages"]
    names = [info.name for info in store.stat_all(f"connect_q1/{safe(run.run_id)}")]
    # Both stages' manifests and the exchange's Parquet files are objects of the store (a sample on failure).
    assert sum(n.endswith("/" + MANIFEST_FILE) for n in names) >= 3, names[:20]
    assert any(n.endswith(".parquet") for n in names), names[:20]
    secret = server.secret_key.encode()
    leaked = [n for n in names if not n.endswith(".parquet") and secret in (store.read(n) or b"")]
    assert not leaked, f"the S3 secret key is in {leaked}"
    after = {p for p in local_root.rglob("*")} if local_root.exists() else set()
    assert not {p for p in after - before if "connect_q1" in str(p)}, "the run wrote under the local store root"


def safe(run_id: str) -> str:
    """The store's directory name of a run id (store/layout.py)."""
    from airflow_provider_speculative.store.layout import safe_component

    return safe_component(run_id)


def test_the_pools_warm_up_wrote_an_exchange_on_s3_and_deleted_only_its_own_prefix(shared_connect_pool):
    """`local-cluster start --s3` on an S3 store: each server's warm-up wrote there, read back, and cleaned up."""
    from airflow_provider_speculative.store.roots import open_store

    servers = shared_connect_pool.servers
    assert all(isinstance(s.extra.get("warm_up"), int | float) for s in servers), \
        {s.name: s.extra.get("warm_up") for s in servers}
    # Per server: at least two rounds' data files and markers, and the prefix's ownership marker.
    assert all((s.extra.get("warm_up_store_objects") or 0) >= 5 for s in servers), \
        {s.name: s.extra.get("warm_up_store_objects") for s in servers}
    # Its own prefixes are gone; an object it did not write, next to them under _warm-up/, is still there.
    assert open_store(shared_connect_pool.warm_up_store).list_names() == [WARM_UP_NEIGHBOUR]
