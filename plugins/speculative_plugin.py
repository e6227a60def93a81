"""Drop-in plugin file: copy into Airflow's plugins folder when the provider is importable but not pip-installed.

A pip-installed provider registers the plugin through its ``airflow.plugins`` entry point; importing
the class here as well would register it twice, so this file only exposes it when that entry point is absent.
"""

from __future__ import annotations

from importlib.metadata import entry_points

if not any(ep.value.startswith("airflow_provider_speculative.plugin") for ep in entry_points(group="airflow.plugins")):
    from airflow_provider_speculative.plugin import SpeculativePlugin

    __all__ = ["SpeculativePlugin"]
