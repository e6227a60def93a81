"""Fixtures shared by the unit tests of the operator and the triggers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local Spark connection, a store under ``tmp_path``, a two-file Parquet source ``src/`` and ``app.py``."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", str(tmp_path / "store"))
    source = tmp_path / "src"
    source.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"k": [i], "v": [i * 10]}), source / f"part-{i}.parquet")
    (tmp_path / "app.py").write_text("# stage application\n")
    return tmp_path
