"""Sinks: master-side finalize (FLIP-281) and the concurrent-attempts opt-in marker."""

from airflow_provider_speculative.sinks.base import (
    AttemptResult,
    FinalizationContext,
    InitializationContext,
    Sink,
    SinkWriter,
    SupportsConcurrentExecutionAttempts,
)
from airflow_provider_speculative.sinks.parquet import ParquetSink

__all__ = [
    "AttemptResult",
    "FinalizationContext",
    "InitializationContext",
    "ParquetSink",
    "Sink",
    "SinkWriter",
    "SupportsConcurrentExecutionAttempts",
]
