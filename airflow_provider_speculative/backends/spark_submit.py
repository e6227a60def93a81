"""spark-submit backend: every attempt is its own ``spark-submit`` (its own driver JVM) under a supervisor.

Works with any ``spark`` connection (local, standalone, YARN, Kubernetes): the command line is built
at plan time by the Spark provider's ``SparkSubmitHook`` (see ``hooks/targets.py``). Cancelling
kills the attempt's process group, which holds spark-submit and, in client mode, the driver.

At launch the nodes blocked at that moment are added to the submission where the cluster manager can
honour them (YARN ``spark.yarn.exclude.nodes``, a Kubernetes pod template with node anti-affinity);
see :mod:`..core.placement` and docs/clusters.md.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from airflow_provider_speculative.backends.base import LaunchSpec
from airflow_provider_speculative.backends.commitjar import find_commit_jar
from airflow_provider_speculative.backends.supervised import SupervisedBackend, local_attempt_dir
from airflow_provider_speculative.core.placement import blocked_nodes_submission
from airflow_provider_speculative.store.backend import PosixBackend
from airflow_provider_speculative.store.layout import POD_TEMPLATE_FILE

POD_TEMPLATE_KEY = "spark.kubernetes.executor.podTemplateFile"


def conf_value(command: list[str], key: str) -> str | None:
    """The value of ``--conf key=value`` (or ``--master`` for key ``--master``) in a spark-submit command."""
    for flag, value in itertools.pairwise(command):
        if key == "--master" and flag == "--master":
            return value
        if flag == "--conf" and value.startswith(f"{key}="):
            return value.split("=", 1)[1]
    return None


def with_jar(command: list[str], jar: str) -> list[str]:
    """``command`` with ``jar`` added to its jars: its ``--jars`` (which spark-submit prefers), else its
    ``--conf spark.jars=``, else a new ``--jars`` before the application. Unchanged if the jar is there."""
    out = list(command)
    for i, (flag, value) in enumerate(itertools.pairwise(command)):
        if flag == "--jars":
            jars = [j for j in value.split(",") if j.strip()]
            out[i + 1] = value if jar in jars else ",".join([*jars, jar])
            return out
    for i, (flag, value) in enumerate(itertools.pairwise(command)):
        if flag == "--conf" and value.startswith("spark.jars="):
            jars = [j for j in value.split("=", 1)[1].split(",") if j.strip()]
            out[i + 1] = value if jar in jars else "spark.jars=" + ",".join([*jars, jar])
            return out
    application = _application_index(command)
    return [*command[:application], "--jars", jar, *command[application:]]


def with_blocked_nodes(command: list[str], blocked: tuple[str, ...] | list[str], attempt_dir: Path
                       ) -> tuple[list[str], dict[str, Any] | None, Path]:
    """``command`` with the conf keeping its executors off ``blocked`` nodes, the pod template to write, and its path.

    Options go right after the ``spark-submit`` executable (spark-submit reads options anywhere before the
    application), later than any the target set, so for the same key they win.
    """
    template_path = attempt_dir / POD_TEMPLATE_FILE
    base = None
    existing = conf_value(command, POD_TEMPLATE_KEY)
    if existing and Path(existing).exists():
        import yaml  # an Airflow dependency; JSON is YAML too

        base = yaml.safe_load(Path(existing).read_text())
    # Nodes the target itself excludes stay excluded (the added conf replaces the target's value).
    excluded = [n for n in (conf_value(command, "spark.yarn.exclude.nodes") or "").split(",") if n.strip()]
    conf, template = blocked_nodes_submission(conf_value(command, "--master"), [*blocked, *excluded],
                                              str(template_path), base)
    if not conf:
        return list(command), None, template_path
    extra = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    application = _application_index(command)
    return [*command[:application], *extra, *command[application:]], template, template_path


def _application_index(command: list[str]) -> int:
    # The first argument that is neither an option nor an option's value is the application.
    i = 1
    while i < len(command):
        if command[i].startswith("--"):
            i += 1 if "=" in command[i] or command[i] in ("--verbose", "--supervise") else 2
            continue
        return i
    return len(command)


class SparkSubmitBackend(SupervisedBackend):
    """Attempts as detached spark-submit processes; isolated drivers, 10-17 s of JVM start each."""

    kind: ClassVar[str] = "spark_submit"

    def launch(self, spec: LaunchSpec) -> None:
        """Start the attempt, first adding the current blocklist to its submission (YARN, Kubernetes).

        The provider's commit protocol jar joins the attempt's jars when this host has it built (``make
        test`` and ``local-cluster`` build it; no compiler runs at launch): exchanges are then written in
        place ([speculative] exchange_commit).
        """
        jar = find_commit_jar(build=False)
        if jar is not None:
            spec = replace(spec, command=with_jar(spec.command, str(jar)))
        if spec.blocked_nodes:
            # spark-submit reads the pod template from a local file: on a store without paths, the attempt's
            # local working directory holds it.
            attempt_dir = (self.layout.attempt_dir(spec.subtask, spec.attempt)
                           if isinstance(self.layout.store, PosixBackend)
                           else local_attempt_dir(self.layout, spec.subtask, spec.attempt))
            command, template, template_path = with_blocked_nodes(spec.command, spec.blocked_nodes, attempt_dir)
            if template is not None:
                attempt_dir.mkdir(parents=True, exist_ok=True)
                template_path.write_text(json.dumps(template, indent=2, sort_keys=True))
            spec = replace(spec, command=command)
        super().launch(spec)
