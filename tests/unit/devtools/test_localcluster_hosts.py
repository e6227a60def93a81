"""A pool server on its own host binds, advertises and is labelled by that host, not by 127.0.0.1."""

from __future__ import annotations

import json

from airflow_provider_speculative.core.config import SpeculativeConfig
from airflow_provider_speculative.devtools.localcluster import (
    ServerInfo,
    connection_definitions,
    server_command,
    targets_json,
)


def _confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")


def test_a_server_on_another_host_binds_and_advertises_that_host_only() -> None:
    info = ServerInfo(name="host-1", port=15002, ui_port=4040, host="10.213.0.11")
    confs = _confs(server_command(info))
    assert confs["spark.connect.grpc.binding.address"] == "10.213.0.11"
    assert confs["spark.driver.host"] == confs["spark.driver.bindAddress"] == "10.213.0.11"
    assert "127.0.0.1" not in " ".join(server_command(info))
    assert info.url == "sc://10.213.0.11:15002"
    conn = json.loads(connection_definitions([info])["AIRFLOW_CONN_SPARK_CONNECT_HOST_1"])
    assert (conn["host"], conn["port"]) == ("10.213.0.11", 15002)


def test_the_target_of_a_server_on_its_own_host_is_that_node() -> None:
    servers = [ServerInfo(name="host-1", port=15002, ui_port=4040, host="10.213.0.11"),
               ServerInfo(name="host-2", port=15002, ui_port=4040, host="10.213.0.12")]
    config = SpeculativeConfig().with_overrides({"targets": json.loads(targets_json(servers))}, "test")
    assert [t.node_label for t in config.targets] == ["10.213.0.11", "10.213.0.12"]


def test_loopback_servers_keep_one_node_each_by_name() -> None:
    # Two servers on one loopback host would otherwise be one node: blocking one would block both.
    servers = [ServerInfo(name="local-a", port=15002, ui_port=4050), ServerInfo(name="local-b", port=15003,
                                                                                ui_port=4051)]
    config = SpeculativeConfig().with_overrides({"targets": json.loads(targets_json(servers))}, "test")
    assert [t.node_label for t in config.targets] == ["local-a", "local-b"]
    assert _confs(server_command(servers[0]))["spark.connect.grpc.binding.address"] == "127.0.0.1"
