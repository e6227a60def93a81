"""Object-store source URLs are judged from their text when the DAG is parsed (core/paths.py, core/graph.py)."""

from __future__ import annotations

import pytest

from airflow_provider_speculative import Pipeline, parquet_source
from airflow_provider_speculative.core.paths import (
    glob_match,
    is_object_url,
    object_url_problem,
    redact_url,
    source_root_problem,
    split_object_url,
)
from airflow_provider_speculative.exceptions import PipelineError


@pytest.mark.parametrize("url", ["s3://data-lake/tpch/orders", "s3a://data-lake/tpch/orders/",
                                 "S3://data-lake/x/*.parquet", "s3://my.bucket-1/", "s3://abc"])
def test_good_urls_pass(url):
    assert is_object_url(url)
    assert source_root_problem(url) is None


@pytest.mark.parametrize(("url", "words"), [
    ("s3://AKIAXYZ:VerySecret123@data-lake/x", "carries credentials"),
    ("s3://Data_Lake/x", "is not an S3 bucket name"),
    ("s3://ab/x", "is not an S3 bucket name"),
    ("s3://data-lake/x?versionId=3", "query or fragment"),
    ("s3://data-lake/a/../b", "'..' segments"),
    ("gs://bucket/x", "not supported"),
    ("hdfs://namenode/x", "not supported"),
])
def test_bad_urls_are_refused_without_echoing_secrets(url, words):
    problem = source_root_problem(url)
    assert problem is not None and words in problem
    assert "VerySecret123" not in problem


def test_split_and_redact():
    assert split_object_url("s3://b-1/a/b.parquet") == ("b-1", "a/b.parquet")
    assert split_object_url("s3://b-1") == ("b-1", "")
    assert redact_url("s3://k:s@b/x") == "s3://***@b/x"
    assert redact_url("/local/path") == "/local/path"
    assert object_url_problem("s3://bucket-a/k") is None


def _pipeline(path: str) -> Pipeline:
    pipeline = Pipeline("urls", config={"targets": [{"name": "a", "conn_id": "spark_default", "slots": 1}]})
    pipeline.stage("scan", application="/apps/scan.py", parallelism=2, inputs={"rows": parquet_source(path)})
    return pipeline


def test_parse_accepts_an_s3_source_and_refuses_a_bad_one_naming_the_input():
    _pipeline("s3://data-lake/tpch/orders").graph()
    with pytest.raises(PipelineError) as err:
        _pipeline("s3://KEY:TopSecret@data-lake/tpch").graph()
    message = str(err.value)
    assert "pipeline 'urls'" in message and "'scan'" in message and "'rows'" in message
    assert "TopSecret" not in message
    with pytest.raises(PipelineError, match="not supported"):
        _pipeline("abfs://container@account.dfs.core.windows.net/x").graph()


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("lake/tpch/*.parquet", "lake/tpch/a.parquet", True),
    # `*` stays within one segment, as a local glob: a nested dataset is not read by accident.
    ("lake/tpch/*.parquet", "lake/tpch/old/a.parquet", False),
    ("lake/*/*.1.parquet", "lake/orders/orders.1.parquet", True),
    ("lake/**/*.parquet", "lake/a.parquet", True),
    ("lake/**/*.parquet", "lake/x/y/a.parquet", True),
    ("lake/part-?.parquet", "lake/part-10.parquet", False),
    ("lake/part-[0-3].parquet", "lake/part-2.parquet", True),
])
def test_object_globs_match_like_local_globs(pattern, path, matches):
    assert glob_match(pattern, path) is matches
