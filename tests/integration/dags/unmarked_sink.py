"""A Parquet sink that does NOT implement SupportsConcurrentExecutionAttempts (shipped to Spark via pyFiles)."""

from __future__ import annotations

from typing import Any

from airflow_provider_speculative.sinks.base import FinalizationContext, InitializationContext, Sink, SinkWriter
from airflow_provider_speculative.sinks.parquet import ParquetSink


class UnmarkedParquetSink(Sink):
    """Same files as ParquetSink, but without the opt-in marker: its stage must never be speculated."""

    template_fields = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {"path": self.path}

    def create_writer(self, context: InitializationContext) -> SinkWriter:
        """Delegate to ParquetSink's writer."""
        return ParquetSink(self.path).create_writer(context)

    def finalize_global(self, context: FinalizationContext) -> dict[str, Any]:
        """Delegate to ParquetSink's finalize."""
        return ParquetSink(self.path).finalize_global(context)
