#!/bin/sh
# Spark worker resource discovery: this worker is node spark-worker-a.
echo '{"name": "node_spark_worker_a", "addresses": ["0", "1"]}'
