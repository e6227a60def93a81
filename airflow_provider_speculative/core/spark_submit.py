"""SparkSubmitOperator's arguments as a one-stage pipeline: checks, Spark conf and the wrapper's arguments.

Pure: the operator (``operators/spark_submit.py``) calls these when the DAG is parsed, the attempt
wrapper (``runtime/unmodified.py``) decodes what :func:`wrapper_args` encoded. Every refusal names the
task and the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_speculative.core.config import Target
from airflow_provider_speculative.exceptions import PipelineError

# SparkSubmitOperator's arguments that become Spark properties. spark-submit reads each of these
# properties exactly as it reads the option of the same meaning (--files, --py-files, --jars, ...)
# when the option itself is not given, and the launch command gives none of them.
CONF_OF_ARGUMENT: dict[str, str] = {
    "files": "spark.files",
    "py_files": "spark.submit.pyFiles",
    "archives": "spark.archives",
    "jars": "spark.jars",
    "driver_class_path": "spark.driver.extraClassPath",
    "packages": "spark.jars.packages",
    "exclude_packages": "spark.jars.excludes",
    "repositories": "spark.jars.repositories",
    "driver_memory": "spark.driver.memory",
    "executor_memory": "spark.executor.memory",
    "executor_cores": "spark.executor.cores",
    "num_executors": "spark.executor.instances",
    "total_executor_cores": "spark.cores.max",
    "yarn_queue": "spark.yarn.queue",
}
# Arguments holding a count (SparkSubmitOperator takes ints, not templates).
COUNT_ARGUMENTS = ("executor_cores", "num_executors", "total_executor_cores")
# Arguments holding a comma-separated list of paths or coordinates (a list is joined with commas).
LIST_ARGUMENTS = ("files", "py_files", "archives", "jars", "packages", "exclude_packages", "repositories")

# SparkSubmitOperator's arguments this operator refuses, and why (each refusal names the task and the argument).
REFUSED_ARGUMENTS: dict[str, str] = {
    "env_vars": "the attempt's environment would be written into the stage's plan.json in the store, and "
                "environment variables often carry credentials; set them in the environment of the triggerer "
                "and workers that launch attempts (every attempt inherits it), or as "
                "conf={'spark.executorEnv.NAME': ...} for executors",
    "keytab": "set 'keytab' in the spark connection's extra (SparkSubmitHook reads it there)",
    "principal": "set 'principal' in the spark connection's extra (SparkSubmitHook reads it there)",
    "use_krb5ccache": "set 'use_krb5ccache' on the connection's Kerberos setup; the launch command is built "
                      "from the connection",
    "proxy_user": "spark-submit's --proxy-user has no Spark property; attempts run as the triggerer's user",
    "deploy_mode": "set 'deploy-mode' in the spark connection's extra; an attempt's driver reports to the store, "
                   "so a cluster deploy mode needs the store mounted where the driver runs",
    "spark_binary": "set 'spark-binary' in the spark connection's extra",
    "properties_file": "put the properties in conf={...}; the launch command is built from the connection",
    "status_poll_interval": "the stage controller polls attempts itself ([speculative] check_interval)",
    "post_submit_commands": "run them in a downstream task: an attempt ends in the triggerer, not in a worker",
    "track_driver_via_k8s_api": "the stage controller tracks the attempt itself, in the triggerer",
    "yarn_track_via_rm_api": "the stage controller tracks the attempt itself, in the triggerer",
    "yarn_rm_auth": "the stage controller tracks the attempt itself, in the triggerer",
    "durable": "a retried task whose plan is unchanged reconnects to its attempts through the store already",
    "reconnect_on_retry": "a retried task whose plan is unchanged reconnects to its attempts through the store "
                          "already",
    "openlineage_inject_parent_job_info": "the stage passes OpenLineage's parent job to every attempt itself "
                                          "when the OpenLineage provider is configured",
    "openlineage_inject_transport_info": "the stage passes OpenLineage's transport to every attempt itself "
                                         "when the OpenLineage provider is configured",
}

# The first application argument of a stage whose application is the unmodified-application wrapper.
WRAPPER_MARK = "--speculative-unmodified"
# Rendered per task try into the wrapper's arguments, so the plan's fingerprint differs per try: a retried or
# cleared task runs the application again (its output is the application's own, the store cannot tell whether
# it is intact), while a triggerer taking over within the same try finds the same plan and keeps the attempt.
TRY_TEMPLATE = "{{ ti.try_number }}"
TEMPLATE_START = "{{"


@dataclass(frozen=True)
class UnmodifiedApplication:
    """What the wrapper runs: a .py file (``runpy``) or ``java_class`` of a jar, with the application's arguments."""

    application: str
    java_class: str | None
    name: str | None
    args: tuple[str, ...]
    # The task try that planned it (rendered from TRY_TEMPLATE).
    task_try: str | None = None


def where_of(task_id: str) -> str:
    """How refusals name the task."""
    return f"SpeculativeSparkSubmitOperator {task_id!r}"


def refuse(task_id: str, argument: str, problem: str) -> PipelineError:
    """The parse-time error for one argument, naming the task and the argument."""
    return PipelineError(f"{where_of(task_id)}: argument {argument!r}: {problem}")


def check_refused(task_id: str, given: Mapping[str, Any]) -> None:
    """Refuse any of SparkSubmitOperator's arguments this operator cannot honour (``given``: name -> value)."""
    for argument, value in given.items():
        if argument in REFUSED_ARGUMENTS and value not in (None, False, {}, [], ()):
            raise refuse(task_id, argument, f"not supported: {REFUSED_ARGUMENTS[argument]}")


def _fixed(value: str) -> str:
    """The part of a possibly templated string before its first expression."""
    return value.split(TEMPLATE_START, 1)[0]


def check_application(task_id: str, application: Any, java_class: Any, *, split: bool) -> None:
    """A .py file, or a jar with ``java_class``; a split (speculative) stage runs a .py using StageContext."""
    if not isinstance(application, str) or not application.strip() or "\0" in application:
        raise refuse(task_id, "application", f"must be the path of a .py file or a jar, got {application!r}")
    judged = not application.rstrip().endswith("}}")
    if java_class is not None:
        if not isinstance(java_class, str) or not java_class.strip() or any(c.isspace() for c in java_class):
            raise refuse(task_id, "java_class", f"must be a fully qualified class name, got {java_class!r}")
        if split:
            raise refuse(task_id, "java_class", "an application split by file across speculative subtasks is a "
                         "PySpark script using StageContext; a jar's main class writes its own output, and two "
                         "copies of it would write it twice")
        if judged and not application.rstrip().endswith(".jar"):
            raise refuse(task_id, "application", f"{application!r} is not a .jar; java_class names a class of "
                         "the application jar")
        return
    if judged and not application.rstrip().endswith(".py"):
        hint = " (a jar needs java_class: its main class is not read from the jar's manifest)" \
            if application.rstrip().endswith(".jar") else ""
        raise refuse(task_id, "application", f"{application!r} is not a .py file{hint}")
    scheme = _fixed(application).split("://", 1)[0].lower() if "://" in _fixed(application) else ""
    if scheme and scheme not in ("file", "local") and not split:
        # The wrapper runs the script in the driver with runpy: it must be a file there.
        raise refuse(task_id, "application", f"{application!r} is a {scheme}:// URL; an unmodified PySpark script "
                     "is run from a local path of the host that launches attempts")


def _text(task_id: str, argument: str, value: Any) -> str:
    if isinstance(value, list | tuple) and argument in LIST_ARGUMENTS:
        if not all(isinstance(v, str) and v.strip() and "," not in v for v in value):
            raise refuse(task_id, argument, f"must be a comma-separated string or a list of strings, got {value!r}")
        return ",".join(value)
    if not isinstance(value, str) or not value.strip():
        raise refuse(task_id, argument, f"must be a non-empty string, got {value!r}")
    return value


def submit_conf(task_id: str, conf: Any, arguments: Mapping[str, Any], *, application: str,
                java_class: str | None, verbose: Any) -> dict[str, str]:
    """The stage's Spark conf: ``conf`` plus each given argument as its property (the argument wins).

    A jar application is added to ``spark.jars``: the wrapper calls its main class through the driver's JVM.
    ``verbose`` sets ``spark.logConf``: the driver log then shows the effective conf (Spark redacts secrets).
    """
    if conf is not None and not isinstance(conf, dict):
        raise refuse(task_id, "conf", f"must be a dict of Spark property -> value, got {type(conf).__name__}")
    out = {str(k): str(v) for k, v in (conf or {}).items()}
    for argument, value in arguments.items():
        if argument not in CONF_OF_ARGUMENT:
            raise refuse(task_id, argument, "unknown argument")
        if value is None:
            continue
        if argument in COUNT_ARGUMENTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise refuse(task_id, argument, f"must be a positive integer, got {value!r}")
            out[CONF_OF_ARGUMENT[argument]] = str(value)
        else:
            out[CONF_OF_ARGUMENT[argument]] = _text(task_id, argument, value)
    if java_class is not None:
        jars = out.get("spark.jars")
        out["spark.jars"] = f"{application},{jars}" if jars else application
    if not isinstance(verbose, bool):
        raise refuse(task_id, "verbose", f"must be True or False, got {verbose!r}")
    if verbose:
        out["spark.logConf"] = "true"
    return out


def check_application_args(task_id: str, application_args: Any) -> list[str]:
    """``application_args`` as a list of strings (SparkSubmitOperator passes each item as one argument)."""
    if application_args is None:
        return []
    if isinstance(application_args, str) or not isinstance(application_args, Sequence):
        raise refuse(task_id, "application_args", f"must be a list of arguments, got {application_args!r}")
    return [str(a) for a in application_args]


def check_name(task_id: str, name: Any) -> str | None:
    """The Spark application name (None: the stage's own attempt name)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise refuse(task_id, "name", f"must be a non-empty one-line string, got {name!r}")
    return name


def wrapper_args(application: str, java_class: str | None, name: str | None, args: Sequence[str],
                 task_try: str = TRY_TEMPLATE) -> list[str]:
    """The stage's application arguments that tell the wrapper what to run (decoded by :func:`parse_wrapper_args`)."""
    out = [WRAPPER_MARK, "--try", task_try, "--application", application]
    if java_class is not None:
        out += ["--java-class", java_class]
    if name is not None:
        out += ["--name", name]
    return [*out, "--", *args]


def parse_wrapper_args(args: Sequence[str]) -> UnmodifiedApplication:
    """Decode :func:`wrapper_args`; ValueError if the list was not made by it."""
    items = list(args)
    if not items or items[0] != WRAPPER_MARK or "--" not in items:
        raise ValueError(f"not the arguments of an unmodified application (expected {WRAPPER_MARK} ... --): "
                         f"{items[:4]!r}")
    end = items.index("--")
    head = items[1:end]
    if len(head) % 2:
        raise ValueError(f"malformed wrapper arguments {head!r}")
    options = dict(zip(head[::2], head[1::2], strict=True))
    unknown = set(options) - {"--try", "--application", "--java-class", "--name"}
    if unknown or "--application" not in options:
        raise ValueError(f"malformed wrapper arguments {head!r}")
    return UnmodifiedApplication(application=options["--application"], java_class=options.get("--java-class"),
                                 name=options.get("--name"), args=tuple(items[end + 1:]),
                                 task_try=options.get("--try"))


def connection_targets(task_id: str, conn_id: Any, targets: Sequence[Target]) -> list[dict[str, Any]]:
    """The stage's targets for ``conn_id``: the deployment's targets on that connection, else one named after it.

    Reusing the deployment's targets keeps their slots (claimed in the store) shared with the pipelines
    that use the same connection; a connection no target uses gets one target of the default slot count.
    """
    if not isinstance(conn_id, str) or not conn_id.strip() or TEMPLATE_START in conn_id:
        raise refuse(task_id, "conn_id", f"must be the id of an Airflow spark connection, got {conn_id!r}")
    chosen = [t for t in targets if t.conn_id == conn_id]
    if not chosen:
        taken = {t.name for t in targets}
        name = conn_id if conn_id not in taken else f"{conn_id}-submit"
        chosen = [Target(name=name, conn_id=conn_id)]
    return [{"name": t.name, "conn_id": t.conn_id, "slots": "auto" if t.auto_slots else t.slots,
             **({"node": t.node} if t.node else {}), "conf": dict(t.conf),
             **({"master_ui": t.master_ui} if t.master_ui else {})} for t in chosen]
