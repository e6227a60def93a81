"""Spark Connect URL composition: each attempt gets its own session id; secrets never reach the store."""

from __future__ import annotations

import json

import pytest

from airflow_provider_speculative.backends.spark_connect import compose_url, public_url, split_url
from airflow_provider_speculative.devtools.localcluster import (
    LocalClusterError,
    ServerInfo,
    connection_definitions,
    server_names,
    targets_json,
)
from airflow_provider_speculative.hooks.targets import connect_url

SID = "0b5c6a1e-7a3f-4b0e-9a55-6f0d1b2c3d4e"


def test_plain_url_gets_user_and_session():
    assert compose_url("sc://127.0.0.1:15002/", session_id=SID, user_id="speculative") == (
        f"sc://127.0.0.1:15002/;user_id=speculative;session_id={SID}")


def test_url_without_trailing_slash_and_without_params():
    assert compose_url("sc://h:1", session_id=SID) == f"sc://h:1/;session_id={SID}"


def test_connection_user_and_token_are_kept_and_session_is_replaced():
    url = compose_url("sc://h:15002/;user_id=alice;token=s3cr%3Bet;session_id=shared;use_ssl=true",
                      session_id=SID, user_id="speculative")
    base, params = split_url(url)
    assert base == "sc://h:15002/"
    assert params == {"user_id": "alice", "token": "s3cr;et", "use_ssl": "true", "session_id": SID}


def test_composed_url_is_what_pyspark_parses():
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    builder = DefaultChannelBuilder(compose_url("sc://h:15002/;user_id=al%20ice;token=t%3Bk", session_id=SID))
    assert (builder.host, builder.session_id, builder.userId, builder.token) == ("h", SID, "al ice", "t;k")


def test_public_url_drops_the_token():
    assert public_url(f"sc://h:1/;user_id=u;token=secret;session_id={SID}") == "sc://h:1/;user_id=u"
    assert "secret" not in public_url("sc://h:1/;token=secret")


def test_connection_to_url_then_session():
    class Conn:
        host, port, login, password, extra_dejson = "127.0.0.1", 15002, "airflow", "tok", {}

    url = compose_url(connect_url(Conn()), session_id=SID, user_id="speculative")
    assert split_url(url)[1] == {"user_id": "airflow", "token": "tok", "session_id": SID}


def test_local_cluster_definitions():
    servers = [ServerInfo(name=n, port=15100 + i, ui_port=4100 + i) for i, n in enumerate(server_names(2))]
    conns = connection_definitions(servers)
    assert json.loads(conns["AIRFLOW_CONN_SPARK_CONNECT_LOCAL_B"]) == {
        "conn_type": "spark_connect", "host": "127.0.0.1", "port": 15101}
    assert [t["conn_id"] for t in json.loads(targets_json(servers))] == [
        "spark_connect_local_a", "spark_connect_local_b"]
    with pytest.raises(LocalClusterError):
        server_names(0)


def test_java_missing_is_named(tmp_path):
    from airflow_provider_speculative.devtools.localcluster import check_java

    with pytest.raises(LocalClusterError, match="java is not on PATH and JAVA_HOME is not set"):
        check_java({"PATH": str(tmp_path)})
    with pytest.raises(LocalClusterError, match="JAVA_HOME=/nonexistent-jdk"):
        check_java({"PATH": str(tmp_path), "JAVA_HOME": "/nonexistent-jdk"})


def test_taken_port_names_its_owner():
    import os
    import socket

    from airflow_provider_speculative.devtools.localcluster import port_owner

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert f"pid {os.getpid()}" in (port_owner(port) or "")
    assert port_owner(port) is None


def test_a_connect_connection_without_a_host_is_refused_without_its_token() -> None:
    import pytest

    from airflow_provider_speculative.exceptions import TargetError
    from airflow_provider_speculative.hooks.targets import connect_address

    class NoHost:
        conn_id, host, port, login, password, extra_dejson = "sc_broken", "", 15002, "u", "tok-SECRET", {}

    with pytest.raises(TargetError) as refused:
        connect_url(NoHost())
    assert "'sc_broken' is a spark_connect connection without a host" in str(refused.value)
    assert "tok-SECRET" not in str(refused.value)

    class V6(NoHost):
        host = "sc://[::1]"

    assert connect_address(V6(), "w") == "[::1]:15002"
