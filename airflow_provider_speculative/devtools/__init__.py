"""Development tools: a local pool of Spark Connect servers, their warm-up, and a runner of stages without Airflow.

Used by `airflow speculative local-cluster`, `make demo`, the tests and bench/; nothing in the production
path (operator, trigger, controller) imports them.
"""
