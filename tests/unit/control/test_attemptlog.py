"""What the task log says about a stage's attempts, and how a log's tail is cut."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_speculative.control.attemptlog import attempt_lines, read_tail
from airflow_provider_speculative.core.states import Attempt, AttemptState
from airflow_provider_speculative.store.layout import StageLayout


def test_the_task_log_lists_every_attempt_with_target_state_and_log(tmp_path: Path) -> None:
    layout = StageLayout(tmp_path, "q1", "manual__1", "scan")
    attempts = [
        Attempt(subtask=1, number=1, target="local-a", state=AttemptState.FINISHED, speculative=True, node="10.0.0.2",
                exit_code=0),
        Attempt(subtask=0, number=0, target="local-a", state=AttemptState.FINISHED, exit_code=0),
        Attempt(subtask=1, number=0, target="local-b", state=AttemptState.CANCELED, exit_code=143),
    ]
    lines = attempt_lines(layout, attempts, {0: 0, 1: 1})
    assert lines[0].startswith(f"attempts of stage scan (logs under {layout.dir}; print one with `airflow "
                               "speculative logs -d q1 -r manual__1 -s scan --subtask I --attempt K`")
    assert lines[1:] == [
        "  subtask 0 attempt 0 on local-a (node local-a): FINISHED, exit 0 [admitted]; "
        "log subtask=0/attempt=0/spark-submit.log",
        "  subtask 1 attempt 0 on local-b (node local-b): CANCELED, exit 143; log subtask=1/attempt=0/spark-submit.log",
        "  subtask 1 attempt 1 on local-a (node 10.0.0.2): FINISHED, exit 0 [speculative, admitted]; "
        "log subtask=1/attempt=1/spark-submit.log",
    ]


def test_a_tail_starts_at_a_whole_line_and_never_reads_more_than_asked(tmp_path: Path) -> None:
    log = tmp_path / "spark-submit.log"
    log.write_bytes(b"first line\n" + "é".encode() * 10 + b"\nlast line\n")
    size, start, text = read_tail(tmp_path, log, 15)
    assert size == log.stat().st_size and text == "last line\n" and start == size - len(b"last line\n")
    assert read_tail(tmp_path, log, 10_000) == (size, 0, log.read_text())


def test_the_logs_command_is_safe_to_paste_whatever_the_ids() -> None:
    from airflow_provider_speculative.control.attemptlog import logs_command

    line = logs_command("q1", "manual__x'; rm -rf /tmp/y; '", "scan", 1, 2)
    assert line == ("airflow speculative logs -d q1 -r 'manual__x'\"'\"'; rm -rf /tmp/y; '\"'\"'' -s scan "
                    "--subtask 1 --attempt 2")

