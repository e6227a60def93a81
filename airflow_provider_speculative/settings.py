"""Read the ``[speculative]`` section from Airflow's configuration (Airflow layer only)."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_speculative.core.config import (
    NOT_OPTIONS,
    OPTIONS,
    SECTION,
    SpeculativeConfig,
    host_default_targets,
    not_an_option_error,
    store_root_path,
    unknown_options,
)
from airflow_provider_speculative.store.backend import S3Credentials, StoreBackend
from airflow_provider_speculative.store.layout import default_store_root
from airflow_provider_speculative.store.roots import is_s3_root, open_store, resolve_connections_with, split_plan_url

if TYPE_CHECKING:
    from airflow_provider_speculative.core.graph import PipelineGraph

log = logging.getLogger(__name__)


def airflow_conf() -> Any:
    """Airflow's configuration object (the Task SDK's where it exists)."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # pragma: no cover - older layouts
        from airflow.configuration import conf
    return conf


def section_keys(conf: Any) -> list[str]:
    """Every key set in the section: airflow.cfg, AIRFLOW__SPECULATIVE__* env vars and provider defaults."""
    try:
        section = conf.getsection(SECTION) or {}
    except Exception:  # a config without the section has no misspellings
        return []
    # Env var keys arrive as written after the prefix; options are lower case.
    return [str(key).lower() for key in section]


def warn_unknown_options(conf: Any) -> list[str]:
    """Log a warning listing misspelled keys of the section and the known options; return the unknown keys."""
    unknown = unknown_options(set(section_keys(conf)))
    if unknown:
        log.warning("[%s] unknown option(s) %s in airflow.cfg or AIRFLOW__%s__* environment variables are "
                    "ignored; known options: %s", SECTION, ", ".join(unknown), SECTION.upper(),
                    ", ".join(o.name for o in OPTIONS))
    return unknown


def airflow_config() -> SpeculativeConfig:
    """The section's values as Airflow sees them (airflow.cfg, AIRFLOW__SPECULATIVE__* env, defaults)."""
    conf = airflow_conf()
    not_options = sorted(set(section_keys(conf)) & set(NOT_OPTIONS))
    if not_options:
        # A warning would let a test switch do nothing unnoticed: refuse it, saying what to use instead.
        name = not_options[0]
        raise not_an_option_error(name, f"airflow.cfg or AIRFLOW__{SECTION.upper()}__{name.upper()}")
    warn_unknown_options(conf)
    values = {o.name: conf.get(SECTION, o.name) for o in OPTIONS if conf.has_option(SECTION, o.name)}
    config = SpeculativeConfig().with_overrides(values, "airflow configuration")
    # Airflow answers with the provider's declared default when nobody set the option: size it for this host.
    if values.get("targets") in (None, _TARGETS_OPTION.show_default()):
        config = dataclasses.replace(config, targets=host_default_targets(host_cores()))
    return config


_TARGETS_OPTION = next(o for o in OPTIONS if o.name == "targets")


def host_cores() -> int:
    """The CPUs this process may run on (its affinity: taskset or a cgroup cpuset narrows it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def store_root(config: SpeculativeConfig) -> Path:
    """Absolute store root for ``config`` (``store_path`` may be a local path or a ``file://`` URL)."""
    if not config.store_path:
        return default_store_root()
    return Path(store_root_path(config.store_path, "store_path")).expanduser().resolve()


def store_location(config: SpeculativeConfig) -> str:
    """The store root ``config`` names: the absolute POSIX root (as :func:`store_root`), or an ``s3://`` URL.

    ``store_path`` on S3 is accepted when the configuration is parsed only with ``experimental_s3_store``
    (``core/config.py``: experimental); everything from here down serves it.
    """
    if is_s3_root(config.store_path):
        return config.store_path
    return str(store_root(config))


def configured_store(config: SpeculativeConfig | None = None) -> StoreBackend:
    """The store of ``[speculative] store_path`` (default ``$AIRFLOW_HOME/speculative-store``) as a backend.

    What the CLI and the UI read and gc: opened through the process's cache (``store/roots.py``), an S3 root
    with the credentials of ``[speculative] s3_conn_id`` or the AWS environment, as S3 sources.
    """
    config = airflow_config() if config is None else config
    return open_store(store_location(config), conn_id=config.s3_conn_id)


def store_of(root: str, conn_id: str = "") -> StoreBackend:
    """The backend of a store root a plan or a trigger names, an S3 one with connection ``conn_id``'s credentials."""
    return open_store(root, conn_id=conn_id)


def read_plan_at(location: str, conn_id: str | None = None) -> Any:
    """The ``plan.json`` at ``location`` (``str(layout.plan)``, what triggers and events carry); None if missing.

    A local path is read as always; an object URL by name in its store, whose root is the URL less its last
    four segments (``<dag>/<run>/<stage>/plan.json``), opened with connection ``conn_id``'s credentials (None:
    ``[speculative] s3_conn_id``'s).
    """
    if not is_s3_root(location):
        from airflow_provider_speculative.store.files import read_json

        return read_json(location)
    root, name = split_plan_url(location)
    return store_of(root, airflow_config().s3_conn_id if conn_id is None else conn_id).read_json(name)


def connection_credentials(conn_id: str) -> S3Credentials:
    """The S3 credentials of Airflow connection ``conn_id`` (``hooks/objectstore.py``), for a store on S3."""
    from airflow_provider_speculative.hooks.objectstore import s3_settings

    return s3_settings(conn_id, "the store ([speculative] store_path)")


# Every Airflow process of the provider imports this module before it opens a store: from here on, an S3 store
# opened with a connection id (a plan's s3_conn_id) takes that connection's credentials. An attempt's runtime
# never imports it and uses the AWS environment.
resolve_connections_with(connection_credentials)


def metadata_db_identity() -> dict[str, str] | None:
    """Identity of the metadata database this Airflow is configured for; None if it is not configured here."""
    from airflow_provider_speculative.store.identity import db_identity

    try:
        url = airflow_conf().get("database", "sql_alchemy_conn")
    except Exception:  # a worker without database settings: the store is claimed elsewhere
        return None
    try:
        return db_identity(url) if url else None
    except Exception:  # Airflow 3 task processes get "airflow-db-not-allowed:///", which is no URL
        return None


def stage_config(graph: PipelineGraph, stage: str) -> SpeculativeConfig:
    """The deployment's options with the pipeline's and then the stage's overrides."""
    return (airflow_config()
            .with_overrides(graph.config, f"pipeline {graph.name!r}")
            .with_overrides(graph.stages[stage].config, f"stage {stage!r}"))
