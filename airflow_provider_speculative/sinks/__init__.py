"""Sinks: master-side finalize (FLIP-281) and the concurrent-attempts opt-in marker."""

from airflow_provider_speculative.sinks.base import (
    AttemptResult,
    FinalizationContext,
    InitializationContext,
    PlanContext,
    Sink,
    SinkWriter,
    StagingObject,
    StagingScope,
    SupportsConcurrentExecutionAttempts,
)
from airflow_provider_speculative.sinks.parquet import ParquetSink
from airflow_provider_speculative.sinks.postgres import PostgresSink

__all__ = [
    "AttemptResult",
    "FinalizationContext",
    "InitializationContext",
    "ParquetSink",
    "PlanContext",
    "PostgresSink",
    "Sink",
    "SinkWriter",
    "StagingObject",
    "StagingScope",
    "SupportsConcurrentExecutionAttempts",
]
