"""Q1's scan (dags/apps/q1_scan.py), held first on a target whose environment sets ``SPECULATIVE_TEST_HELD``.

There the attempt first runs a query whose UDF sleeps for ten minutes on its Connect server: it stays in the
middle of a Spark job until the test kills that server, whatever the machine's load. Then, and on every
other target, it is Q1's scan.
"""

from __future__ import annotations

import os
import runpy
import time
from pathlib import Path

from airflow_provider_speculative.core.contract import REMOTE_ENV

if os.environ.get("SPECULATIVE_TEST_HELD"):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    spark = SparkSession.builder.remote(os.environ[REMOTE_ENV]).getOrCreate()

    @F.udf(LongType())
    def sleepy(value: int) -> int:
        time.sleep(600)
        return value

    spark.range(1).select(sleepy("id")).collect()

runpy.run_path(str(Path(__file__).resolve().parents[3] / "dags" / "apps" / "q1_scan.py"), run_name="__main__")
