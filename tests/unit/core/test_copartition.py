"""The co-partitioning contract: key families, key-type and partitioning checks, default alignment."""

from __future__ import annotations

import pytest

from airflow_provider_speculative.core.copartition import (
    HASH_SCHEME,
    STRING_HASH_SCHEME,
    check_key_types,
    check_partitioning,
    exchange_output_problem,
    hashes_as_bigint,
    hybrid_key_refusal,
    key_cast,
    key_family,
)
from airflow_provider_speculative.exceptions import PlanError
from airflow_provider_speculative.pipeline import Pipeline, all_to_all, parquet_source


def schema(**columns: object) -> dict:
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                         for n, t in columns.items()]}


@pytest.mark.parametrize(("spark_type", "family"), [
    ("byte", "integer"), ("short", "integer"), ("integer", "integer"), ("long", "integer"),
    ("decimal(12,0)", "integer"), ("decimal(12,2)", "decimal(scale 2)"), ("decimal(38,2)", "decimal(scale 2)"),
    ("string", "string"), ("varchar(10)", "string"), ("char(3)", "string"), ("void", None),
    ("date", "date"), ("timestamp", "timestamp"), ("timestamp_ntz", "timestamp_ntz"), ("double", "floating"),
])
def test_key_family_unifies_what_hashes_alike_as_a_string(spark_type: str, family: str | None) -> None:
    assert key_family(spark_type) == family


def test_nested_key_types_unify_integer_widths() -> None:
    ints = {"type": "array", "elementType": "integer", "containsNull": True}
    longs = {"type": "array", "elementType": "long", "containsNull": True}
    assert key_family(ints) == key_family(longs)


def test_integer_widths_mix_and_nulls_match_anything() -> None:
    check_key_types("w", {"l": (["id"], [schema(id="integer")]), "r": (["k"], [schema(k="long"), schema(k="void")])})


def test_every_producer_subtask_schema_is_compared() -> None:
    with pytest.raises(PlanError, match=r"w: key column 1 differs in type between inputs: 'l'.id is integer, "
                                        r"'l'.id is string"):
        check_key_types("w", {"l": (["id"], [schema(id="integer"), schema(id="string")])})


def test_second_key_column_is_compared_by_position() -> None:
    with pytest.raises(PlanError, match=r"key column 2 differs in type between inputs: 'l'.d is date, 'r'.e is string"):
        check_key_types("w", {"l": (["id", "d"], [schema(id="long", d="date")]),
                              "r": (["k", "e"], [schema(k="integer", e="string")])})


def test_missing_key_column_is_named() -> None:
    with pytest.raises(PlanError, match=r"w, input 'l': key column 'id' is not in the producer's output"):
        check_key_types("w", {"l": (["id"], [schema(other="long")])})


def test_partitioning_of_another_count_or_scheme_is_refused() -> None:
    current = {"key": ["id"], "max_parallelism": 8, "hash": HASH_SCHEME}
    check_partitioning("w", {"l": (8, [current, current]), "r": (8, [current])})
    with pytest.raises(PlanError, match=r"w, input 'l': its producer committed 8 hash subpartitions, the plan "
                                        r"expects 16"):
        check_partitioning("w", {"l": (16, [current])})
    with pytest.raises(PlanError, match=rf"hash-partitioned by different schemes: {HASH_SCHEME} \('l'\), "
                                        r"legacy \('r'\)"):
        check_partitioning("w", {"l": (8, [current]), "r": (8, [None])})


def test_pipeline_aligns_default_max_parallelism_of_joined_producers() -> None:
    p = Pipeline("p")
    a = p.stage("a", application="/a.py", parallelism=40, inputs={"x": parquet_source("/x")})
    b = p.stage("b", application="/b.py", parallelism=2, inputs={"y": parquet_source("/y")})
    c = p.stage("c", application="/c.py", parallelism=2, inputs={"z": parquet_source("/z")}, max_parallelism=64)
    j = p.stage("j", application="/j.py", parallelism=4, inputs={"l": all_to_all(a, key="id"),
                                                                  "r": all_to_all(b, key="id")})
    p.stage("k", application="/k.py", parallelism=4, inputs={"l": all_to_all(j, key="id"),
                                                              "r": all_to_all(c, key="id")})
    graph = p.graph()
    # a and b: no declared value, the larger default (40); j joins c, which declares 64.
    assert graph.stages["a"].max_parallelism == graph.stages["b"].max_parallelism == 40
    assert graph.stages["j"].max_parallelism == graph.stages["c"].max_parallelism == 64


def _zone(zone: str) -> dict:
    return {"key": ["ts"], "max_parallelism": 8, "hash": HASH_SCHEME, "session_time_zone": zone}


def test_a_hybrid_producer_is_checked_against_the_other_inputs_when_it_first_commits() -> None:
    blocking = (["id"], [(schema(id="long"), None), (schema(id="integer"), None)])
    where = "pipeline 'p', stage 'j'"
    # Integer widths mix; a producer output without a schema yet is skipped.
    assert hybrid_key_refusal(where, "r", "b", {"l": blocking, "r": (["k"], [(schema(k="short"), None)])}) is None
    assert hybrid_key_refusal(where, "r", "b", {"l": blocking, "r": (["k"], [(None, None)])}) is None
    refusal = hybrid_key_refusal(where, "r", "b", {"l": blocking, "r": (["k"], [(schema(k="string"), None)])})
    assert refusal == (
        "pipeline 'p', stage 'j': key column 1 differs in type between inputs: 'l'.id is long, 'r'.k is string; "
        "equal values would not meet in one subtask. Cast one side in its producer (integer widths mix freely; "
        "decimals need the same scale) (input 'r' is a hybrid exchange: producer 'b' was checked when its first "
        "subtask was admitted, before any attempt of this stage read it)")


def test_a_hybrid_producer_alone_is_checked_for_collations_floats_and_zones() -> None:
    collated = schema(k="string")
    collated["fields"][0]["metadata"] = {"__COLLATIONS": {"k": "spark.UTF8_LCASE"}}
    refusal = hybrid_key_refusal("w", "r", "b", {"r": (["k"], [(collated, None)])})
    assert refusal is not None and refusal.startswith("w, input 'r': key column 'k' has collation UTF8_LCASE")
    refusal = hybrid_key_refusal("w", "r", "b", {"r": (["k"], [(schema(k="double"), None)])})
    assert refusal is not None and "floating-point keys are refused" in refusal and "producer 'b'" in refusal
    ts = schema(ts="timestamp")
    zones = {"l": (["ts"], [(ts, _zone("UTC"))]), "r": (["ts"], [(ts, _zone("Asia/Tokyo"))])}
    refusal = hybrid_key_refusal("w", "r", "b", zones)
    assert refusal is not None and "('r'.ts in Asia/Tokyo, 'l'.ts in UTC)" in refusal
    assert hybrid_key_refusal("w", "r", "b", {**zones, "r": (["ts"], [(ts, _zone("UTC"))])}) is None


@pytest.mark.parametrize(("spark_type", "scheme", "as_bigint"), [
    ("byte", HASH_SCHEME, True), ("short", HASH_SCHEME, True), ("integer", HASH_SCHEME, True),
    ("long", HASH_SCHEME, True), ("decimal(12,0)", HASH_SCHEME, True), ("decimal(38,0)", HASH_SCHEME, True),
    ("decimal(12,2)", HASH_SCHEME, False), ("string", HASH_SCHEME, False), ("date", HASH_SCHEME, False),
    ("timestamp", HASH_SCHEME, False), ({"type": "array", "elementType": "integer", "containsNull": True},
                                        HASH_SCHEME, False),
    # A plan of the string scheme (or none: the oldest) keeps its writers hashing every column as text.
    ("long", STRING_HASH_SCHEME, False), ("integer", None, False),
])
def test_only_the_integer_family_hashes_as_bigint_and_only_under_the_current_scheme(spark_type, scheme,
                                                                                     as_bigint) -> None:
    assert hashes_as_bigint(spark_type, scheme) is as_bigint


@pytest.mark.parametrize(("spark_type", "scheme", "cast"), [
    ("integer", HASH_SCHEME, ("bigint", False)), ("long", HASH_SCHEME, ("bigint", False)),
    # A decimal(38,0) beyond the bigint range becomes null rather than failing the attempt's write.
    ("decimal(38,0)", HASH_SCHEME, ("bigint", True)), ("decimal(12,2)", HASH_SCHEME, ("string", False)),
    ("string", HASH_SCHEME, ("string", False)), ("long", STRING_HASH_SCHEME, ("string", False)),
])
def test_key_cast_names_the_type_and_the_lenient_cast(spark_type, scheme, cast) -> None:
    assert key_cast(spark_type, scheme) == cast


@pytest.mark.parametrize(("columns", "problem"), [
    (["k", "v"], None),
    (["v"], "lacks exchange key columns ['k'] (columns: ['v'])"),
    (["k", "_sp"], "has a column named '_sp', which an exchange reserves"),
    (["k", "_SP", "v"], "has a column named '_SP', which an exchange reserves"),
])
def test_a_keyed_output_needs_its_key_and_must_not_carry_the_subpartition_column(
        columns: list[str], problem: str | None) -> None:
    found = exchange_output_problem(columns, ["k"], "_sp")
    assert found is None if problem is None else problem in found
