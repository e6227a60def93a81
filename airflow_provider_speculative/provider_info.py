"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_provider_speculative.core.config import OPTIONS, SECTION


def get_provider_info() -> dict[str, Any]:
    """Describe the provider: operators, sensors, triggers, the ``[speculative]`` config section and CLI commands."""
    from airflow_provider_speculative.version import __version__

    return {
        "package-name": "airflow-provider-speculative",
        "name": "Speculative",
        "description": "Stage-level PySpark pipelines with speculative execution, finalize-on-master "
                       "commits and region failover (ideas from Apache Flink's batch scheduler).",
        "versions": [__version__],
        "integrations": [{"integration-name": "Speculative", "external-doc-url":
                          "https://pypi.org/project/airflow-provider-speculative/", "tags": ["software"]}],
        "operators": [{"integration-name": "Speculative",
                       "python-modules": ["airflow_provider_speculative.operators.stage",
                                          "airflow_provider_speculative.operators.spark_submit"]}],
        "triggers": [{"integration-name": "Speculative",
                      "python-modules": ["airflow_provider_speculative.triggers.controller",
                                         "airflow_provider_speculative.triggers.hybrid",
                                         "airflow_provider_speculative.triggers.stage_output"]}],
        "sensors": [{"integration-name": "Speculative",
                     "python-modules": ["airflow_provider_speculative.sensors.stage_output"]}],
        "config": {
            SECTION: {
                "description": "Speculative execution and stage control (FLIP-168 defaults).",
                "options": {
                    o.name: {"description": o.doc, "version_added": "0.1.0", "type": o.type,
                             "example": None, "default": o.show_default()}
                    for o in OPTIONS
                },
            }
        },
        "cli": ["airflow_provider_speculative.cli.definition.get_cli_commands"],
        "extra-links": ["airflow_provider_speculative.links.StageViewLink",
                        "airflow_provider_speculative.links.SparkHistoryLink"],
        "plugins": [{"name": "speculative", "plugin-class": "airflow_provider_speculative.plugin.SpeculativePlugin"}],
    }
