"""spark-submit backend: every attempt is its own ``spark-submit`` (its own driver JVM) under a supervisor.

Works with any ``spark`` connection (local, standalone, YARN, Kubernetes): the command line is built
at plan time by the Spark provider's ``SparkSubmitHook`` (see ``hooks/targets.py``). Cancelling
kills the attempt's process group, which holds spark-submit and, in client mode, the driver.
"""

from __future__ import annotations

from typing import ClassVar

from airflow_provider_speculative.backends.supervised import SupervisedBackend


class SparkSubmitBackend(SupervisedBackend):
    """Attempts as detached spark-submit processes; isolated drivers, 10-17 s of JVM start each."""

    kind: ClassVar[str] = "spark_submit"
