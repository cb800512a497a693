"""The elastic rollout pool: `cluster.rollout.nodes` reaches the running Ray cluster, its pods reach the status.

KubeRay builds a RayJob's RayCluster once from `spec.rayClusterSpec` and then disregards edits of it (v1.6.2,
`rayjob_controller.go::getOrCreateRayClusterInstance`: "Disregard changes in RayClusterSpec of RayJob"). A resize of a
running job is therefore written to the RayCluster, whose pods KubeRay reconciles
(`raycluster_controller.go::reconcilePods`): the rollout worker group's `replicas`, `minReplicas` and `maxReplicas`
(the rendered groups pin all three: no autoscaler) and, on a scale-down, the pods to remove in
`scaleStrategy.workersToDelete`, which KubeRay deletes first (without an autoscaler it would otherwise delete
whichever pods its list returns first). Named are the pods named already, then pods that are not ready (they hold
no engine), then the newest; a name stays until its pod is gone, so that a repeated reconcile makes no patch. The
RayJob's template gets the same size (`rayjob.rayjob_update_ops`) for the next cluster KubeRay builds (a retry).

Pure functions of the RayCluster and the rollout group's pods. What the status says:

| RLJob phase  | Ray cluster | status.rollout            | condition RolloutPoolEmpty                            |
|--------------|-------------|---------------------------|-------------------------------------------------------|
| Running      | exists      | {replicas, readyReplicas} | True with no ready pod (one Warning Event), else False |
| other        | exists      | {replicas, readyReplicas} | removed                                               |
| any          | none        | removed                   | removed                                               |
"""

from __future__ import annotations

from typing import Any

from kuberl.api.contract import ROLLOUT_POOL
from kuberl.api.status import ConditionType, Phase
from kuberl.operator.diagnosis import pod_ready
from kuberl.operator.status import Event, get_condition, set_condition, sort_conditions

SIZE_FIELDS = ("replicas", "minReplicas", "maxReplicas")  # a rendered worker group pins all three to the pool size
RESIZED = "RolloutPoolResized"  # Event reason of a resize written to the Ray cluster
NO_READY_POD = "NoReadyRolloutPod"  # RolloutPoolEmpty=True: the trainer waits for an engine
PODS_READY = "RolloutPodsReady"  # RolloutPoolEmpty=False


def group_index(groups: list[dict[str, Any]]) -> int | None:
    """Index of the rollout worker group among `workerGroupSpecs`, None without one (rollout colocated)."""
    return next((i for i, group in enumerate(groups) if group.get("groupName") == ROLLOUT_POOL), None)


def size_ops(groups: list[dict[str, Any]], prefix: str, replicas: int) -> list[dict[str, Any]]:
    """JSON-patch ops giving the rollout group of `groups` (at `prefix`, the path of the list) `replicas` pods."""
    index = group_index(groups)
    if index is None:
        return []
    path = f"{prefix}/{index}"
    ops = [
        {"op": "add", "path": f"{path}/{key}", "value": replicas}
        for key in SIZE_FIELDS
        if groups[index].get(key) != replicas
    ]
    return [_is_rollout_group(path), *ops] if ops else []


def _is_rollout_group(path: str) -> dict[str, Any]:
    """The op that makes a patch fail when the group at `path` is not the rollout group (the list changed)."""
    return {"op": "test", "path": f"{path}/groupName", "value": ROLLOUT_POOL}


def _terminating(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pods_to_remove(pods: list[dict[str, Any]], replicas: int, listed: list[str]) -> list[str]:
    """`scaleStrategy.workersToDelete` for a group of `pods` asked to have `replicas`, given the names `listed` there
    now: the pods beyond `replicas` (those listed first, then those not ready, then the newest), and the listed pods
    still terminating. Sorted."""
    terminating = {p["metadata"]["name"] for p in pods if _terminating(p)}
    alive = [p for p in pods if not _terminating(p)]
    newest_first = sorted(
        alive, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]), reverse=True
    )
    order = sorted(newest_first, key=lambda p: (p["metadata"]["name"] not in listed, pod_ready(p)))
    excess = [p["metadata"]["name"] for p in order[: max(len(alive) - replicas, 0)]]
    return sorted([name for name in listed if name in terminating] + excess)


def resize_ops(raycluster: dict[str, Any], replicas: int, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON-patch ops bringing the RayCluster's rollout group to `replicas` pods, naming the ones to remove from
    `pods` (the group's pods); [] when it is there already or has no rollout group."""
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    index = group_index(groups)
    if index is None:
        return []
    path = f"/spec/workerGroupSpecs/{index}"
    ops = size_ops(groups, "/spec/workerGroupSpecs", replicas)
    strategy = groups[index].get("scaleStrategy") or {}
    listed = list(strategy.get("workersToDelete") or [])
    remove = pods_to_remove(pods, replicas, listed)
    if sorted(listed) != remove:
        ops = ops or [_is_rollout_group(path)]
        ops.append({"op": "add", "path": f"{path}/scaleStrategy", "value": {**strategy, "workersToDelete": remove}})
    return ops


def rollout_group(raycluster: dict[str, Any]) -> dict[str, Any] | None:
    """The RayCluster's rollout worker group; None without one."""
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    index = group_index(groups)
    return None if index is None else groups[index]


def group_replicas(raycluster: dict[str, Any]) -> int | None:
    """The pods the RayCluster's rollout group asks for; None without one."""
    group = rollout_group(raycluster)
    return None if group is None else int(group.get("replicas") or 0)


def resize_event(raycluster: dict[str, Any], before: int) -> Event:
    """The Normal Event of a resize written to `raycluster` (as patched), from `before` pods."""
    group = rollout_group(raycluster) or {}
    message = (
        f"rollout pool of Ray cluster {raycluster['metadata']['name']} resized from {before} to "
        f"{group.get('replicas')} pods (cluster.rollout.nodes)"
    )
    removed = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
    if removed:
        message += f"; removing {', '.join(removed)}"
    return Event("Normal", RESIZED, message)


def pool_status(raycluster: dict[str, Any] | None, pods: list[dict[str, Any]]) -> dict[str, int] | None:
    """`status.rollout` of a Ray cluster (None: there is none, or it has no rollout group) and its group's pods."""
    replicas = None if raycluster is None else group_replicas(raycluster)
    if replicas is None:
        return None
    ready = sum(1 for p in pods if not _terminating(p) and pod_ready(p))
    return {"replicas": replicas, "readyReplicas": ready}


def rollout_status(
    old: dict[str, Any], pool: dict[str, int] | None, timeout_seconds: int, now: str
) -> tuple[dict[str, Any], list[Event]]:
    """The status with `status.rollout` = `pool` (`pool_status`) and the condition RolloutPoolEmpty (module
    docstring); a Warning Event when the pool of a Running job becomes empty."""
    new = {k: v for k, v in old.items() if k != "kopf"}
    conditions = [c for c in old.get("conditions") or [] if c.get("type") != ConditionType.ROLLOUT_POOL_EMPTY]
    events: list[Event] = []
    if pool is None:
        new.pop("rollout", None)
    else:
        new["rollout"] = pool
    if pool is not None and old.get("phase") == Phase.RUNNING:
        conditions = list(old.get("conditions") or [])
        if pool["readyReplicas"] == 0:
            message = (
                f"no rollout pod is ready (the pool asks for {pool['replicas']}); the trainer waits up to "
                f"runPolicy.emptyRolloutPoolTimeoutSeconds = {timeout_seconds} s for one, then the attempt fails"
            )
            was_empty = (get_condition(old, ConditionType.ROLLOUT_POOL_EMPTY) or {}).get("status") == "True"
            set_condition(conditions, ConditionType.ROLLOUT_POOL_EMPTY, True, NO_READY_POD, message, now)
            if not was_empty:
                events.append(Event("Warning", str(ConditionType.ROLLOUT_POOL_EMPTY), message))
        else:
            message = f"{pool['readyReplicas']} of {pool['replicas']} rollout pods ready"
            set_condition(conditions, ConditionType.ROLLOUT_POOL_EMPTY, False, PODS_READY, message, now)
    if conditions or "conditions" in old:
        new["conditions"] = sort_conditions(conditions)
    return new, events
