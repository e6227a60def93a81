"""Keep a Spark application's executors on (or off) chosen nodes: pure builders of submission conf.

A *node* is what attempts report and what the blocklist blocks (a target's ``node`` label). How a
submission is pinned to a node, or kept off blocked nodes, depends on the cluster manager:

- standalone: a per-worker custom resource that only that worker offers (:func:`standalone_pin_conf`);
  blocking needs no conf because each target is one node and the scheduler simply stops choosing it;
- YARN: ``spark.yarn.exclude.nodes`` (:func:`yarn_exclude_conf`);
- Kubernetes: a pod template whose node affinity excludes the blocked nodes (:func:`kubernetes_pod_template`).

Everything here is pure (no I/O): the spark-submit backend writes the template file and adds the conf.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from typing import Any

# The label every Kubernetes node carries with its name (well-known label).
K8S_HOSTNAME_LABEL = "kubernetes.io/hostname"


def node_resource_name(node: str) -> str:
    """The standalone custom resource that stands for ``node`` (Spark resource names cannot contain dots)."""
    return "node_" + re.sub(r"[^A-Za-z0-9]", "_", node)


def standalone_worker_conf(node: str, discovery_script: str, amount: int = 1) -> dict[str, str]:
    """Worker properties offering ``amount`` units of ``node``'s resource (found by ``discovery_script``).

    One unit per executor that may run there at once (one per target slot, plus one per Connect server).
    """
    resource = node_resource_name(node)
    return {f"spark.worker.resource.{resource}.amount": str(amount),
            f"spark.worker.resource.{resource}.discoveryScript": discovery_script}


def standalone_discovery_script(node: str, amount: int = 1) -> str:
    """A resource discovery script for the worker of ``node``: prints the resource with ``amount`` addresses."""
    payload = json.dumps({"name": node_resource_name(node), "addresses": [str(i) for i in range(amount)]})
    return f"#!/bin/sh\n# Spark worker resource discovery: this worker is node {node}.\necho '{payload}'\n"


def standalone_pin_conf(node: str) -> dict[str, str]:
    """Target conf that places the application's executors only on the worker offering ``node``'s resource.

    Each executor needs one unit and the worker has one, so a worker runs one executor of a target at a
    time; give the target ``slots: 1`` (or offer more addresses in the discovery script).
    """
    return {f"spark.executor.resource.{node_resource_name(node)}.amount": "1"}


def yarn_exclude_conf(blocked: Iterable[str]) -> dict[str, str]:
    """YARN: never ask for containers on ``blocked`` nodes (empty conf when nothing is blocked)."""
    nodes = sorted(set(blocked))
    return {"spark.yarn.exclude.nodes": ",".join(nodes)} if nodes else {}


def kubernetes_pod_template(blocked: Iterable[str], base: dict[str, Any] | None = None,
                            label_key: str = K8S_HOSTNAME_LABEL) -> dict[str, Any]:
    """A pod template (``base`` or an empty Pod) whose required node affinity excludes ``blocked`` nodes.

    The exclusion is ANDed into every existing node selector term (Kubernetes ORs the terms, so adding a
    separate term would not exclude anything); ``base`` is not modified.
    """
    nodes = sorted(set(blocked))
    template: dict[str, Any] = copy.deepcopy(base) if base else {"apiVersion": "v1", "kind": "Pod"}
    if not nodes:
        return template
    expression = {"key": label_key, "operator": "NotIn", "values": nodes}
    spec = template.setdefault("spec", {})
    required = (spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression))
    return template


def kubernetes_exclude_conf(template_path: str, *, driver: bool = True) -> dict[str, str]:
    """Kubernetes conf pointing the executors (and in cluster mode the driver) at a pod template file."""
    conf = {"spark.kubernetes.executor.podTemplateFile": template_path}
    if driver:
        conf["spark.kubernetes.driver.podTemplateFile"] = template_path
    return conf


def cluster_manager(master: str | None) -> str:
    """``local``, ``standalone``, ``yarn``, ``kubernetes`` or ``other`` for a ``--master`` value."""
    master = (master or "").strip().lower()
    if master.startswith("local"):
        return "local"
    if master.startswith("spark://"):
        return "standalone"
    if master == "yarn" or master.startswith("yarn"):
        return "yarn"
    if master.startswith("k8s://"):
        return "kubernetes"
    return "other"


def blocked_nodes_submission(master: str | None, blocked: Iterable[str], template_path: str,
                             base_template: dict[str, Any] | None = None
                             ) -> tuple[dict[str, str], dict[str, Any] | None]:
    """Extra conf (and for Kubernetes the pod template to write at ``template_path``) keeping off ``blocked``.

    Local and standalone masters get nothing: there a target is one node, and the scheduler keeps new
    attempts off a blocked node by not choosing its target.
    """
    nodes = sorted(set(blocked))
    manager = cluster_manager(master)
    if not nodes or manager in ("local", "standalone", "other"):
        return {}, None
    if manager == "yarn":
        return yarn_exclude_conf(nodes), None
    return kubernetes_exclude_conf(template_path), kubernetes_pod_template(nodes, base_template)
