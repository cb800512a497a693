"""The loop that tells an RLJob why its Ray cluster is not running (the causes themselves: `diagnosis.py`).

Every few seconds, per served namespace: list the RLJobs, and for each one whose Ray cluster exists but is not
running yet (or that carries a `ClusterReady` condition that is not True), list the cluster's pods and the
namespace's Warning Events (one list per namespace and tick, only when some RLJob waits) and write
`ClusterReady` through `reconcile.write_status`. Reads only: pods and Events get/list (rbac.OPERATOR_RULES).

A thread rather than a kopf timer: a timer makes kopf put a finalizer on every RLJob, and RLJob deletion must not
wait for the operator (handlers.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client

from kuberl.api.status import TERMINAL_PHASES, ConditionType, Phase
from kuberl.operator import metrics
from kuberl.operator.diagnosis import RAY_CLUSTER_LABEL, blocking_cause, cluster_ready_status, pods_ready
from kuberl.operator.reconcile import Api, write_status
from kuberl.operator.status import Event, get_condition

log = logging.getLogger("kuberl.operator")
WAITING_PHASES = frozenset({Phase.PENDING, Phase.RESTARTING})


class ClusterReads:
    """The two reads of the diagnosis, on the operator's connection pool."""

    def __init__(self, api: Api) -> None:
        self.core = client.CoreV1Api(api.client)
        self.api = api

    def pods(self, namespace: str, cluster: str) -> list[dict[str, Any]]:
        listing = self.core.list_namespaced_pod(namespace, label_selector=f"{RAY_CLUSTER_LABEL}={cluster}")
        items: list[dict[str, Any]] = self.api.client.sanitize_for_serialization(listing)["items"]
        return items

    def warning_events(self, namespace: str) -> list[dict[str, Any]]:
        listing = self.core.list_namespaced_event(namespace, field_selector="type=Warning")
        items: list[dict[str, Any]] = self.api.client.sanitize_for_serialization(listing)["items"]
        return items


def needs_diagnosis(rljob: dict[str, Any]) -> bool:
    """Its Ray cluster exists and is not running yet, or a ClusterReady condition is still to be settled."""
    status = rljob.get("status") or {}
    if rljob["metadata"].get("deletionTimestamp") or not status.get("rayClusterName"):
        return False
    phase = status.get("phase")
    if phase in WAITING_PHASES:
        return True
    condition = get_condition(status, ConditionType.CLUSTER_READY)
    return phase not in TERMINAL_PHASES and condition is not None and condition.get("status") != "True"


def diagnose(api: Api, reads: ClusterReads, namespaces: list[str | None]) -> int:
    """One pass over `namespaces` (None: every namespace); returns how many RLJob statuses it changed."""
    writes = 0
    for scope in namespaces:
        events_of: dict[str, list[dict[str, Any]]] = {}
        for rljob in api.list_rljobs(scope):
            if not needs_diagnosis(rljob):
                continue
            meta, cluster = rljob["metadata"], rljob["status"]["rayClusterName"]
            namespace = meta["namespace"]
            if namespace not in events_of:
                events_of[namespace] = reads.warning_events(namespace)
            pods = reads.pods(namespace, cluster)
            cause = blocking_cause(cluster, pods, events_of[namespace])
            ready = pods_ready(pods)

            def compute(
                old: dict[str, Any], _rayjob: dict[str, Any] | None, cause: Any = cause, ready: bool = ready
            ) -> tuple[dict[str, Any], list[Event]]:
                return cluster_ready_status(old, cause, ready)

            before = meta["resourceVersion"]
            after = write_status(api, namespace, meta["name"], compute, uid=meta["uid"], rljob=rljob, rayjob=None)
            if after is not None and after["metadata"]["resourceVersion"] != before:
                writes += 1
                log.info("RLJob %s/%s: ClusterReady %s", namespace, meta["name"], cause or "cleared")
    return writes


def run(api: Api, namespaces: list[str] | None, every: float, stop: threading.Event) -> None:
    """Diagnose every `every` seconds until `stop` is set; errors are logged and counted, the loop goes on."""
    reads = ClusterReads(api)
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    while not stop.wait(every):
        try:
            with metrics.reconciling("diagnose"):
                diagnose(api, reads, scopes)
        except Exception:
            log.exception("diagnosing Ray clusters failed")
