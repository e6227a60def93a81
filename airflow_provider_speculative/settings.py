"""Read the ``[speculative]`` section from Airflow's configuration (Airflow layer only)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from airflow_provider_speculative.core.config import SECTION, SpeculativeConfig, store_root_path
from airflow_provider_speculative.store.layout import default_store_root


def airflow_config() -> SpeculativeConfig:
    """The section's values as Airflow sees them (airflow.cfg, AIRFLOW__SPECULATIVE__* env, defaults)."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # pragma: no cover - older layouts
        from airflow.configuration import conf

    values = {}
    for f in fields(SpeculativeConfig):
        if conf.has_option(SECTION, f.name):
            values[f.name] = conf.get(SECTION, f.name)
    return SpeculativeConfig().with_overrides(values, "airflow configuration")


def store_root(config: SpeculativeConfig) -> Path:
    """Absolute store root for ``config`` (``store_path`` may be a local path or a ``file://`` URL)."""
    if not config.store_path:
        return default_store_root()
    return Path(store_root_path(config.store_path, "store_path")).expanduser().resolve()
