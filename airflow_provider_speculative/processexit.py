"""A faster interpreter exit for the ``airflow dags test`` process once a stage of the provider ran in it.

At exit, CPython tears its modules down with a full garbage collection over everything still alive. In the
``airflow dags test`` process of a pipeline, which has loaded Airflow, its in-process execution API, the
provider, pandas, pyarrow and Spark Connect's client, that takes seconds after the DAG run has ended; see
"Airflow's exit" in bench/README.md. The exit handler here collects the garbage present at exit once, so
its finalizers run as they would, and then freezes what is still alive (``gc.freeze``), which the shutdown
collection then leaves alone. Python promises no finalizer for an object still alive at exit (the language
reference, ``object.__del__``); every flush that Airflow and ``logging`` need runs in their own exit
handlers, explicitly. Armed only in the ``airflow dags test`` command, whose process ends with the DAG run;
never in a scheduler, triggerer, worker, test session or script that calls ``dag.test()``.
``[speculative] fast_exit = False`` turns it off.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

_lock = threading.Lock()
_armed = False


def arm() -> bool:
    """Register the exit handler in this process, once; True if this call registered it."""
    global _armed
    with _lock:
        if _armed:
            return False
        atexit.register(collect_and_freeze)
        _armed = True
        return True


def collect_and_freeze() -> None:
    """Collect the garbage present now, then keep everything still alive out of later collections."""
    gc.collect()
    gc.freeze()


def is_dags_test_command(argv: Sequence[str] | None = None) -> bool:
    """True in the process of Airflow's ``airflow dags test`` command (not a script calling ``dag.test()``)."""
    args = list(sys.argv if argv is None else argv)
    if len(args) < 3 or args[1:3] != ["dags", "test"]:
        return False
    program = Path(args[0])
    # The console script, or `python -m airflow`.
    return program.name == "airflow" or (program.name == "__main__.py" and program.parent.name == "airflow")


def arm_for_dags_test(enabled: bool, argv: Sequence[str] | None = None) -> bool:
    """Arm the exit handler if ``enabled`` and this is the ``airflow dags test`` process; True if armed now."""
    return enabled and is_dags_test_command(argv) and arm()
