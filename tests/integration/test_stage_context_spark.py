"""The stage application contract on a real Connect server: the session exists from ``with StageContext`` on."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_speculative.pipeline import Pipeline, parquet_source
from tests.integration.connect_runner import ConnectPool, committed_table, run_pipeline

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

APP = Path(__file__).resolve().parent / "apps" / "expression_first.py"


def test_column_expression_before_the_first_read(shared_connect_pool: ConnectPool, tmp_path: Path) -> None:
    data = tmp_path / "rows"
    data.mkdir()
    for part in range(2):
        pq.write_table(pa.table({"id": [part * 10 + i for i in range(3)]}), data / f"part-{part}.parquet")
    pipeline = Pipeline("expr_first")
    pipeline.stage("double", application=str(APP), parallelism=2, inputs={"rows": parquet_source(str(data))})
    run_pipeline(shared_connect_pool, pipeline.graph(), tmp_path / "store", "run1")
    rows = sorted(committed_table(tmp_path / "store", "expr_first", "run1", "double").to_pylist(),
                  key=lambda r: r["id"])
    assert rows == [{"id": i, "doubled": 2 * i} for i in (0, 1, 2, 10, 11, 12)]


def test_a_static_conf_refused_by_the_server_is_named_without_its_value(shared_connect_pool: ConnectPool) -> None:
    import os
    import subprocess
    import sys

    from airflow_provider_speculative.core.contract import REMOTE_ENV

    secret = "s3cr3t-token-value-42"
    # In a process of its own, as an attempt: a Connect session marks its process as a Connect client.
    probe = ("from airflow_provider_speculative.runtime.session import open_session\n"
             f"opened = open_session('refused-conf', {{'spark.executor.memory': {secret!r}}}, 't-refused')\n"
             "opened.spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, REMOTE_ENV: shared_connect_pool.servers[0].url + "/"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "spark_conf spark.executor.memory ignored on a Spark Connect target" in done.stderr, done.stderr[-2000:]
    assert secret not in done.stderr and secret not in done.stdout
