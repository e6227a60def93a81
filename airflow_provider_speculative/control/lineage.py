"""A stage run's lineage from the store: the plans of its run and its sink's dataset (see core/lineage.py)."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_speculative.control.readmodel import run_plans
from airflow_provider_speculative.core.lineage import LineageDataset, dataset_of_uri, stage_lineage
from airflow_provider_speculative.exceptions import NotFoundError
from airflow_provider_speculative.sinks.base import Sink
from airflow_provider_speculative.store.backend import StoreBackend
from airflow_provider_speculative.store.layout import shown_root, store_at


def lineage_of_stage(root: Path | StoreBackend, dag_id: str, run_id: str, stage: str,
                     sink: Sink | None) -> tuple[list[LineageDataset], list[LineageDataset]]:
    """(inputs, outputs) of ``stage`` in the run; NotFoundError when the stage was never planned.

    ``sink`` is the stage's declared sink: its dataset is the one its asset names (one per pipeline, not
    one per logical date).
    """
    plans = run_plans(root, dag_id, run_id)
    if stage not in plans:
        raise NotFoundError(f"DAG {dag_id!r} run {run_id!r}: stage {stage!r} has no plan "
                            f"under {shown_root(store_at(root))}")
    return stage_lineage(plans, stage, dataset_of_uri(sink.lineage_uri()) if sink is not None else None)
