"""Stage lineage from a run's plans: sources, exchanges, and a sink stage that carries the whole pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_speculative.core.lineage import (
    LineageDataset,
    LineageEvent,
    OutputStats,
    dataset_of_uri,
    error_text,
    exchange_dataset,
    output_stats,
    provider_events,
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


@pytest.mark.parametrize(("uri", "dataset"), [
    ("mysql://loader:hunter2@db:3306/sales/t", LineageDataset("mysql://db:3306", "sales/t")),
    ("postgres://loader:hunter2@db:5432/sales/public/t", LineageDataset("postgres://db:5432", "sales.public.t")),
])
def test_a_uri_with_userinfo_names_its_dataset_without_it(uri: str, dataset: LineageDataset) -> None:
    assert dataset_of_uri(uri) == dataset


@pytest.mark.parametrize(("path", "dataset"), [
    ("s3a://AKIA:hunter2@lake/tpch/orders", LineageDataset("s3://lake", "tpch/orders")),
    ("hdfs://etl:hunter2@nn:8020/data/x/", LineageDataset("hdfs://nn:8020", "data/x")),
])
def test_a_source_url_with_userinfo_names_its_dataset_without_it(path: str, dataset: LineageDataset) -> None:
    assert source_dataset(path) == dataset


@pytest.mark.parametrize(("ran_on_worker", "ended_in_triggerer", "succeeded", "events"), [
    # Started in the triggerer and ended there: no worker ever ran it, no listener saw it.
    (False, True, True, (LineageEvent.START, LineageEvent.COMPLETE)),
    (False, True, False, (LineageEvent.START, LineageEvent.FAIL)),
    # A worker ran execute() and deferred: the listener sent START there.
    (True, True, True, (LineageEvent.COMPLETE,)),
    (True, True, False, (LineageEvent.FAIL,)),
    # Resumed on a worker (to commit, publish, or fail): the listener reports the whole try.
    (False, False, True, ()), (False, False, False, ()), (True, False, True, ()), (True, False, False, ()),
])
def test_the_provider_emits_only_what_airflows_listener_cannot(
        ran_on_worker: bool, ended_in_triggerer: bool, succeeded: bool, events: tuple[LineageEvent, ...]) -> None:
    assert provider_events(ran_on_worker=ran_on_worker, ended_in_triggerer=ended_in_triggerer,
                           succeeded=succeeded) == events


def test_output_stats_sum_the_admitted_attempts_and_name_the_columns() -> None:
    schema = {"type": "struct", "fields": [{"name": "k", "type": "long"}, {"name": "m", "type": {"type": "map"}},
                                           {"name": "odd", "type": 7}, {"no": "name"}]}
    committed = {"subtasks": {"0": {"records": 3, "bytes": 30, "file_count": 2, "schema": schema},
                              "1": {"records": 1, "bytes": 10, "files": [{"path": "a"}], "schema": None}}}
    assert output_stats(committed) == OutputStats(rows=4, bytes=40, files=3,
                                                  fields=(("k", "long"), ("m", "map"), ("odd", "unknown")))
    # A subtask without a count (an older manifest): the total is unknown, not a partial sum.
    partial = {"subtasks": {"0": {"records": 3, "bytes": 30}, "1": {"bytes": 5}}}
    assert output_stats(partial) == OutputStats(rows=None, bytes=35, files=None, fields=())
    assert output_stats({}) == OutputStats(rows=None, bytes=None, files=None, fields=())


def test_error_text_is_bounded_printable_and_hides_userinfo() -> None:
    text = error_text("connect postgres://u:pw@h/db failed\x1b[31m\r\n\tnext line\x00 \u2028", limit=1000)
    assert text == "connect postgres://***@h/db failed\\x1b[31m\\x0d\n\\x09next line\\x00 \\u2028"
    long = error_text("x" * 50, limit=10)
    assert long == "x" * 10 + "... (40 more characters)"
