"""The fast exit of the ``airflow dags test`` process (processexit.py): when it is armed and what it keeps."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from airflow_provider_speculative import processexit


@pytest.mark.parametrize(("argv", "expected"), [
    (["/venv/bin/airflow", "dags", "test", "tpch_q3", "2026-01-01"], True),
    (["airflow", "dags", "test", "tpch_q3"], True),
    (["/venv/lib/python3.11/site-packages/airflow/__main__.py", "dags", "test", "x"], True),
    (["/venv/bin/airflow", "dags", "list"], False),
    (["/venv/bin/airflow", "tasks", "test", "x", "y"], False),
    (["/venv/bin/airflow", "triggerer"], False),
    (["/venv/bin/pytest", "dags", "test"], False),  # a test session is never armed
    (["/repo/dags/tpch_q3.py"], False),  # a script calling dag.test()
    (["/venv/lib/python3.11/site-packages/other/__main__.py", "dags", "test"], False),
    ([], False),
])
def test_only_the_dags_test_command_counts(argv: list[str], expected: bool) -> None:
    assert processexit.is_dags_test_command(argv) is expected


def test_armed_once_and_only_when_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(processexit.atexit, "register", registered.append)
    monkeypatch.setattr(processexit, "_armed", False)
    argv = ["/venv/bin/airflow", "dags", "test", "tpch_q3"]
    assert processexit.arm_for_dags_test(False, argv) is False
    assert processexit.arm_for_dags_test(True, ["/venv/bin/airflow", "dags", "list"]) is False
    assert registered == []
    assert processexit.arm_for_dags_test(True, argv) is True
    assert processexit.arm_for_dags_test(True, argv) is False  # a second stage of the same run
    assert registered == [processexit.collect_and_freeze]


def _exit_report(arm: bool) -> list[str]:
    """What a child interpreter reports from the exit: finalizers run and whether the shutdown saw a frozen heap."""
    code = textwrap.dedent(f"""
        import atexit, gc, sys
        from airflow_provider_speculative import processexit

        class Noisy:
            def __init__(self, name):
                self.name, self.me = name, self  # a cycle: only the cyclic collector frees it
            def __del__(self):
                sys.stdout.write("finalized " + self.name + "\\n")
                sys.stdout.flush()

        # Registered first, so it runs after the provider's handler (exit handlers run last-in first-out).
        atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
        gc.disable()  # nothing is collected before the exit but by the exit handler
        if {arm!r}:
            processexit.arm()
        Noisy("garbage")  # unreachable at exit
        kept = Noisy("alive")  # still reachable at exit
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.splitlines()


def test_the_exit_finalizes_garbage_and_freezes_what_is_alive() -> None:
    armed = _exit_report(arm=True)
    # Garbage present at exit is still finalized, before the rest is frozen out of the shutdown collection.
    assert armed.index("finalized garbage") < armed.index("frozen True")
    # Python promises no finalizer for what is alive at exit; the shutdown collection no longer walks it.
    assert "finalized alive" not in armed
    plain = _exit_report(arm=False)
    assert "frozen False" in plain
