"""Pure scheduling core: no Airflow, no Spark, no I/O; every rule is unit-tested with a fake clock."""
