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


def test_a_static_conf_refused_by_the_server_is_named_without_its_value(
        shared_connect_pool: ConnectPool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_speculative.runtime import session

    monkeypatch.setenv(session.REMOTE_ENV, shared_connect_pool.servers[0].url + "/")
    secret = "s3cr3t-token-value-42"
    opened = session.open_session("refused-conf", {"spark.executor.memory": secret,
                                                   "spark.hadoop.fs.s3a.secret.key.unused": secret}, "t-refused")
    try:
        err = capsys.readouterr().err
        assert "spark_conf spark.executor.memory ignored on a Spark Connect target" in err, err
        assert secret not in err
    finally:
        opened.spark.stop()
