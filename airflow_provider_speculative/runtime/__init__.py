"""Runs inside the Spark driver: stage context, exchange readers/writers, heartbeat. Never imports Airflow."""

from airflow_provider_speculative.runtime.context import StageContext

__all__ = ["StageContext"]
