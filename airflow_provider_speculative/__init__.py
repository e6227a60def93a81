"""airflow-provider-speculative: speculative, region-failover PySpark stages orchestrated by Airflow."""

from __future__ import annotations

from airflow_provider_speculative.version import __version__

__all__ = ["ParquetSink", "Pipeline", "SpeculativeSparkSubmitOperator", "StageOutputSensor", "__version__",
           "all_to_all", "broadcast", "get_provider_info", "parquet_source", "pointwise"]


def __getattr__(name: str):  # lazy: the Spark-side runtime imports this package without Airflow
    if name in ("Pipeline", "all_to_all", "broadcast", "pointwise", "parquet_source"):
        from airflow_provider_speculative import pipeline

        return getattr(pipeline, name)
    if name == "ParquetSink":
        from airflow_provider_speculative.sinks.parquet import ParquetSink

        return ParquetSink
    if name == "SpeculativeSparkSubmitOperator":
        from airflow_provider_speculative.operators.spark_submit import SpeculativeSparkSubmitOperator

        return SpeculativeSparkSubmitOperator
    if name == "StageOutputSensor":
        from airflow_provider_speculative.sensors.stage_output import StageOutputSensor

        return StageOutputSensor
    if name == "get_provider_info":
        from airflow_provider_speculative.provider_info import get_provider_info

        return get_provider_info
    raise AttributeError(name)
