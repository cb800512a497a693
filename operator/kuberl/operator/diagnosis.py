"""Why an RLJob's Ray cluster is not running: the first blocking cause, from its pods and their Warning Events.

Pure functions over the objects as the apiserver returns them (plain dicts). KubeRay reports a refused pod creation
only as a Warning Event on the RayCluster (`FailedToCreateHeadPod` / `FailedToCreateWorkerPod`, message ending in
the apiserver's reason); a scheduler and a kubelet report theirs on the pod (`PodScheduled=False`, a container
waiting in `ImagePullBackOff` / `CrashLoopBackOff`, a `FailedScheduling` Event). The causes are ranked by the stage
at which they stop a pod, earliest first: a pod that cannot be created hides whether the others could be scheduled.

`cluster_ready_status(old, cause, pods)` turns the result into the RLJob's `ClusterReady` condition and the one
Event a new cause deserves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kuberl.api.contract import timestamp
from kuberl.api.status import ConditionType
from kuberl.operator.status import Event, get_condition, set_condition, sort_conditions

# KubeRay's Event reasons for a refused pod creation (ray-operator/controllers/ray/utils/constant.go).
HEAD_CREATE_FAILED = "FailedToCreateHeadPod"
WORKER_CREATE_FAILED = "FailedToCreateWorkerPod"
FAILED_SCHEDULING = "FailedScheduling"  # kube-scheduler's Event on a pod it cannot place
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"  # a worker pod's group: its workerGroupSpecs[].groupName
FRESH_SECONDS = 300.0
"""A creation failure older than this is history: KubeRay repeats the Event (with a new lastTimestamp) while it
still fails, at most every ~5 minutes with controller-runtime's back-off."""

IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})


class Reason(StrEnum):
    """`ClusterReady` reasons, in the order of the stage that blocks (earliest first)."""

    POD_FORBIDDEN = "PodForbidden"
    QUOTA_EXCEEDED = "QuotaExceeded"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"


STAGE = {reason: rank for rank, reason in enumerate(Reason)}
READY_REASON = "RayClusterReady"
STARTING_REASON = "PodsStarting"


@dataclass(frozen=True)
class Cause:
    reason: Reason
    message: str  # quotes what the apiserver, scheduler or kubelet said


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _event_time(event: dict[str, Any]) -> datetime | None:
    series = event.get("series") or {}
    for text in (series.get("lastObservedTime"), event.get("lastTimestamp"), event.get("eventTime")):
        when = _timestamp(text)
        if when is not None:
            return when
    return _timestamp((event.get("metadata") or {}).get("creationTimestamp"))


def _forbidden_detail(message: str) -> str:
    """`Failed to create head Pod ns/x, pods "x-head-" is forbidden: no PriorityClass ...` -> the part after it."""
    _, sep, detail = message.partition("is forbidden: ")
    return detail.strip() if sep else message.strip()


def _creation_cause(event: dict[str, Any]) -> Cause:
    message = event.get("message") or ""
    detail = _forbidden_detail(message)
    reason = Reason.QUOTA_EXCEEDED if "exceeded quota" in detail else Reason.POD_FORBIDDEN
    group = "head" if event.get("reason") == HEAD_CREATE_FAILED else "worker"
    return Cause(reason, f"KubeRay cannot create a {group} pod: {detail}")


def _pod_role(pod: dict[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(RAY_NODE_TYPE_LABEL) or "ray"


def _pod_cause(pod: dict[str, Any], scheduling_events: dict[str, str]) -> Cause | None:
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = meta.get("name", "")
    label = f"{_pod_role(pod)} pod {name}"
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return Cause(Reason.UNSCHEDULABLE, f"{label}: {scheduled.get('message') or 'no node fits it'}")
    if not (pod.get("spec") or {}).get("nodeName") and name in scheduling_events:
        return Cause(Reason.UNSCHEDULABLE, f"{label}: {scheduling_events[name]}")
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    waiting = [(s.get("name", ""), s.get("state", {}).get("waiting") or {}, s) for s in statuses]
    for container, state, _ in waiting:
        if state.get("reason") in IMAGE_PULL_REASONS:
            detail = state.get("message") or state["reason"]
            return Cause(Reason.IMAGE_PULL_BACK_OFF, f"{label}, container {container}: {detail}")
    for container, state, full in waiting:
        if state.get("reason") == "CrashLoopBackOff":
            last = (full.get("lastState") or {}).get("terminated") or {}
            exit_text = f"exit code {last['exitCode']}" if "exitCode" in last else ""
            if last.get("reason"):
                exit_text += f" ({last['reason']})" if exit_text else last["reason"]
            detail = state.get("message") or "back-off restarting the failed container"
            return Cause(
                Reason.CRASH_LOOP_BACK_OFF,
                f"{label}, container {container}: {detail}" + (f"; last exit: {exit_text}" if exit_text else ""),
            )
    return None


def blocking_cause(
    cluster_name: str,
    pods: Iterable[dict[str, Any]],
    events: Iterable[dict[str, Any]],
    *,
    now: datetime | None = None,
    fresh_seconds: float = FRESH_SECONDS,
) -> Cause | None:
    """The first cause that keeps the Ray cluster `cluster_name` from running, or None.

    `pods`: the cluster's pods (label `ray.io/cluster`); `events`: Warning Events of the namespace (others are
    ignored). A head-creation failure no longer counts once a head pod exists, nor any creation failure older
    than `fresh_seconds`.
    """
    now = now or datetime.now(UTC)
    pods = sorted(pods, key=lambda p: (_pod_role(p) != "head", (p.get("metadata") or {}).get("name", "")))
    pod_names = {(p.get("metadata") or {}).get("name") for p in pods}
    has_head = any(_pod_role(p) == "head" for p in pods)
    causes: list[Cause] = []
    scheduling: dict[str, str] = {}
    for event in sorted(events, key=lambda e: _event_time(e) or now):
        if event.get("type") != "Warning":
            continue
        involved = event.get("involvedObject") or event.get("regarding") or {}
        kind, name, reason = involved.get("kind"), involved.get("name"), event.get("reason")
        if kind == "RayCluster" and name == cluster_name and reason in (HEAD_CREATE_FAILED, WORKER_CREATE_FAILED):
            when = _event_time(event)
            if when is not None and (now - when).total_seconds() > fresh_seconds:
                continue
            if reason == HEAD_CREATE_FAILED and has_head:
                continue
            causes.append(_creation_cause(event))
        elif kind == "Pod" and name in pod_names and reason == FAILED_SCHEDULING:
            scheduling[str(name)] = event.get("message") or "no node fits it"
    causes += [c for c in (_pod_cause(p, scheduling) for p in pods) if c is not None]
    return min(causes, key=lambda c: STAGE[c.reason]) if causes else None


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pods_ready(pods: Iterable[dict[str, Any]]) -> bool:
    """The head pod exists and every live pod of the cluster is Ready."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not any(_pod_role(p) == "head" for p in live):
        return False
    return all(pod_ready(p) for p in live)


def cluster_ready_status(
    old: dict[str, Any] | None,
    cause: Cause | None,
    ready: bool,
    *,
    now: str | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """`old` with the `ClusterReady` condition for `cause`, and a Warning Event when the cause is new.

    Without a cause the condition is written only if it exists already (an RLJob whose cluster starts without a
    hitch never gets one): True once every pod is Ready, Unknown while they start.
    """
    now = now or timestamp()
    new = copy.deepcopy(old or {})
    new.pop("kopf", None)
    previous = get_condition(old, ConditionType.CLUSTER_READY)
    if cause is None and previous is None:
        return new, []  # never blocked: no condition, no write
    conditions: list[dict[str, Any]] = list(new.get("conditions") or [])
    events: list[Event] = []
    if cause is not None:
        set_condition(conditions, ConditionType.CLUSTER_READY, False, str(cause.reason), cause.message, now)
        if previous is None or previous.get("status") != "False" or previous.get("reason") != str(cause.reason):
            events.append(Event("Warning", str(cause.reason), cause.message))
    else:
        if ready:
            set_condition(conditions, ConditionType.CLUSTER_READY, True, READY_REASON, "every Ray pod is Ready", now)
        else:
            set_condition(
                conditions,
                ConditionType.CLUSTER_READY,
                "Unknown",
                STARTING_REASON,
                "nothing blocks the Ray cluster's pods any more; they are starting",
                now,
            )
        if previous is not None and previous.get("status") == "False":
            events.append(Event("Normal", "ClusterUnblocked", f"no longer blocked ({previous.get('reason')})"))
    new["conditions"] = sort_conditions(conditions)
    return new, events
