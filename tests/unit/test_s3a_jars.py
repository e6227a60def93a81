"""The s3a jars match pyspark's Hadoop; `local-cluster start --s3/--jars/--conf` builds the servers' settings."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from airflow_provider_speculative.cli.local_cluster import server_conf, warm_up_store
from airflow_provider_speculative.devtools.localcluster import LocalClusterError, jar_paths, pyspark_hadoop_version
from airflow_provider_speculative.hooks.objectstore import S3Settings, spark_s3_conf

POM = Path(__file__).resolve().parents[2] / "jars" / "s3a" / "pom.xml"


def s3a_jars_default() -> str:
    """Where the provider looks for the s3a jars without $SPECULATIVE_S3A_JARS."""
    import os

    from airflow_provider_speculative.devtools import localcluster

    saved = os.environ.pop(localcluster.S3A_JARS_ENV, None)
    try:
        return localcluster.s3a_jars()
    except LocalClusterError as exc:  # not fetched on this machine: the message names the directory
        return str(exc).rsplit("(", 1)[1].rstrip(")")
    finally:
        if saved is not None:
            os.environ[localcluster.S3A_JARS_ENV] = saved


def test_hadoop_aws_follows_pysparks_hadoop():
    bundled = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    assert len(bundled) == 1, bundled
    hadoop = re.fullmatch(r"hadoop-client-api-(.+)\.jar", bundled[0]).group(1)
    assert pyspark_hadoop_version() == hadoop
    # `make jars` sets the property; the pom's hadoop-aws must take its version from it.
    assert re.search(r"<artifactId>hadoop-aws</artifactId>\s*<version>\$\{hadoop.version\}</version>", POM.read_text())
    assert Path(s3a_jars_default()).name == f"s3a-{hadoop}"


def test_spark_conf_has_endpoint_and_no_secret():
    settings = S3Settings(endpoint_url="http://127.0.0.1:9000", region="eu-west-1", access_key="AKIAX",
                          secret_key="s3cr3t-value", session_token="tok3n-value")
    conf = spark_s3_conf(settings)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    # Create and mkdir without probes; deletes keep recreating a parent's marker (a committer lists it after).
    assert conf["spark.hadoop.fs.s3a.performance.flags"] == "create,mkdir"
    text = repr(conf) + repr(settings)
    assert "s3cr3t-value" not in text and "tok3n-value" not in text and "AKIAX" not in repr(settings)
    # AWS itself: no endpoint override, no path-style access.
    assert "spark.hadoop.fs.s3a.endpoint" not in spark_s3_conf(S3Settings(region="us-east-1"))


def test_server_conf_from_cli_options(tmp_path, monkeypatch):
    (tmp_path / "b.jar").write_bytes(b"")
    (tmp_path / "a.jar").write_bytes(b"")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9100")
    monkeypatch.setenv("SPECULATIVE_S3A_JARS", str(tmp_path))
    conf = server_conf(["spark.sql.shuffle.partitions=4", "spark.x=a=b"], None, s3=True)
    assert conf["spark.jars"] == f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9100"
    assert conf["spark.sql.shuffle.partitions"] == "4" and conf["spark.x"] == "a=b"
    with pytest.raises(LocalClusterError, match="expected KEY=VALUE"):
        server_conf(["no-equals-sign"], None, s3=False)
    with pytest.raises(LocalClusterError, match="does not exist"):
        jar_paths(str(tmp_path / "missing.jar"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LocalClusterError, match="has no"):
        jar_paths(str(empty))


def test_warm_up_store_is_the_option_else_an_s3_store_path_and_only_with_s3(monkeypatch):
    assert warm_up_store("s3://bucket/store", s3=True) == "s3://bucket/store"
    with pytest.raises(LocalClusterError, match="needs --s3"):
        warm_up_store("s3://bucket/store", s3=False)
    with pytest.raises(LocalClusterError, match="expected an s3://bucket/prefix URL"):
        warm_up_store("/var/store", s3=True)
    # The suite's store_path is a local directory: nothing to warm on S3.
    assert warm_up_store(None, s3=True) is None
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__EXPERIMENTAL_S3_STORE", "True")
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", "s3://bucket/prefix")
    assert warm_up_store(None, s3=True) == "s3://bucket/prefix"
    assert warm_up_store(None, s3=False) is None
    # A configuration that cannot be read is the CLI's clear error, not a traceback.
    monkeypatch.setenv("AIRFLOW__SPECULATIVE__STORE_PATH", "relative/store")
    with pytest.raises(LocalClusterError, match=r"cannot tell whether \[speculative\] store_path is on S3"):
        warm_up_store(None, s3=True)


def test_negative_warm_up_rounds_are_the_clis_one_line_error(tmp_path, capsys):
    import argparse

    from airflow_provider_speculative.cli.local_cluster import local_cluster

    args = argparse.Namespace(action="start", directory=str(tmp_path / "pool"), warm_up_rounds=-1, s3=False,
                              conf=[], jars=None, warm_up_store=None, servers=1, base_port=15002,
                              ui_base_port=4050, cores=1, output="table")
    with pytest.raises(SystemExit) as exited:
        local_cluster(args)
    assert exited.value.code == 1
    assert capsys.readouterr().err == "error: --warm-up-rounds -1: expected 0 or more (0: no warm-up query)\n"
    assert not (tmp_path / "pool").exists()
