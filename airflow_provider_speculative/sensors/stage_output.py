"""StageOutputSensor: wait until a stage of a pipeline (this DAG or another) has committed for a logical date."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_provider_speculative.control.stage_output import OutputObservation
from airflow_provider_speculative.core.config import s3_store_url_problem
from airflow_provider_speculative.core.paths import OBJECT_SCHEMES, is_object_url, redact_url, url_scheme
from airflow_provider_speculative.core.readiness import parse_instant
from airflow_provider_speculative.core.trigger_events import TriggerStatus
from airflow_provider_speculative.exceptions import PipelineError
from airflow_provider_speculative.settings import airflow_config, store_location
from airflow_provider_speculative.triggers.stage_output import StageOutputTrigger

# As check_interval's minimum: below it a deferred sensor only spins in the shared triggerer.
MIN_POKE_INTERVAL = 0.01

# The trigger reports the timeout itself (naming what is missing); Airflow's deferral timeout is only a
# backstop for a triggerer that is down, so it is set this much later.
DEFERRAL_TIMEOUT_GRACE = 60.0


class StageOutputSensor(BaseSensorOperator):
    """Wait for ``stage`` of DAG ``external_dag_id`` (default: this DAG) to commit for a logical date.

    The run is found in the result store by its logical date (default: this run's), or by ``run_id``.
    ``subtasks``: also require these subtask numbers in the commit. ``subpartitions``: also require that
    some committed subtask wrote data for each of these subpartitions. ``deferrable=True`` waits in the
    triggerer; ``deferrable=False`` pokes in ``reschedule`` mode (no slot held between pokes). Unset, it is
    ``[operators] default_deferrable``, as for Airflow's own deferrable operators.
    ``timeout`` fails the sensor naming what is missing; ``soft_fail=True`` skips it instead.
    ``store_path``: the store to watch, an absolute local path or an ``s3://bucket/prefix`` URL (read with
    ``[speculative] s3_conn_id``'s credentials); unset, the configured ``[speculative] store_path``.
    Returns (XCom) the run id and the path (on S3 the URL) of the committed record.
    """

    template_fields: Sequence[str] = ("external_dag_id", "stage", "logical_date", "run_id", "store_path")
    ui_color = "#ffd8a8"

    def __init__(self, *, stage: str, external_dag_id: str | None = None, logical_date: Any = None,
                 run_id: str | None = None, subtasks: Sequence[int] | None = None,
                 subpartitions: Sequence[int] | None = None, store_path: str | None = None,
                 deferrable: bool | None = None, poke_interval: float = 30.0, **kwargs: Any) -> None:
        if deferrable is None:
            from airflow_provider_speculative.settings import airflow_conf

            deferrable = airflow_conf().getboolean("operators", "default_deferrable", fallback=False)
        if not deferrable:
            kwargs.setdefault("mode", "reschedule")
        where = f"StageOutputSensor {kwargs.get('task_id')!r}"
        seconds = poke_interval.total_seconds() if isinstance(poke_interval, timedelta) else poke_interval
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not MIN_POKE_INTERVAL <= seconds < math.inf:
            # 0 would spin in the triggerer every deferred sensor and stage controller shares.
            raise PipelineError(f"{where}: poke_interval must be a number of seconds >= {MIN_POKE_INTERVAL:g}, "
                                f"got {poke_interval!r}")
        if not isinstance(stage, str) or not stage:
            raise PipelineError(f"{where}: stage must be the name of a stage, got {stage!r}")
        checked_store_path(where, store_path, rendered=False)
        super().__init__(poke_interval=poke_interval, **kwargs)
        if logical_date is not None and run_id is not None:
            raise ValueError(f"{self.task_id}: give logical_date or run_id, not both")
        self.stage = stage
        self.external_dag_id = external_dag_id
        self.logical_date = logical_date
        self.run_id = run_id
        self.subtasks = _indexes(where, "subtasks", subtasks)
        self.subpartitions = _indexes(where, "subpartitions", subpartitions)
        self.store_path = store_path
        self.deferrable = deferrable
        self._last: OutputObservation | None = None

    # -- what to watch -----------------------------------------------------------------------

    def _trigger(self, context: Any, deadline: float | None) -> StageOutputTrigger:
        dag_id = self.external_dag_id or context["dag"].dag_id
        # Checked again once rendered: a template may have produced anything.
        given = checked_store_path(f"StageOutputSensor {self.task_id!r}", self.store_path, rendered=True)
        if given is None:
            root = store_location(airflow_config())
        else:
            root = given if is_object_url(given) else str(Path(given).expanduser().resolve())
        # Only the connection's id goes into the trigger: the triggerer resolves it, no credential is serialized.
        conn_id = airflow_config().s3_conn_id if is_object_url(root) else ""
        run_id = self.run_id or None
        logical_date = None
        if run_id is None:
            moment = parse_instant(self.logical_date if self.logical_date not in (None, "")
                                   else context.get("logical_date"))
            if moment is None:
                raise AirflowException(f"{self.task_id}: waiting for DAG {dag_id!r}, stage {self.stage!r}: this run "
                                       "has no logical date; give logical_date or run_id")
            logical_date = moment.isoformat()
        return StageOutputTrigger(root, dag_id, self.stage, logical_date=logical_date, run_id=run_id,
                                  subtasks=self.subtasks, subpartitions=self.subpartitions,
                                  poke_interval=float(self.poke_interval), deadline=deadline, conn_id=conn_id)

    # -- reschedule / poke mode -------------------------------------------------------------

    def poke(self, context: Any) -> bool:
        """One look at the store."""
        self._last = self._trigger(context, None).locator().check()
        self.log.info("%s", self._last.message)
        return self._last.ready

    def execute(self, context: Any) -> Any:
        """Return at once if committed; else defer to StageOutputTrigger, or poke in reschedule mode."""
        if not self.deferrable:
            try:
                super().execute(context)
            except AirflowSensorTimeout as exc:
                raise AirflowSensorTimeout(self._timeout_message()) from exc
            except AirflowSkipException as exc:
                if self._last is not None and "timed out" in str(exc):
                    raise AirflowSkipException(self._timeout_message()) from exc
                raise
            return self._last.payload() if self._last is not None else None
        if self.poke(context):
            return self._last.payload() if self._last is not None else None
        trigger = self._trigger(context, time.time() + float(self.timeout))
        self.defer(trigger=trigger, method_name="execute_complete",
                   timeout=timedelta(seconds=float(self.timeout) + DEFERRAL_TIMEOUT_GRACE))

    def _timeout_message(self, message: str | None = None) -> str:
        what = message or (self._last.message if self._last else "nothing observed")
        return f"{self.task_id}: timed out after {float(self.timeout):g} s waiting for committed output: {what}"

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trigger fired: succeed, or time out (skipped with soft_fail) naming what is missing."""
        event = event or {}
        status = event.get("status")
        if status == TriggerStatus.SUCCESS:
            self.log.info("%s", event.get("message"))
            return {k: event.get(k) for k in ("run_id", "committed", "message")}
        if status == TriggerStatus.TIMEOUT:
            # BaseSensorOperator.resume_execution turns this into a skip when soft_fail is set.
            raise AirflowSensorTimeout(self._timeout_message(event.get("message")))
        raise AirflowException(f"{self.task_id}: watching the store failed: {event.get('message') or event!r}")


def checked_store_path(where: str, value: Any, *, rendered: bool) -> str | None:
    """``store_path`` as text if usable: an absolute local path, an ``s3://bucket/prefix`` URL, or (not yet
    ``rendered``) a template; None when unset; else a PipelineError naming the sensor (never echoing credentials).
    """
    if value is None or value == "":
        return None
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(text, str):
        raise PipelineError(f"{where}: store_path must be an absolute path or an s3://bucket/prefix URL, got "
                            f"{type(value).__name__}")
    if not rendered and "{{" in text:
        return text  # checked again once rendered
    scheme = url_scheme(text)
    if scheme in OBJECT_SCHEMES:
        problem = s3_store_url_problem(text)
        if problem is not None:
            raise PipelineError(f"{where}: store_path {redact_url(text)!r}: {problem}")
        return text
    if scheme is not None:
        raise PipelineError(f"{where}: store_path {redact_url(text)!r}: scheme {scheme + '://'!r} is not supported; "
                            "give an absolute local path or an s3://bucket/prefix URL")
    if not os.path.isabs(os.path.expanduser(text)):
        raise PipelineError(f"{where}: store_path {text!r} is relative; it would be resolved against the "
                            "triggerer's working directory. Give an absolute path")
    return text


def _indexes(where: str, name: str, values: Any) -> list[int] | None:
    """``values`` as a list of non-negative indexes, or a PipelineError naming the sensor and the argument."""
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | set | frozenset):
        raise PipelineError(f"{where}: {name} must be a list of indexes, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise PipelineError(f"{where}: {name} must be a list of indexes >= 0, got {bad[0]!r} in {list(values)!r}")
    return [int(v) for v in values]
