"""The local pool's servers carry the server-side safety net for abandoned queries; the caller's conf wins."""

from __future__ import annotations

from airflow_provider_speculative.devtools.localcluster import SAFETY_NET_CONF, ServerInfo, server_command


def _confs(cmd: list[str]) -> dict[str, str]:
    pairs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_servers_get_the_safety_net() -> None:
    confs = _confs(server_command(ServerInfo(name="local-a", port=15002, ui_port=4050)))
    assert {k: confs[k] for k in SAFETY_NET_CONF} == {
        "spark.connect.execute.reattachable.senderMaxStreamDuration": "20s",
        "spark.connect.execute.manager.detachedTimeout": "20s",
        "spark.connect.execute.manager.maintenanceInterval": "5s",
    }


def test_callers_conf_overrides_the_safety_net() -> None:
    cmd = server_command(ServerInfo(name="local-a", port=15002, ui_port=4050),
                         {"spark.connect.execute.manager.detachedTimeout": "5m"})
    assert _confs(cmd)["spark.connect.execute.manager.detachedTimeout"] == "5m"
    assert cmd.count("--conf") == len(set(_confs(cmd)))  # each option once
    assert cmd[-1] == "spark-internal"


def test_free_base_port_gives_consecutive_free_ports() -> None:
    import socket

    from airflow_provider_speculative.devtools.localcluster import free_base_port

    base = free_base_port(3)
    for port in range(base, base + 3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if taken
