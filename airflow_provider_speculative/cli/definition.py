"""CLI command definitions (kept import-light: loaded whenever the airflow CLI starts)."""

from __future__ import annotations

from typing import Any


def get_cli_commands() -> list[Any]:
    """Return the ``speculative`` command group for Airflow's CLI parser."""
    from airflow.cli.cli_config import ARG_OUTPUT, ActionCommand, Arg, GroupCommand, lazy_load_command

    dag_id = Arg(("--dag-id", "-d"), help="DAG id", required=True)
    run_id = Arg(("--run-id", "-r"), help="DAG run id", required=True)
    latest_run_id = Arg(("--run-id", "-r"), default=None,
                        help="DAG run id (default: the DAG's run whose stages were planned last in the store)")
    stage = Arg(("--stage", "-s"), help="only this stage", default=None)
    output = ARG_OUTPUT  # Airflow's own --output (table, json, yaml, plain), as `airflow dags list` has it
    gc_dag_id = Arg(("--dag-id", "-d"), help="only this DAG (default: every DAG in the store)", default=None)
    dry_run = Arg(("--dry-run",), help="print what would be removed and the bytes; remove nothing",
                  action="store_true")
    retention = Arg(("--retention",), default=None,
                    help="override the configured retention (also per-stage overrides), e.g. 0, 90 min, 48h")
    older_than = Arg(("--older-than",), default=None,
                     help="also remove runs missing from the metadata DB whose files are older than this "
                          "(e.g. 30d); without it only runs whose deletion the audit log records are removed")
    claim = Arg(("--claim",), action="store_true",
                help="record this Airflow's metadata DB in the store's store.json if it records none, and "
                     "claim the runs without _owner.json that a plan of this provider names")
    return [
        GroupCommand(
            name="speculative",
            help="Inspect speculative pipelines (stages, subtasks, attempts)",
            subcommands=[
                ActionCommand(
                    name="status",
                    help="List stages, subtasks and attempts of a DAG run with the admitted attempt",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.status"),
                    args=(dag_id, latest_run_id, stage, output,
                          Arg(("--watch", "-w"), action="store_true",
                              help="redraw the per-stage progress (admitted/total, running, speculative, slow) "
                                   "until the run ends; with --output json one document per line per refresh, "
                                   "yaml one document per refresh, plain one table per refresh"),
                          Arg(("--interval",), type=float, default=2.0,
                              help="seconds between --watch refreshes (default 2)")),
                ),
                ActionCommand(
                    name="logs",
                    help="Print the end of an attempt's driver log (spark-submit or Spark Connect client output)",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.logs"),
                    args=(dag_id, latest_run_id, Arg(("--stage", "-s"), help="the stage", required=True),
                          Arg(("--subtask",), help="subtask index", type=int, required=True),
                          Arg(("--attempt",), help="attempt number (default: the subtask's latest)", type=int,
                              default=None),
                          Arg(("--tail-bytes",), dest="tail_bytes", type=int, default=64 * 1024,
                              help="print at most this many bytes from the end (default 65536, at most 4 MiB)"),
                          Arg(("--follow", "-f"), action="store_true",
                              help="keep printing what the attempt writes until it ends"),
                          Arg(("--interval",), type=float, default=1.0,
                              help="seconds between --follow reads (default 1)"),
                          output),
                ),
                ActionCommand(
                    name="gc",
                    help="Remove what failed or cancelled attempts, expired results and deleted runs left in the store",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.gc"),
                    args=(gc_dag_id, dry_run, retention, older_than, claim, output),
                ),
                ActionCommand(
                    name="rerun",
                    help="Invalidate the region a stage (or some of its subtasks) affects and clear its tasks",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.rerun"),
                    args=(dag_id, run_id, Arg(("--stage", "-s"), help="stage to rerun", required=True),
                          Arg(("--subtask",), help="subtask index (repeatable); default: all", type=int,
                              action="append", default=None),
                          Arg(("--no-downstream",), dest="no_downstream", action="store_true",
                              help="rerun only the named subtasks, not their consumers (readers of a "
                                   "non-deterministic stage are included regardless)"),
                          Arg(("--dry-run",), help="only print the affected region", action="store_true"),
                          output),
                ),
                ActionCommand(
                    name="whatif",
                    help="Replay a finished DAG run in the simulator under other settings: predicted makespan, "
                         "copies and attempt-seconds next to what really happened",
                    func=lazy_load_command("airflow_provider_speculative.cli.commands.whatif"),
                    args=(dag_id, latest_run_id,
                          Arg(("--set",), dest="overrides", action="append", default=None, metavar="KEY=VALUE",
                              help="a [speculative] option for the replay, e.g. --set baseline_multiplier=2 "
                                   "(repeatable; unknown options are refused)"),
                          output),
                ),
                ActionCommand(
                    name="local-cluster",
                    help="Start, stop or list a local pool of Spark Connect servers to use as targets",
                    func=lazy_load_command("airflow_provider_speculative.cli.local_cluster.local_cluster"),
                    args=(Arg(("action",), help="start, stop or status", choices=("start", "stop", "status")),
                          Arg(("--servers",), help="number of servers (targets local-a, local-b, ...)", type=int,
                              default=2),
                          Arg(("--base-port",), help="gRPC port of the first server (then +1 each)", type=int,
                              default=15002),
                          Arg(("--ui-base-port",), help="Spark UI port of the first server (then +1 each)",
                              type=int, default=4050),
                          Arg(("--cores",), help="cores per server (master local[N])", type=int, default=2),
                          Arg(("--directory",), default=None,
                              help="pid files and logs (default $AIRFLOW_HOME/speculative-local-cluster)"),
                          Arg(("--conf",), action="append", default=[], metavar="KEY=VALUE",
                              help="a Spark setting for every server (repeatable)"),
                          Arg(("--jars",), default=None,
                              help="jars for every server: a directory (its *.jar) or a comma-separated list"),
                          Arg(("--s3",), action="store_true",
                              help="serve s3:// and s3a:// paths: the s3a jars (--jars, else "
                                   "$SPECULATIVE_S3A_JARS, else .jars/s3a-<pyspark's Hadoop> from `make jars`) "
                                   "and the endpoint of the AWS environment; keys stay in the servers' environment"),
                          Arg(("--warm-up-store",), default=None, metavar="S3_URL",
                              help="with --s3: an s3://bucket/prefix store root where each new server's warm-up "
                                   "also writes and reads an exchange, below a prefix of its own that it claims "
                                   "and deletes (default: [speculative] store_path when it is on S3)"),
                          Arg(("--warm-up-rounds",), type=int, default=None, metavar="N",
                              help="rounds of the warm-up query each new server runs before it is reported "
                                   "started (default 4; 0: none, a faster start whose first run pays the "
                                   "warm-up instead)"),
                          output),
                ),
                ActionCommand(
                    name="fork-server",
                    help="List or stop this user's fork servers on this host (warm attempt starts)",
                    func=lazy_load_command("airflow_provider_speculative.cli.local_cluster.fork_server"),
                    args=(Arg(("action",), help="status or stop", choices=("status", "stop")), output),
                ),
            ],
        )
    ]
