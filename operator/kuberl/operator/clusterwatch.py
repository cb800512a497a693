"""The loop that tells an RLJob why its Ray cluster is not running (the causes themselves: `diagnosis.py`).

The RLJob watch (handlers.rljob_seen) keeps `WAITING` up to date: the RLJobs whose Ray cluster exists but is not
running yet (or that carry a `ClusterReady` condition that is not True). Every few seconds, for each of them, the
loop lists the cluster's pods and the namespace's Warning Events (one list per namespace and tick) and writes
`ClusterReady` through `reconcile.write_status`; with nothing waiting it makes no API call at all. Reads only:
pods and Events get/list (rbac.OPERATOR_RULES).

A thread rather than a kopf timer: a timer makes kopf put a finalizer on every RLJob, and RLJob deletion must not
wait for the operator (handlers.py).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kuberl.api.status import TERMINAL_PHASES, ConditionType, Phase
from kuberl.operator import metrics
from kuberl.operator.diagnosis import RAY_CLUSTER_LABEL, blocking_cause, cluster_ready_status, pods_ready
from kuberl.operator.reconcile import Api, write_status
from kuberl.operator.status import Event, get_condition

log = logging.getLogger("kuberl.operator")
WAITING_PHASES = frozenset({Phase.PENDING, Phase.RESTARTING})
EVENT_COMPONENT = "kuberl-operator"  # settings.posting.reporting_component


class ClusterReads:
    """The reads of the diagnosis and its Event, on the operator's connection pool."""

    def __init__(self, api: Api) -> None:
        self.core = client.CoreV1Api(api.client)
        self.api = api

    def pods(self, namespace: str, cluster: str) -> list[dict[str, Any]]:
        listing = self.core.list_namespaced_pod(namespace, label_selector=f"{RAY_CLUSTER_LABEL}={cluster}")
        items: list[dict[str, Any]] = self.api.client.sanitize_for_serialization(listing)["items"]
        return items

    def post_event(self, rljob: dict[str, Any], event: Event) -> None:
        """A core/v1 Event on the RLJob, as kopf posts them (same component, so `kubectl describe` groups them)."""
        meta = rljob["metadata"]
        now = datetime.now(UTC)
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": rljob["apiVersion"],
                "kind": rljob["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message,
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": EVENT_COMPONENT,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], cast(client.CoreV1Event, body))
        except ApiException as exc:  # an Event is a courtesy: the condition already carries the cause
            log.warning("could not post Event %s on %s: %s", event.reason, meta["name"], exc.reason)

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


class Waiting:
    """The RLJobs that need a look, by uid, as last seen on the watch (thread-safe: fed by kopf, read by the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rljobs: dict[str, dict[str, Any]] = {}

    def observe(self, rljob: dict[str, Any], *, deleted: bool = False) -> None:
        uid = rljob["metadata"]["uid"]
        with self._lock:
            if not deleted and needs_diagnosis(rljob):
                self._rljobs[uid] = rljob
            else:
                self._rljobs.pop(uid, None)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rljobs.values())


WAITING = Waiting()


def diagnose(api: Api, reads: ClusterReads, rljobs: list[dict[str, Any]]) -> int:
    """Look at each of `rljobs`; returns how many RLJob statuses it changed."""
    writes = 0
    events_of: dict[str, list[dict[str, Any]]] = {}
    for rljob in rljobs:
        namespace = rljob["metadata"]["namespace"]
        if namespace not in events_of:
            events_of[namespace] = reads.warning_events(namespace)
        writes += diagnose_one(api, reads, rljob, events_of[namespace])
    return writes


def diagnose_one(api: Api, reads: ClusterReads, rljob: dict[str, Any], warnings: list[dict[str, Any]]) -> bool:
    """Write the RLJob's ClusterReady for its cluster's pods and `warnings`; True when the status changed."""
    meta, cluster = rljob["metadata"], rljob["status"]["rayClusterName"]
    pods = reads.pods(meta["namespace"], cluster)
    cause = blocking_cause(cluster, pods, warnings)
    ready = pods_ready(pods)
    events: list[Event] = []

    def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        new, wanted = cluster_ready_status(old, cause, ready)
        events[:] = wanted
        return new, []  # posted below: kopf.event() has no Event queue outside kopf's handlers

    after = write_status(api, meta["namespace"], meta["name"], compute, uid=meta["uid"], rljob=rljob, rayjob=None)
    if after is None or after["metadata"]["resourceVersion"] == meta["resourceVersion"]:
        return False
    log.info("RLJob %s/%s: ClusterReady %s", meta["namespace"], meta["name"], cause or "cleared")
    for event in events:
        reads.post_event(after, event)
    return True


def run(api: Api, waiting: Waiting, every: float, stop: threading.Event) -> None:
    """Diagnose the waiting RLJobs every `every` seconds until `stop` is set; errors are logged, the loop goes on."""
    reads = ClusterReads(api)
    while not stop.wait(every):
        rljobs = waiting.snapshot()
        if not rljobs:
            continue
        try:
            with metrics.reconciling("diagnose"):
                diagnose(api, reads, rljobs)
        except Exception:
            log.exception("diagnosing Ray clusters failed")
