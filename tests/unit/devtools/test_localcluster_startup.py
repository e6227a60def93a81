"""Start-up of a pool server: an exit is read from the child itself, never from its command line."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from airflow_provider_speculative.devtools.localcluster import LocalCluster, LocalClusterError, ServerInfo


def _server(tmp_path: Path) -> ServerInfo:
    return ServerInfo(name="h1", port=15992, ui_port=4992, log=str(tmp_path / "h1.log"))


def test_a_server_still_in_its_launcher_is_starting_not_exited(tmp_path: Path) -> None:
    # While a launcher (ip netns exec, a shell) has not yet exec'd the JVM, the pid's command line does
    # not name the server; that is a server starting, and it is stopped when it does not come up in time.
    cluster = LocalCluster(tmp_path)
    with pytest.raises(LocalClusterError, match="did not accept clients") as caught:
        cluster.start_servers([_server(tmp_path)], timeout=1.5, warm_up=False,
                              launcher=lambda _: ["sh", "-c", "exec sleep 60", "launcher"])
    assert "exited" not in str(caught.value)
    pid = cluster._children["h1"].pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_during_start_up_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    with pytest.raises(LocalClusterError, match=r"h1 \(port 15992\) exited during start-up \(exit code 3\)") as caught:
        cluster.start_servers([_server(tmp_path)], timeout=30, warm_up=False,
                              launcher=lambda _: ["sh", "-c", "echo no JVM here; exit 3", "launcher"])
    assert "no JVM here" in str(caught.value)


@pytest.mark.parametrize(("output", "expected"), [
    (b'WARN something\n{"store_objects": 9}\n', 9),
    (b'{"store_objects": 0}', 0),
    (b"", None),
    (b"Traceback (most recent call last):\n", None),
    (b'{"store_objects": "9"}\n', None),
    (b"[1, 2]\n", None),
])
def test_the_warm_up_store_count_is_its_last_line_or_unknown(output: bytes, expected: int | None) -> None:
    from airflow_provider_speculative.devtools.localcluster import _store_objects

    assert _store_objects(output) == expected
