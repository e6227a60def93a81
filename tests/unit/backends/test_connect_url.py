"""Spark Connect URLs of targets come from SparkConnectHook; connections it could not use fail naming no secret."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_speculative.core.contract import REMOTE_ENV
from airflow_provider_speculative.exceptions import TargetError
from airflow_provider_speculative.hooks.targets import connect_address, connect_env, connect_url


def _conn(**fields: Any) -> SimpleNamespace:
    base = {"conn_id": "sc_a", "host": "sc://spark-a", "port": 15002, "login": "al ice", "password": "t;k-SECRET",
            "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


def test_url_carries_user_token_and_tls_quoted_as_the_hook_does() -> None:
    url = connect_url(_conn(extra_dejson={"use_ssl": True}))
    assert url == "sc://spark-a:15002/;user_id=al%20ice;token=t%3Bk-SECRET;use_ssl=True"
    assert connect_url(_conn(host="10.0.0.7", login=None, password=None)) == "sc://10.0.0.7:15002/"


def test_url_is_built_by_spark_connect_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    # The parameter names are the hook's: a copy of its rules would not follow a change of them.
    monkeypatch.setattr(SparkConnectHook, "PARAM_TOKEN", "bearer")
    assert connect_url(_conn(login=None)) == "sc://spark-a:15002/;bearer=t%3Bk-SECRET"


@pytest.mark.parametrize(("fields", "words"), [
    ({"host": ""}, "'sc_a' is a spark_connect connection without a host"),
    ({"host": "sc://spark-a:15003"}, "gives the Spark Connect port twice (in host 'sc://spark-a:15003' and as port"),
    ({"host": "sc://spark-a/;token=t;k-SECRET", "port": None}, "has a path or parameters after the Spark Connect"),
])
def test_connections_the_hook_could_not_use_fail_without_their_token(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(TargetError) as refused:
        connect_url(_conn(**fields))
    assert words in str(refused.value)
    assert "SECRET" not in str(refused.value)


def test_address_keeps_the_port_of_the_host_or_of_the_connection() -> None:
    assert connect_address(_conn(host="sc://spark-a:15003", port=None), "w") == "spark-a:15003"
    assert connect_address(_conn(host="sc://[::1]"), "w") == "[::1]:15002"
    assert connect_url(_conn(host="sc://spark-a:15003", port=None, login=None, password=None)) == \
        "sc://spark-a:15003/"


def test_connect_env_resolves_each_connect_target_asynchronously(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SC_A", json.dumps({"conn_type": "spark_connect", "host": "sc://spark-a",
                                                        "port": 15002, "login": "u", "password": "tok"}))
    plan: Any = {"targets": {"a": {"kind": "spark_connect", "conn_id": "sc_a"},
                             "b": {"kind": "spark_submit", "conn_id": "spark_default"}}}
    assert asyncio.run(connect_env(plan)) == {"a": {REMOTE_ENV: "sc://spark-a:15002/;user_id=u;token=tok"}}
