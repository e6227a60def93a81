"""An attempt's spark-submit gets a temporary directory of its own, gone when the attempt is."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_speculative.backends import scratch
from airflow_provider_speculative.backends.identity import start_ticks


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temporary directory, for this test only."""
    monkeypatch.setattr(scratch.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # a supervisor subprocess's tempfile too
    return tmp_path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_sweep_removes_only_this_hosts_directories_whose_supervisor_is_gone(tmp_root: Path) -> None:
    root = scratch.scratch_root()
    assert root is not None and (root.stat().st_mode & 0o777) == 0o700
    host = socket.gethostname()
    me = os.getpid()
    dead = root / f"{_dead_pid()}-123@{host}"
    recycled = root / f"{me}-{(start_ticks(me) or 0) + 1}@{host}"  # a live pid, another process's start
    alive = root / f"{me}-{start_ticks(me)}@{host}"
    other_host = root / f"{_dead_pid()}-123@another-host"
    foreign = root / "not-a-scratch-dir"
    for directory in (dead, recycled, alive, other_host, foreign):
        (directory / "spark-1" / "blockmgr-1").mkdir(parents=True)
    outside = tmp_root / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    link = root / f"{_dead_pid()}-1@{host}"
    link.symlink_to(outside)

    assert sorted(scratch.sweep(root)) == sorted([dead.name, recycled.name])
    assert not dead.exists() and not recycled.exists()
    assert alive.is_dir() and other_host.is_dir() and foreign.is_dir()
    assert (outside / "keep").read_text() == "x"  # a link is never followed


def test_a_root_others_can_write_to_is_not_used(tmp_root: Path) -> None:
    root = tmp_root / f"{scratch.ROOT_PREFIX}{os.getuid()}"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    assert scratch.scratch_root() is None and scratch.create() is None


def test_the_jvm_option_keeps_what_the_caller_set_and_quotes_the_path() -> None:
    env = scratch.submit_env(Path("/tmp/a b"), {"SPARK_SUBMIT_OPTS": "-Dx=1", "OTHER": "y"})
    assert env == {"SPARK_SUBMIT_OPTS": "-Dx=1 '-Djava.io.tmpdir=/tmp/a b'", "OTHER": "y"}
    assert scratch.submit_env(Path("/t"), {})["SPARK_SUBMIT_OPTS"] == "-Djava.io.tmpdir=/t"


@pytest.mark.parametrize(("cmd", "expected"), [
    (["/opt/spark/bin/spark-submit", "--master", "local[1]"], True),
    (["spark-submit"], True),
    ([sys.executable, "app.py"], False),
    ([], False),
])
def test_only_a_spark_submit_gets_a_scratch_directory(cmd: list[str], expected: bool) -> None:
    assert scratch.runs_spark_submit(cmd) is expected


def test_the_supervisor_gives_its_spark_submit_a_scratch_directory_and_removes_it_at_the_end(
        tmp_root: Path, tmp_path: Path) -> None:
    # A stand-in spark-submit: records the options its JVM would get and leaves files in its temporary directory.
    seen = tmp_path / "seen.txt"
    submit = tmp_path / "bin" / "spark-submit"
    submit.parent.mkdir()
    submit.write_text("#!/bin/sh\n"
                      f'echo "$SPARK_SUBMIT_OPTS" > {seen}\n'
                      'dir=$(echo "$SPARK_SUBMIT_OPTS" | sed "s/.*-Djava.io.tmpdir=//")\n'
                      'mkdir -p "$dir/spark-x/userFiles" && echo jar > "$dir/spark-x/userFiles/big.jar"\n'
                      f'echo "$dir" >> {seen}\n'
                      "exit 1\n")
    submit.chmod(0o755)
    attempt = tmp_path / "attempt=0"
    attempt.mkdir()
    code = subprocess.call(
        [sys.executable, "-m", "airflow_provider_speculative.backends.supervisor",
         "--status", str(attempt / "status.json"), "--log", str(attempt / "log"),
         "--manifest", str(attempt / "manifest.json"), "--", str(submit), "--master", "local[1]"],
        env={**os.environ, "SPARK_SUBMIT_OPTS": "-Dcaller=1"}, timeout=60)
    assert code == 1
    opts, used = seen.read_text().splitlines()
    root = tmp_root / f"{scratch.ROOT_PREFIX}{os.getuid()}"
    assert opts.startswith(f"-Dcaller=1 -Djava.io.tmpdir={root}/")
    assert Path(used).parent == root and "@" in Path(used).name
    assert not Path(used).exists(), "the attempt's scratch directory outlived it"
