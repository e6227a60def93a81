"""Start-up of a pool server: an exit is read from the child itself, never from its command line."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from airflow_provider_speculative.devtools.localcluster import TEMP_MARKER, LocalCluster, LocalClusterError, ServerInfo


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


def test_negative_warm_up_rounds_are_refused_before_any_server_starts(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "pool")
    with pytest.raises(LocalClusterError, match="warm-up rounds -1: expected 0 or more"):
        cluster.start(servers=1, warm_up_rounds=-1)
    assert not (tmp_path / "pool").exists()


class _Client:
    """A warm-up client that succeeded at once, as subprocess.Popen would return it."""

    returncode = 0

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        return b'{"store_objects": 0}\n', b""


def test_warm_up_rounds_reach_the_client_and_none_at_all_is_a_skipped_warm_up(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_speculative.devtools import localcluster

    commands: list[list[str]] = []
    monkeypatch.setattr(localcluster.subprocess, "Popen", lambda argv, **_: commands.append(argv) or _Client())
    cluster = LocalCluster(tmp_path)
    monkeypatch.setattr(cluster, "_wait_ready", lambda info, timeout: None)
    server = _server(tmp_path)

    cluster._ready([server], 1.0, warm_up=True, warm_up_rounds=1)
    assert commands[-1][-2:] == ["--rounds", "1"] and isinstance(server.extra["warm_up"], float)
    cluster._ready([server], 1.0, warm_up=True)
    assert "--rounds" not in commands[-1]  # the warm-up's own default
    # Zero rounds and no store: no client at all, and the record says so.
    cluster._ready([server], 1.0, warm_up=True, warm_up_rounds=0)
    assert len(commands) == 2 and server.extra["warm_up"] == "skipped"
    # Zero local rounds with a store: the store's rounds still run.
    cluster._ready([server], 1.0, warm_up=True, warm_up_store="s3://bucket/store", warm_up_rounds=0)
    assert commands[-1][-4:] == ["--rounds", "0", "--store", "s3://bucket/store"]


def test_the_warm_up_command_refuses_negative_rounds_and_passes_the_rest(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_speculative.devtools import warmup

    calls: list[tuple[str, int, str | None]] = []
    monkeypatch.setattr(warmup, "warm_up", lambda url, rounds, store: calls.append((url, rounds, store)) or 0)
    with pytest.raises(SystemExit):
        warmup.main(["sc://127.0.0.1:15002/", "--rounds", "-2"])
    assert "--rounds -2: expected 0 or more" in capsys.readouterr().err and not calls
    warmup.main(["sc://127.0.0.1:15002/", "--rounds", "2"])
    warmup.main(["sc://127.0.0.1:15002/"])
    assert calls == [("sc://127.0.0.1:15002/", 2, None), ("sc://127.0.0.1:15002/", warmup.ROUNDS, None)]


def test_a_server_runs_with_a_fresh_temporary_directory_of_the_pool_and_keeps_the_callers_jvm_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark deletes a driver's scratch space (copies of spark.jars among it) only on a clean shutdown; a
    # killed server's is the pool's to remove, so it must be below the pool's directory, not in /tmp.
    cluster = LocalCluster(tmp_path / "pool")
    leftover = cluster.temp_dir("h1") / "spark-killed" / "userFiles" / "aws-sdk-bundle.jar"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x" * 1024)
    (cluster.temp_dir("h1") / TEMP_MARKER).write_text("h1\n")  # made by an earlier start
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dcaller.option=1")
    with pytest.raises(LocalClusterError, match="exited during start-up"):
        cluster.start_servers([_server(tmp_path)], timeout=30, warm_up=False, launcher=lambda _: [
            "sh", "-c", f'echo "$SPARK_SUBMIT_OPTS" > {seen}; ls -A "{cluster.temp_dir("h1")}" >> {seen}; exit 3',
            "launcher"])
    opts, *listing = seen.read_text().splitlines()
    assert opts == f"-Dcaller.option=1 -Djava.io.tmpdir={cluster.temp_dir('h1')}"
    assert listing == [TEMP_MARKER]  # the killed server's files were gone before the new one started


def test_stopping_a_server_that_is_gone_removes_its_temporary_directory_and_nothing_else(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "pool")
    mine, other = cluster.temp_dir("h1"), cluster.temp_dir("h2")
    for directory in (mine, other):
        (directory / "spark-1").mkdir(parents=True)
        (directory / TEMP_MARKER).write_text("\n")
    (tmp_path / "pool" / "h1.log").write_text("kept")

    assert cluster.stop_servers([_server(tmp_path)]) == [(_server(tmp_path), "not running")]
    assert not mine.exists() and (other / "spark-1").is_dir()
    assert (tmp_path / "pool" / "h1.log").read_text() == "kept"


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "", "a b"])
def test_a_server_name_that_could_leave_the_pool_directory_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(LocalClusterError, match="server name"):
        LocalCluster(tmp_path).temp_dir(name)


def test_a_pool_directory_with_a_space_reaches_the_jvm_as_one_option(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "my pools")
    seen = tmp_path / "seen.txt"
    with pytest.raises(LocalClusterError, match="exited during start-up"):
        cluster.start_servers([_server(tmp_path)], timeout=30, warm_up=False, launcher=lambda _: [
            "sh", "-c", f'echo "$SPARK_SUBMIT_OPTS" > {seen}; exit 3', "launcher"])
    assert seen.read_text().strip().endswith(f"'-Djava.io.tmpdir={cluster.temp_dir('h1')}'")


def test_a_temporary_directory_the_pool_did_not_make_is_never_removed_and_stops_the_start(tmp_path: Path) -> None:
    # --directory may point at a folder that already held a tmp/<server> of someone else's.
    cluster = LocalCluster(tmp_path / "pool")
    theirs = cluster.temp_dir("h2") / "notes.txt"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("mine")
    first = _server(tmp_path)
    second = ServerInfo(name="h2", port=15993, ui_port=4993, log=str(tmp_path / "h2.log"))
    with pytest.raises(LocalClusterError, match=r"cannot start h2: .* was not made by local-cluster"):
        cluster.start_servers([first, second], timeout=5, warm_up=False,
                              launcher=lambda _: ["sh", "-c", "exec sleep 60", "launcher"])
    # The server launched before it is stopped, not left running.
    h1 = cluster._children["h1"]
    assert h1.poll() is not None or psutil.Process(h1.pid).status() == psutil.STATUS_ZOMBIE
    cluster.stop_servers([second])
    assert theirs.read_text() == "mine"
