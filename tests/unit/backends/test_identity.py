"""Process identity by start ticks: immune to wall-clock steps, and a reused pid never passes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psutil

from airflow_provider_speculative.backends.identity import same_process, start_ticks


def test_start_ticks_are_stable_for_a_process_and_differ_for_another() -> None:
    mine = start_ticks(os.getpid())
    assert isinstance(mine, int) and mine == start_ticks(os.getpid())
    child = subprocess.Popen(["sleep", "5"])
    try:
        assert start_ticks(child.pid) not in (None, mine)
    finally:
        child.kill()
        child.wait()
    assert start_ticks(child.pid) is None  # gone (and reaped)


def test_a_command_name_with_spaces_and_parentheses_is_parsed(tmp_path: Path) -> None:
    odd = tmp_path / "a) b (c"
    odd.symlink_to(shutil.which("sleep"))
    child = subprocess.Popen([str(odd), "5"])
    try:
        assert psutil.Process(child.pid).name().startswith("a) b (c")
        assert start_ticks(child.pid) == start_ticks(child.pid) is not None
    finally:
        child.kill()
        child.wait()


def test_recorded_ticks_decide_even_when_the_wall_clock_moved() -> None:
    me = psutil.Process()
    recorded = {"start_ticks": start_ticks(me.pid), "create_time": me.create_time() - 7200}  # clock stepped 2 h
    assert same_process(me.pid, recorded, me.create_time())
    assert not same_process(me.pid, {**recorded, "start_ticks": recorded["start_ticks"] - 1}, me.create_time())


def test_without_recorded_ticks_create_time_decides_within_a_second() -> None:
    me = psutil.Process()
    assert same_process(me.pid, {"create_time": me.create_time() + 0.5}, me.create_time())
    assert not same_process(me.pid, {"create_time": me.create_time() + 5}, me.create_time())
    assert same_process(me.pid, {}, me.create_time())  # nothing recorded: the pid alone
