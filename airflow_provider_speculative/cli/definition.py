"""CLI command definitions (kept import-light: loaded whenever the airflow CLI starts)."""

from __future__ import annotations

from typing import Any


def get_cli_commands() -> list[Any]:
    """Return the ``speculative`` command group for Airflow's CLI parser."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    dag_id = Arg(("--dag-id", "-d"), help="DAG id", required=True)
    run_id = Arg(("--run-id", "-r"), help="DAG run id", required=True)
    stage = Arg(("--stage", "-s"), help="only this stage", default=None)
    output = Arg(("--output", "-o"), help="output format", choices=("table", "json"), default="table")
    return [
        GroupCommand(
            name="speculative",
            help="Inspect speculative pipelines (stages, subtasks, attempts)",
            subcommands=[
                ActionCommand(
                    name="status",
                    help="List stages, subtasks and attempts of a DAG run with the admitted attempt",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.status"),
                    args=(dag_id, run_id, stage, output),
                ),
            ],
        )
    ]
