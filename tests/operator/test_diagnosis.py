"""diagnosis: which cause blocks a Ray cluster, quoted from the objects the apiserver, scheduler and kubelet write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kuberl.operator.diagnosis import (
    Cause,
    Reason,
    blocking_cause,
    cluster_ready_status,
    pods_ready,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CLUSTER = "gsm8k-raycluster-abcde"
PRIORITY = (
    'Failed to create head Pod team-a/gsm8k-raycluster-abcde-head-, pods "gsm8k-raycluster-abcde-head-" is '
    "forbidden: no PriorityClass with name batch-high was found"
)
QUOTA = (
    'Failed to create worker Pod for the cluster team-a/gsm8k-raycluster-abcde, pods "gsm8k-raycluster-abcde-'
    'trainer-worker-" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, used: '
    "requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4"
)


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(kind: str, name: str, reason: str, message: str, seconds_ago: float = 1, type_: str = "Warning") -> dict:
    return {
        "type": type_,
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": name},
        "lastTimestamp": ts(seconds_ago),
    }


def pod(
    name: str,
    role: str = "worker",
    *,
    scheduled: dict | None = None,
    waiting: dict | None = None,
    ready: bool = False,
    node: str | None = None,
    last: dict | None = None,
) -> dict[str, Any]:
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", **scheduled})
    conditions.append({"type": "Ready", "status": "True" if ready else "False"})
    status: dict[str, Any] = {"conditions": conditions}
    if waiting is not None:
        status["containerStatuses"] = [
            {"name": "ray-" + role, "state": {"waiting": waiting}, "lastState": {"terminated": last} if last else {}}
        ]
    return {
        "metadata": {"name": name, "labels": {"ray.io/cluster": CLUSTER, "ray.io/node-type": role}},
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


UNSCHEDULABLE = {
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available.",
}


def test_a_missing_priority_class_is_pod_forbidden_quoting_the_apiserver() -> None:
    cause = blocking_cause(CLUSTER, [], [event("RayCluster", CLUSTER, "FailedToCreateHeadPod", PRIORITY)], now=NOW)
    assert cause == Cause(
        Reason.POD_FORBIDDEN, "KubeRay cannot create a head pod: no PriorityClass with name batch-high was found"
    )


def test_an_exceeded_quota_is_quota_exceeded() -> None:
    head = pod("h", "head", ready=True, node="n1")
    cause = blocking_cause(CLUSTER, [head], [event("RayCluster", CLUSTER, "FailedToCreateWorkerPod", QUOTA)], now=NOW)
    assert cause is not None and cause.reason == Reason.QUOTA_EXCEEDED
    assert "exceeded quota: gpus, requested: requests.nvidia.com/gpu=8" in cause.message
    assert cause.message.startswith("KubeRay cannot create a worker pod: ")


def test_an_unschedulable_pod_quotes_the_scheduler() -> None:
    cause = blocking_cause(CLUSTER, [pod("w-1", scheduled=UNSCHEDULABLE)], [], now=NOW)
    assert cause == Cause(Reason.UNSCHEDULABLE, f"worker pod w-1: {UNSCHEDULABLE['message']}")


def test_a_failed_scheduling_event_counts_for_a_pod_without_a_node() -> None:
    events = [event("Pod", "w-1", "FailedScheduling", "0/2 nodes are available: 2 node(s) didn't match selector")]
    cause = blocking_cause(CLUSTER, [pod("w-1")], events, now=NOW)
    assert cause == Cause(
        Reason.UNSCHEDULABLE, "worker pod w-1: 0/2 nodes are available: 2 node(s) didn't match selector"
    )
    assert blocking_cause(CLUSTER, [pod("w-1", node="n1")], events, now=NOW) is None  # since bound


def test_image_pull_back_off_quotes_the_kubelet() -> None:
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/x/trainer:nope"'}
    cause = blocking_cause(CLUSTER, [pod("h", "head", node="n1", waiting=waiting)], [], now=NOW)
    assert cause == Cause(
        Reason.IMAGE_PULL_BACK_OFF, 'head pod h, container ray-head: Back-off pulling image "ghcr.io/x/trainer:nope"'
    )


def test_crash_loop_back_off_names_the_last_exit() -> None:
    waiting = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=ray-worker"}
    last = {"exitCode": 137, "reason": "OOMKilled"}
    cause = blocking_cause(CLUSTER, [pod("w", node="n1", waiting=waiting, last=last)], [], now=NOW)
    assert cause is not None and cause.reason == Reason.CRASH_LOOP_BACK_OFF
    assert cause.message.endswith(
        "back-off 40s restarting failed container=ray-worker; last exit: exit code 137 (OOMKilled)"
    )


def test_the_earliest_stage_wins_and_the_head_comes_first() -> None:
    pods = [
        pod("w-b", node="n1", waiting={"reason": "CrashLoopBackOff"}),
        pod("w-a", scheduled=UNSCHEDULABLE),
        pod("h", "head", node="n1", waiting={"reason": "ErrImagePull", "message": "pull access denied"}),
    ]
    assert blocking_cause(CLUSTER, pods, [], now=NOW).reason == Reason.UNSCHEDULABLE
    forbidden = event("RayCluster", CLUSTER, "FailedToCreateWorkerPod", PRIORITY.replace("head", "worker"))
    assert blocking_cause(CLUSTER, pods, [forbidden], now=NOW).reason == Reason.POD_FORBIDDEN
    two = [pod("w-2", scheduled=UNSCHEDULABLE), pod("h", "head", scheduled={**UNSCHEDULABLE, "message": "head"})]
    assert blocking_cause(CLUSTER, two, [], now=NOW).message == "head pod h: head"


@pytest.mark.parametrize(
    ("events", "pods"),
    [
        ([event("RayCluster", CLUSTER, "FailedToCreateHeadPod", PRIORITY, seconds_ago=301)], []),  # stale
        ([event("RayCluster", CLUSTER, "FailedToCreateHeadPod", PRIORITY)], [pod("h", "head", node="n1")]),  # fixed
        ([event("RayCluster", "other-cluster", "FailedToCreateHeadPod", PRIORITY)], []),  # someone else's
        ([event("RayCluster", CLUSTER, "FailedToCreateHeadPod", PRIORITY, type_="Normal")], []),
        ([event("RayCluster", CLUSTER, "CreatedService", "created")], []),
    ],
    ids=["stale", "head-exists-now", "other-cluster", "normal-event", "other-reason"],
)
def test_what_does_not_block(events: list[dict], pods: list[dict]) -> None:
    assert blocking_cause(CLUSTER, pods, events, now=NOW) is None


def test_a_terminating_pod_is_not_a_cause() -> None:
    gone = pod("w", scheduled=UNSCHEDULABLE)
    gone["metadata"]["deletionTimestamp"] = ts(1)
    assert blocking_cause(CLUSTER, [gone], [], now=NOW) is None


def test_pods_ready_needs_a_head_and_every_pod_ready() -> None:
    assert not pods_ready([])
    assert not pods_ready([pod("w", ready=True)])
    assert not pods_ready([pod("h", "head", ready=True), pod("w")])
    assert pods_ready([pod("h", "head", ready=True), pod("w", ready=True)])


def condition(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == "ClusterReady")


def test_cluster_ready_condition_one_event_per_cause_then_cleared() -> None:
    cause = Cause(Reason.UNSCHEDULABLE, "worker pod w: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    old = {
        "phase": "Pending",
        "conditions": [
            {"type": "Created", "status": "True", "reason": "RayJobCreated", "message": "", "lastTransitionTime": "t0"}
        ],
    }
    first, events = cluster_ready_status(old, cause, ready=False, now="t1")
    assert condition(first) == {
        "type": "ClusterReady",
        "status": "False",
        "reason": "Unschedulable",
        "message": cause.message,
        "lastTransitionTime": "t1",
    }
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", "Unschedulable", cause.message)]
    assert first["conditions"][0]["type"] == "Created"  # the others are kept as they were
    again, events = cluster_ready_status(first, cause, ready=False, now="t2")
    assert events == [] and condition(again)["lastTransitionTime"] == "t1"
    other, events = cluster_ready_status(again, Cause(Reason.IMAGE_PULL_BACK_OFF, "x"), ready=False, now="t3")
    assert [e.reason for e in events] == ["ImagePullBackOff"]
    cleared, events = cluster_ready_status(other, None, ready=False, now="t4")
    assert (condition(cleared)["status"], condition(cleared)["reason"]) == ("Unknown", "PodsStarting")
    assert [e.reason for e in events] == ["ClusterUnblocked"]
    ready, events = cluster_ready_status(cleared, None, ready=True, now="t5")
    assert (condition(ready)["status"], condition(ready)["reason"], events) == ("True", "RayClusterReady", [])


def test_no_condition_for_a_cluster_that_was_never_blocked() -> None:
    status, events = cluster_ready_status({"phase": "Pending"}, None, ready=True, now="t1")
    assert status == {"phase": "Pending"} and events == []
