"""The attempt of an unmodified application: runs the author's .py (``runpy``) or jar main, then commits no output.

``SpeculativeSparkSubmitOperator`` (``operators/spark_submit.py``) makes this file the stage's application.
spark-submit starts it with the attempt's arguments (``--plan --subtask --attempt --target``); the plan's
application arguments (``core/spark_submit.py`` ``wrapper_args``) name what to run. The attempt's Spark
session is opened first (heartbeat, application id, driver log, as for every stage), so the script's
``SparkSession.builder.getOrCreate()`` returns it, and a jar's main class gets it through
``SparkSession.builder().getOrCreate()`` in the same JVM. The application writes its own output: the
attempt's manifest lists no file, so the commit names the attempt and the provider never moves or deletes
what the application wrote. One copy only: an attempt claimed as a speculative copy refuses to run.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from types import TracebackType
from typing import Any

from airflow_provider_speculative.core.contract import (
    EXIT_FAILED,
    EXIT_NODE_LOST,
    EXIT_PARTITION,
    EXIT_STORE_FULL,
    EXIT_STORE_NOT_WRITABLE,
    EXTRA_CONF_ENV,
    REMOTE_ENV,
)
from airflow_provider_speculative.core.spark_submit import UnmodifiedApplication, parse_wrapper_args
from airflow_provider_speculative.core.states import HeartbeatPhase
from airflow_provider_speculative.exceptions import StoreError
from airflow_provider_speculative.runtime.context import StageContext
from airflow_provider_speculative.store.manifest import build_manifest_in, write_manifest_in

# Exit codes the supervisor and the controller give a meaning of their own (lost input, full store, lost
# node): an application exiting with one of them fails the attempt with EXIT_FAILED instead.
RESERVED_EXIT_CODES = frozenset({EXIT_PARTITION, EXIT_STORE_FULL, EXIT_STORE_NOT_WRITABLE, EXIT_NODE_LOST})


class ApplicationFailed(RuntimeError):
    """The application ended with a non-zero exit code or raised; ``code`` is what the attempt exits with."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


class UnmodifiedAttempt(StageContext):
    """One attempt of an unmodified application: the StageContext life cycle with an empty output."""

    def __init__(self, plan: Any, subtask: int, attempt: int, target: str) -> None:
        super().__init__(plan, subtask, attempt, target)
        self.application: UnmodifiedApplication = parse_wrapper_args(self.plan.get("application_args") or [])

    def refuse_copies(self) -> None:
        """Raise unless this is the only attempt that may run the application now (never a speculative copy)."""
        if self.parallelism != 1:
            raise ApplicationFailed(f"stage {self.stage!r}: an unmodified application runs as one subtask, "
                                    f"the plan has {self.parallelism}")
        claim = self.layout.read_json(self.layout.claim(self.subtask, self.attempt)) or {}
        if claim.get("speculative"):
            raise ApplicationFailed(f"stage {self.stage!r}: attempt {self.attempt} is a speculative copy; an "
                                    "unmodified application writes its own output and never runs twice at once")
        if os.environ.get(REMOTE_ENV):
            raise ApplicationFailed(f"stage {self.stage!r}: target {self.target!r} is a Spark Connect server; an "
                                    "unmodified application runs under spark-submit: use a 'spark' connection")

    def name_session(self) -> None:
        """Give the attempt's Spark application the author's ``name`` (applied before the context starts)."""
        if self.application.name is None:
            return
        try:
            extra = json.loads(os.environ.get(EXTRA_CONF_ENV) or "{}")
        except ValueError:
            extra = {}
        extra = extra if isinstance(extra, dict) else {}
        os.environ[EXTRA_CONF_ENV] = json.dumps({**extra, "spark.app.name": self.application.name})

    def run_application(self) -> None:
        """Run the author's application in this driver; ApplicationFailed if it fails."""
        app = self.application
        spark = self.spark
        if app.java_class is not None:
            run_java_main(spark, app.java_class, list(app.args))
        else:
            run_python(app.application, list(app.args))

    def write_nothing(self, app_started: float) -> None:
        """Commit no output through the manifest path: an empty manifest marks the attempt finished."""
        if self._written:
            raise RuntimeError(f"stage {self.stage!r}: the attempt's manifest is already written")
        data_dir = self.layout.data(self.subtask, self.attempt)
        ended = time.time()
        manifest = build_manifest_in(self.layout.store, self.layout.name(data_dir), stage=self.stage,
                                     subtask=self.subtask, attempt=self.attempt, node=self.node, schema=None,
                                     input_bytes=0, written_at=ended, sink=None)
        if manifest["files"]:
            # The data directory is the provider's: an application writing there would be committed by accident.
            raise ApplicationFailed(f"stage {self.stage!r}: the application wrote into the attempt's own data "
                                    f"directory {data_dir}; write the output to a path of your own")
        manifest["records"] = 0
        manifest["unmodified_application"] = self.application.application
        manifest["timings"] = {"entered_at": self._entered_at,
                               "session_ready_at": self._session_info.get("session_ready_at"),
                               "write_started_at": ended, "verify_s": 0.0, "write_s": 0.0,
                               "manifest_s": round(time.time() - ended, 4), "application_started_at": app_started}
        self._written = True
        write_manifest_in(self.layout.store, self.layout.name(self.layout.manifest(self.subtask, self.attempt)),
                          manifest)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, ApplicationFailed) and exc.code != EXIT_FAILED and self._node_lost is None:
            # The application's own exit code (StageContext would exit with EXIT_FAILED).
            try:
                self._record_failure(exc)
                self._heartbeat.stop(HeartbeatPhase.FAILED)
            except StoreError:
                pass
            self._stop_spark()
            print(f"[speculative] attempt failed: {exc}", file=sys.stderr)
            os._exit(exc.code)
        super().__exit__(exc_type, exc, tb)


def _exit_code(value: Any) -> int:
    """The process exit code ``sys.exit(value)`` means (None: 0; an int: itself; anything else: 1)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value & 0xFF
    return 1


def application_failed(what: str, code: int) -> ApplicationFailed:
    """The failure of an application that exited with ``code``, exiting the attempt with it unless it is reserved."""
    if code in RESERVED_EXIT_CODES:
        return ApplicationFailed(f"{what} exited with code {code} (the attempt exits {EXIT_FAILED}: code {code} "
                                 "means another failure to the provider)", EXIT_FAILED)
    return ApplicationFailed(f"{what} exited with code {code}", code)


def run_python(application: str, args: list[str]) -> None:
    """Run a PySpark script as ``python application args...`` would, in this process."""
    local = application.split("://", 1)[1] if application.startswith(("file://", "local://")) else application
    path = os.path.abspath(local)
    if not os.path.isfile(path):
        raise ApplicationFailed(f"application {application!r} does not exist (resolved to {path})")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code != 0:
            if not isinstance(exc.code, int | type(None)):
                print(exc.code, file=sys.stderr)
            raise application_failed(f"application {application!r}", code) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_java_main(spark: Any, java_class: str, args: list[str]) -> None:
    """Call ``java_class.main(args)`` in the driver's JVM (the jar is on the driver's class path via spark.jars)."""
    from py4j.java_gateway import JavaPackage

    context = spark.sparkContext
    jvm, gateway = context._jvm, context._gateway
    target: Any = jvm
    for part in java_class.split("."):
        target = getattr(target, part)
    if isinstance(target, JavaPackage):  # py4j's answer for a name that is not a class
        raise ApplicationFailed(f"java_class {java_class!r} is not a class of the application jar or the jars "
                                "on the driver's class path")
    array = gateway.new_array(jvm.java.lang.String, len(args))
    for i, arg in enumerate(args):
        array[i] = arg
    try:
        target.main(array)
    except Exception as exc:
        raise ApplicationFailed(f"java_class {java_class!r}: main failed: {exc}") from exc


def main(argv: list[str] | None = None) -> None:
    """Run one attempt of an unmodified application: refuse copies, open the session, run it, commit no output."""
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        # Run as a script, this package directory leads sys.path: its module names must not shadow the application's.
        sys.path.pop(0)
    attempt = UnmodifiedAttempt.from_argv(argv)
    assert isinstance(attempt, UnmodifiedAttempt)
    try:
        attempt.refuse_copies()
    except ApplicationFailed as exc:
        # Before the session opens: a copy that must not run starts no Spark application at all.
        attempt.__exit__(type(exc), exc, exc.__traceback__)
        raise
    attempt.name_session()
    with attempt:
        started = time.time()
        attempt.run_application()
        attempt.write_nothing(started)


if __name__ == "__main__":
    main()
