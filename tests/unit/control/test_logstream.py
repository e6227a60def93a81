"""Driver logs streamed into the task log (control/logstream.py): offsets, bounds, escaping, ends, rotation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_speculative.control.logstream import LINE_CHARS, DriverLogStream, escape_line
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store.layout import StageLayout

S = AttemptState
PREFIX = "subtask 0 attempt 1 (target local-a): "


@pytest.fixture
def layout(tmp_path: Path) -> StageLayout:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    layout.attempt_dir(0, 1).mkdir(parents=True)
    return layout


def stream(layout: StageLayout, max_lines: int = 5, max_bytes: int = 4096, **kw: float) -> DriverLogStream:
    return DriverLogStream(layout, max_lines=max_lines, max_bytes=max_bytes, since=kw.pop("since", 100.0), **kw)


def running() -> Attempt:
    return Attempt(0, 1, "local-a", S.RUNNING, deploying_at=100.0)


def ended(state: AttemptState = S.FINISHED, end_at: float = 150.0) -> Attempt:
    return Attempt(0, 1, "local-a", state, deploying_at=100.0, end_at=end_at)


def append(layout: StageLayout, text: str | bytes) -> None:
    with open(layout.log(0, 1), "ab") as log:
        log.write(text.encode() if isinstance(text, str) else text)


def shown(lines: list[str]) -> list[str]:
    assert all(line.startswith(PREFIX) for line in lines), lines
    return [line[len(PREFIX):] for line in lines]


def test_each_step_shows_only_the_new_complete_lines(layout: StageLayout) -> None:
    logs = stream(layout)
    assert logs.step([running()], 1.0) == []  # no log yet: nothing, and no error
    append(layout, "starting\nsession ready\nhalf a li")
    assert shown(logs.step([running()], 2.0)) == ["starting", "session ready"]
    assert logs.step([running()], 3.0) == []  # the cut line waits for its end
    append(layout, "ne\nnext\n")
    assert shown(logs.step([running()], 4.0)) == ["half a line", "next"]
    assert logs.step([running()], 5.0) == []


def test_a_chatty_driver_shows_its_latest_lines_after_a_skip_marker(layout: StageLayout) -> None:
    logs = stream(layout, max_lines=3)
    append(layout, "".join(f"line {i}\n" for i in range(10)))
    assert shown(logs.step([running()], 1.0)) == ["... 7 lines skipped", "line 7", "line 8", "line 9"]
    append(layout, "line 10\n")
    assert shown(logs.step([running()], 2.0)) == ["line 10"]


def test_more_bytes_than_a_step_reads_are_skipped_unread(layout: StageLayout) -> None:
    logs = stream(layout, max_lines=2, max_bytes=64)
    append(layout, "".join(f"line {i:04d}\n" for i in range(1000)))  # 10 bytes a line
    out = shown(logs.step([running()], 1.0))
    # 64 bytes read: the cut first line is dropped, 6 whole lines remain, 4 of them skipped.
    assert out == ["... 4 lines and 9940 more bytes skipped", "line 0998", "line 0999"]
    append(layout, "x" * 100)  # one line longer than a whole read, without its newline yet
    assert shown(logs.step([running()], 2.0)) == ["... 36 bytes skipped", "x" * 64]


def test_lines_are_escaped_and_cut(layout: StageLayout) -> None:
    logs = stream(layout)
    append(layout, "\x1b[31mred\x1b[0m\tok\r\n" "nul\x00 and bell\x07\n" "bidi\u2028sep\n".encode()
           + b"bad utf-8 \xff\n" + b"y" * (LINE_CHARS + 10) + b"\n")
    out = shown(logs.step([running()], 1.0))
    assert out[:4] == ["\\x1b[31mred\\x1b[0m\tok", "nul\\x00 and bell\\x07", "bidi\\u2028sep", "bad utf-8 \ufffd"]
    assert out[4] == "y" * LINE_CHARS + " [...]"
    assert escape_line("target\nname") == "target\\x0aname"


def test_an_ended_attempt_gets_its_last_lines_once(layout: StageLayout) -> None:
    logs = stream(layout, max_lines=2)
    append(layout, "a\nb\n")
    assert shown(logs.step([running()], 1.0)) == ["a", "b"]
    append(layout, "c\nd\ne\nTraceback: no newline at the end")
    assert shown(logs.step([ended(S.FAILED)], 2.0)) == ["... 2 lines skipped", "e",
                                                         "Traceback: no newline at the end"]
    append(layout, "written after the end\n")
    assert logs.step([ended(S.FAILED)], 3.0) == []


def test_an_attempt_that_ended_between_steps_shows_its_end_and_one_that_ended_before_nothing(
        tmp_path: Path, layout: StageLayout) -> None:
    append(layout, "one\ntwo\nthree\n")
    logs = stream(layout, max_lines=2, since=100.0)
    assert logs.step([ended(end_at=99.0)], 1.0) == []  # a restarted trigger does not repeat finished attempts
    logs = stream(layout, max_lines=2, since=100.0)
    assert shown(logs.step([ended(end_at=101.0)], 1.0)) == ["... 1 line skipped", "two", "three"]


def test_a_truncated_log_is_followed_again_from_its_start(layout: StageLayout) -> None:
    logs = stream(layout)
    append(layout, "first run of the driver\n")
    assert shown(logs.step([running()], 1.0)) == ["first run of the driver"]
    layout.log(0, 1).write_text("new\n")
    assert shown(logs.step([running()], 2.0)) == ["... log truncated to 4 bytes: following it from its start",
                                                  "new"]


def test_a_rotated_log_is_followed_from_the_new_files_start(layout: StageLayout) -> None:
    logs = stream(layout)
    append(layout, "old file, long enough to be longer than the new one\n")
    assert len(logs.step([running()], 1.0)) == 1
    replacement = layout.log(0, 1).with_suffix(".new")
    replacement.write_text("rotated 1\nrotated 2\nrotated 3, longer than the old one ...........\n")
    os.replace(replacement, layout.log(0, 1))
    assert shown(logs.step([running()], 2.0)) == ["... log file replaced: following the new one from its start",
                                                  "rotated 1", "rotated 2",
                                                  "rotated 3, longer than the old one ..........."]


def test_a_log_that_is_a_link_is_named_once_and_never_read(tmp_path: Path, layout: StageLayout) -> None:
    secret = tmp_path / "airflow.cfg"
    secret.write_text("password = hunter2\n")
    layout.log(0, 1).symlink_to(secret)
    logs = stream(layout)
    (line,) = shown(logs.step([running()], 1.0))
    assert line.startswith("its log is not shown") and "hunter2" not in line
    assert logs.step([running()], 2.0) == []


def test_steps_within_the_period_read_nothing_but_the_final_one_does(layout: StageLayout) -> None:
    logs = stream(layout, period=1.0)
    append(layout, "a\n")
    assert shown(logs.step([running()], 10.0)) == ["a"]
    append(layout, "b\n")
    assert logs.step([running()], 10.5) == []  # a step woken early by a change notice
    append(layout, "c")
    assert shown(logs.step([ended()], 10.6, final=True)) == ["b", "c"]


def test_no_lines_means_off(layout: StageLayout) -> None:
    append(layout, "a\n")
    assert stream(layout, max_lines=0).step([running()], 1.0) == []


def test_several_attempts_are_named_in_subtask_and_attempt_order(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path / "store", "d", "r", "scan")
    attempts = [Attempt(1, 0, "local-b", S.RUNNING), Attempt(0, 0, "local-a", S.RUNNING),
                Attempt(0, 1, "local-b", S.RUNNING, speculative=True)]
    for a in attempts:
        layout.attempt_dir(a.subtask, a.number).mkdir(parents=True)
        layout.log(a.subtask, a.number).write_text(f"hello from {a.subtask}.{a.number}\n")
    assert stream(layout).step(attempts, 1.0) == [
        "subtask 0 attempt 0 (target local-a): hello from 0.0",
        "subtask 0 attempt 1 (target local-b): hello from 0.1",
        "subtask 1 attempt 0 (target local-b): hello from 1.0"]
