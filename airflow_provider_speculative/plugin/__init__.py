"""Airflow UI plugin: a run view (DAG-run tab), a stage view (task-instance tab), JSON endpoints, extra links.

Registered through the ``airflow.plugins`` entry point; ``plugins/speculative_plugin.py`` imports it
for installations that drop files into the plugins folder instead.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_speculative.links import URL_PREFIX, base_path

__all__ = ["SpeculativePlugin"]


@cache
def _fastapi_app() -> Any:
    from airflow_provider_speculative.plugin.app import create_app

    return create_app()


def _external_views() -> list[dict[str, Any]]:
    prefix = base_path()
    icon = f"{prefix}/static/icon.svg"
    return [
        {"name": "Speculative stages", "destination": "dag_run", "url_route": "speculative-run", "icon": icon,
         "href": f"{prefix}/ui/run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}"},
        {"name": "Speculative stage", "destination": "task_instance", "url_route": "speculative-stage",
         "icon": icon, "href": f"{prefix}/ui/stage?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}"},
    ]


class SpeculativePlugin(AirflowPlugin):
    """The speculative provider's UI: views on the DAG-run and task-instance pages (links: provider info)."""

    name = "speculative"
    external_views = _external_views()

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The app, built on first use: only the api-server asks, so other processes never import FastAPI."""
        return [{"app": _fastapi_app(), "url_prefix": URL_PREFIX, "name": "Speculative stages"}]
