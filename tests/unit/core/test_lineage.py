"""Stage lineage from a run's plans: sources, exchanges, and a sink stage that carries the whole pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_speculative.core.lineage import (
    LineageDataset,
    dataset_of_uri,
    exchange_dataset,
    source_dataset,
    stage_lineage,
)
from tests.factories import stage_plan


def _source(path: str) -> dict[str, Any]:
    return {"kind": "source", "format": "parquet", "path": path}


def _exchange(upstream: str) -> dict[str, Any]:
    return {"kind": "exchange", "upstream": upstream, "distribution": "all_to_all"}


# q3's shape: two scans feed a join, a third scan joins later, the top stage commits (a diamond at "join2").
PLANS = {
    "customers": stage_plan(dag_id="q3", stage="customers", inputs={"rows": _source("/data/customer/")}),
    "orders": stage_plan(dag_id="q3", stage="orders", inputs={"rows": _source("/data/orders")}),
    "lineitem": stage_plan(dag_id="q3", stage="lineitem", inputs={"rows": _source("/data/lineitem")}),
    "join1": stage_plan(dag_id="q3", stage="join1", inputs={"c": _exchange("customers"), "o": _exchange("orders")}),
    "join2": stage_plan(dag_id="q3", stage="join2", inputs={"j": _exchange("join1"), "l": _exchange("lineitem"),
                                                             "o": _exchange("orders")}),
    "top": stage_plan(dag_id="q3", stage="top", inputs={"j": _exchange("join2")}),
}
SINK = LineageDataset("file", "/out/q3")


def test_an_intermediate_stage_reads_its_sources_and_exchanges_and_writes_its_exchange() -> None:
    assert stage_lineage(PLANS, "customers", None) == (
        [LineageDataset("file", "/data/customer")], [exchange_dataset("q3", "customers")])
    inputs, outputs = stage_lineage(PLANS, "join2", None)
    assert inputs == sorted(exchange_dataset("q3", s) for s in ("join1", "lineitem", "orders"))
    assert outputs == [LineageDataset("speculative", "q3/join2")]


def test_the_sink_stage_names_every_source_upstream_once() -> None:
    inputs, outputs = stage_lineage(PLANS, "top", SINK)
    assert outputs == [SINK]
    assert inputs == [LineageDataset("file", "/data/customer"), LineageDataset("file", "/data/lineitem"),
                      LineageDataset("file", "/data/orders"), exchange_dataset("q3", "join2")]


@pytest.mark.parametrize(("uri", "dataset"), [
    ("file:///out/q1", LineageDataset("file", "/out/q1")),
    ("file:///out/q1/", LineageDataset("file", "/out/q1")),
    ("postgres://db.example:6432/sales/public/daily",
     LineageDataset("postgres://db.example:6432", "sales.public.daily")),
    ("postgres://db.example/sales/public/daily",
     LineageDataset("postgres://db.example:5432", "sales.public.daily")),
    (None, None), ("", None),
])
def test_asset_uris_become_openlineage_names(uri: str | None, dataset: LineageDataset | None) -> None:
    assert dataset_of_uri(uri) == dataset


@pytest.mark.parametrize(("path", "dataset"), [
    ("/data/tpch/orders", LineageDataset("file", "/data/tpch/orders")),
    ("s3://lake/tpch/orders/", LineageDataset("s3://lake", "tpch/orders")),
    ("s3a://lake/tpch/orders/part-0.parquet", LineageDataset("s3://lake", "tpch/orders/part-0.parquet")),
])
def test_sources_follow_openlineage_naming(path: str, dataset: LineageDataset) -> None:
    assert source_dataset(path) == dataset
