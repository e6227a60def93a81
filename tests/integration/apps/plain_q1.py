"""TPC-H Q1 as a plain PySpark script, unaware of the provider: ``plain_q1.py <lineitem dir> <output dir>``.

It builds its own session and writes its own output with ``df.write``, as a script run by spark-submit
(or SparkSubmitOperator) does.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

Q1 = """
SELECT l_returnflag, l_linestatus,
       sum(l_quantity) AS sum_qty,
       sum(l_extendedprice) AS sum_base_price,
       sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       avg(l_quantity) AS avg_qty,
       avg(l_extendedprice) AS avg_price,
       avg(l_discount) AS avg_disc,
       count(*) AS count_order
FROM lineitem
WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL 90 DAY
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus
"""

if __name__ == "__main__":
    source, output = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.appName("plain-q1").getOrCreate()
    spark.read.parquet(source).createOrReplaceTempView("lineitem")
    spark.sql(Q1).coalesce(1).write.mode("overwrite").parquet(output)
    spark.stop()
