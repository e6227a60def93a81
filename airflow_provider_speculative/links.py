"""Operator extra links of a stage task: its stage view, and the Spark history of its admitted attempts.

A leaf module: it imports no operator and nothing of the UI plugin, so parsing a DAG stays cheap.
Declared on SparkStageOperator and under ``extra-links`` in the provider info (the api-server
deserialises them from there). A link is computed from the task instance's key alone; what it
shows is read from what the stage persisted in the store (the plugin's pages do the reading).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_provider_speculative.settings import airflow_conf

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

URL_PREFIX = "/speculative"
log = logging.getLogger(__name__)


def spark_history_url() -> str:
    """``[speculative] spark_history_url`` (validated), or "" when none (or no valid one) is configured.

    Only this option is read and parsed: a link is computed inside the api-server for every task page,
    and an invalid value of some other option must not make the button disappear.
    """
    from airflow_provider_speculative.core.config import parse_option
    from airflow_provider_speculative.core.urls import safe_http_url
    from airflow_provider_speculative.exceptions import ConfigError

    raw = airflow_conf().get("speculative", "spark_history_url", fallback="") or ""
    try:
        value = str(parse_option("spark_history_url", raw, "airflow configuration")).strip()
    except ConfigError as exc:
        # Workers refuse to plan with it; here a bad value only means no link, not a broken task page.
        log.warning("no Spark history links: %s", exc)
        return ""
    return safe_http_url(value) or ""


def base_path() -> str:
    """Path the plugin app is served under: ``[api] base_url``'s path + ``/speculative``."""
    base = airflow_conf().get("api", "base_url", fallback="") or ""
    return urlsplit(base).path.rstrip("/") + URL_PREFIX


def plugin_url(route: str, **params: str) -> str:
    """URL of a plugin page; absolute when ``[api] base_url`` names a host, else a path on the api-server."""
    base = (airflow_conf().get("api", "base_url", fallback="") or "").rstrip("/")
    if not urlsplit(base).netloc:
        base = urlsplit(base).path.rstrip("/")
    return f"{base}{URL_PREFIX}{route}?{urlencode(params)}"


class StageViewLink(BaseOperatorLink):
    """Link from a stage task to its stage view (subtasks and attempts on a time axis)."""

    name = "Speculative stage view"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """The plugin's stage page for this task instance."""
        return plugin_url("/ui/stage", dag_id=ti_key.dag_id, run_id=ti_key.run_id, task_id=ti_key.task_id)


class SparkHistoryLink(BaseOperatorLink):
    """Link from a stage task to the Spark history of its admitted attempts (when a history server is set)."""

    name = "Spark history (admitted attempts)"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """The plugin's redirect to the history server, or "" (no button) without ``spark_history_url``."""
        if not spark_history_url():
            return ""
        return plugin_url("/ui/spark", dag_id=ti_key.dag_id, run_id=ti_key.run_id, task_id=ti_key.task_id)
