"""``airflow speculative ...`` commands."""
