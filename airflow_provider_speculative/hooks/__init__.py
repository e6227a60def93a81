"""Airflow-side resolution of targets: connections to launch templates for the backends."""
