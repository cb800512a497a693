"""The elastic rollout pool's pure builders: the RayCluster patch of a resize, the pods it names, status.rollout and
RolloutPoolEmpty, the RayJob template's size, and the metrics fed from the status."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from kuberl.api.spec import RLJobSpec
from kuberl.operator import metrics
from kuberl.operator.rayjob import guarded, rayjob_update_ops, render_rayjob
from kuberl.operator.reconcile import rollout_status_stale
from kuberl.operator.rollout_pool import (
    group_replicas,
    pods_to_remove,
    pool_status,
    resize_event,
    resize_ops,
    rollout_status,
)

NOW = "2026-01-02T03:04:05Z"


def spec(nodes: int) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "model": {"path": "tiny://llama"},
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {"trainFiles": ["/d.parquet"]},
            "batch": {"trainBatchSize": 8, "rolloutN": 4, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 4},
            "rollout": {"engine": "hf", "placement": "separate", "overlap": "async"},
            "cluster": {
                "device": "cpu",
                "trainer": {"nodes": 1, "gpusPerNode": 2},
                "rollout": {"nodes": nodes, "gpusPerNode": 1},
            },
        }
    )


def raycluster(nodes: int, workers_to_delete: list[str] | None = None) -> dict[str, Any]:
    """The RayCluster KubeRay builds from the rendered RayJob (its rayClusterSpec, as is)."""
    cluster_spec = copy.deepcopy(render_rayjob("j", "ns", "u-1", spec(nodes))["spec"]["rayClusterSpec"])
    if workers_to_delete is not None:
        cluster_spec["workerGroupSpecs"][1]["scaleStrategy"] = {"workersToDelete": workers_to_delete}
    return {"metadata": {"name": "j-abcde", "resourceVersion": "41"}, "spec": cluster_spec}


def pod(name: str, created: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = NOW
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def rollout_group(cluster_spec: dict[str, Any]) -> dict[str, Any]:
    (group,) = [g for g in cluster_spec["workerGroupSpecs"] if g["groupName"] == "rollout"]
    return group


def test_a_scale_up_sets_the_group_size_and_names_no_pod() -> None:
    current = raycluster(2)
    ops = resize_ops(current, 3, [pod("a", "t1"), pod("b", "t2")])
    patched = jsonpatch.apply_patch(current, guarded(current, ops))
    group = rollout_group(patched["spec"])
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert "scaleStrategy" not in group
    assert rollout_group(raycluster(2)["spec"]) | {"replicas": 3, "minReplicas": 3, "maxReplicas": 3} == group


def test_the_patch_is_guarded_by_the_resource_version_and_the_group_name() -> None:
    current = raycluster(2)
    ops = guarded(current, resize_ops(current, 1, [pod("a", "t1"), pod("b", "t2")]))
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert ops[1] == {"op": "test", "path": "/spec/workerGroupSpecs/1/groupName", "value": "rollout"}
    stale = copy.deepcopy(current)
    stale["metadata"]["resourceVersion"] = "42"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(stale, ops)


def test_a_scale_down_names_pods_not_ready_first_then_the_newest() -> None:
    pods = [pod("a", "t1"), pod("b", "t3"), pod("c", "t2", ready=False)]
    patched = jsonpatch.apply_patch(raycluster(3), resize_ops(raycluster(3), 1, pods))
    group = rollout_group(patched["spec"])
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 1)
    assert group["scaleStrategy"]["workersToDelete"] == ["b", "c"]


def test_a_resize_already_written_makes_no_patch() -> None:
    pods = [pod("a", "t1"), pod("b", "t2")]
    current = jsonpatch.apply_patch(raycluster(2), resize_ops(raycluster(2), 1, pods))
    assert resize_ops(current, 1, pods) == []


def test_a_named_pod_stays_named_while_it_terminates_and_is_dropped_once_gone() -> None:
    current = raycluster(1, workers_to_delete=["b"])
    assert resize_ops(current, 1, [pod("a", "t1"), pod("b", "t2", deleting=True)]) == []
    ops = resize_ops(current, 1, [pod("a", "t1")])
    assert rollout_group(jsonpatch.apply_patch(current, ops)["spec"])["scaleStrategy"]["workersToDelete"] == []


def test_a_scale_up_before_the_named_pod_went_keeps_it() -> None:
    """2 → 1 named b; back to 2 before KubeRay deleted it: nothing is named, b stays."""
    current = raycluster(1, workers_to_delete=["b"])
    ops = resize_ops(current, 2, [pod("a", "t1"), pod("b", "t2")])
    group = rollout_group(jsonpatch.apply_patch(current, ops)["spec"])
    assert group["replicas"] == 2 and group["scaleStrategy"]["workersToDelete"] == []


def test_pods_named_already_are_named_again_before_others() -> None:
    pods = [pod("a", "t1", ready=False), pod("b", "t2"), pod("c", "t3")]
    assert pods_to_remove(pods, 2, listed=["b"]) == ["b"]
    assert pods_to_remove(pods, 2, listed=[]) == ["a"]
    assert pods_to_remove(pods, 5, listed=[]) == []


def test_a_cluster_without_a_rollout_group_is_not_patched() -> None:
    colocated = {"metadata": {"name": "x"}, "spec": {"workerGroupSpecs": [{"groupName": "trainer", "replicas": 1}]}}
    assert resize_ops(colocated, 3, []) == []
    assert pool_status(colocated, []) is None
    assert group_replicas(colocated) is None


def test_the_resize_event_names_the_sizes_and_the_pods_removed() -> None:
    current = raycluster(1, workers_to_delete=["j-abcde-rollout-x"])
    event = resize_event(current, before=2)
    assert (event.type, event.reason) == ("Normal", "RolloutPoolResized")
    assert event.message == (
        "rollout pool of Ray cluster j-abcde resized from 2 to 1 pods (cluster.rollout.nodes); removing "
        "j-abcde-rollout-x"
    )


def test_pool_status_counts_ready_pods_that_are_not_terminating() -> None:
    pods = [pod("a", "t1"), pod("b", "t2", ready=False), pod("c", "t3", deleting=True)]
    assert pool_status(raycluster(3), pods) == {"replicas": 3, "readyReplicas": 1}
    assert pool_status(None, pods) is None


def test_an_empty_pool_of_a_running_job_is_flagged_once_with_a_warning() -> None:
    running = {"phase": "Running", "conditions": []}
    first, events = rollout_status(running, {"replicas": 2, "readyReplicas": 0}, 900, NOW)
    (condition,) = first["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "RolloutPoolEmpty",
        "True",
        "NoReadyRolloutPod",
    )
    assert "runPolicy.emptyRolloutPoolTimeoutSeconds = 900 s" in condition["message"]
    assert [(e.type, e.reason) for e in events] == [("Warning", "RolloutPoolEmpty")]
    again, events = rollout_status(first, {"replicas": 2, "readyReplicas": 0}, 900, "2026-01-02T03:09:05Z")
    assert events == [] and again["conditions"] == first["conditions"]
    back, events = rollout_status(again, {"replicas": 2, "readyReplicas": 1}, 900, "2026-01-02T03:10:05Z")
    (condition,) = back["conditions"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "RolloutPodsReady",
        "1 of 2 rollout pods ready",
    )
    assert condition["lastTransitionTime"] == "2026-01-02T03:10:05Z" and events == []
    assert back["rollout"] == {"replicas": 2, "readyReplicas": 1}


def test_the_condition_is_only_for_running_jobs_and_the_pool_only_while_a_cluster_exists() -> None:
    running, _ = rollout_status({"phase": "Running"}, {"replicas": 2, "readyReplicas": 0}, 900, NOW)
    suspended, events = rollout_status({**running, "phase": "Suspended"}, None, 900, NOW)
    assert "rollout" not in suspended and suspended["conditions"] == [] and events == []
    pending, _ = rollout_status({"phase": "Pending"}, {"replicas": 2, "readyReplicas": 0}, 900, NOW)
    assert pending == {"phase": "Pending", "rollout": {"replicas": 2, "readyReplicas": 0}}


def live_rayjob(nodes: int, jds: str) -> dict[str, Any]:
    rayjob = render_rayjob("j", "ns", "u-1", spec(nodes))
    rayjob["metadata"]["resourceVersion"] = "7"
    rayjob["status"] = {"jobDeploymentStatus": jds}
    return rayjob


@pytest.mark.parametrize("jds", ["Initializing", "Running", "Retrying"])
def test_the_rayjob_template_takes_the_new_size_while_a_cluster_runs_and_nothing_else(jds: str) -> None:
    running = live_rayjob(2, jds)
    desired = render_rayjob("j", "ns", "u-1", spec(3))
    desired["spec"]["rayClusterSpec"]["rayVersion"] = "9.9.9"  # any other template change waits
    patched = jsonpatch.apply_patch(running, rayjob_update_ops(running, desired, suspend_changed=False))
    assert rollout_group(patched["spec"]["rayClusterSpec"]) == rollout_group(desired["spec"]["rayClusterSpec"])
    assert patched["spec"]["rayClusterSpec"]["rayVersion"] == running["spec"]["rayClusterSpec"]["rayVersion"]
    assert patched["metadata"]["annotations"] == running["metadata"]["annotations"]


def test_an_unchanged_size_leaves_the_running_rayjob_alone() -> None:
    running = live_rayjob(2, "Running")
    assert rayjob_update_ops(running, render_rayjob("j", "ns", "u-1", spec(2)), suspend_changed=False) == []


def test_rollout_pods_metric_follows_the_status_and_forgets_deleted_jobs() -> None:
    pools = metrics.RolloutPools()
    pools.observe("u-1", "team-a", "j", {"replicas": 3, "readyReplicas": 2})
    pools.observe("u-2", "team-a", "k", None)
    samples = {tuple(s.labels.values()): s.value for family in pools.collect() for s in family.samples}
    assert samples == {("team-a", "j", "desired"): 3, ("team-a", "j", "ready"): 2}
    pools.forget("u-1")
    assert [s for family in pools.collect() for s in family.samples] == []


def test_resizes_are_counted_by_direction() -> None:
    before = metrics.REGISTRY.get_sample_value("kuberl_operator_rollout_resizes_total", {"direction": "up"}) or 0
    metrics.ROLLOUT_RESIZES.labels("up").inc()
    after = metrics.REGISTRY.get_sample_value("kuberl_operator_rollout_resizes_total", {"direction": "up"})
    assert after == before + 1


SEPARATE = {"rollout": {"placement": "separate"}}


@pytest.mark.parametrize(
    ("spec_doc", "status", "stale"),
    [
        (SEPARATE, {"phase": "Running", "rayClusterName": "c"}, True),  # never looked at while running
        (SEPARATE, {"phase": "Running", "rayClusterName": "c", "rollout": {}, "conditions": []}, True),
        (
            SEPARATE,
            {"phase": "Running", "rayClusterName": "c", "rollout": {}, "conditions": [{"type": "RolloutPoolEmpty"}]},
            False,
        ),
        (SEPARATE, {"phase": "Pending", "rayClusterName": "c", "rollout": {}}, False),
        (SEPARATE, {"phase": "Restarting", "rayClusterName": "c", "conditions": [{"type": "RolloutPoolEmpty"}]}, True),
        (SEPARATE, {"phase": "Succeeded", "rayClusterName": "c"}, False),
        (SEPARATE, {"phase": "Suspended", "rollout": {}}, True),  # the cluster is gone, its pool still shown
        ({}, {"phase": "Running", "rayClusterName": "c"}, False),  # no separate pool
    ],
)
def test_the_rljob_watch_looks_again_when_the_phase_moved_past_the_pool(
    spec_doc: dict[str, Any], status: dict[str, Any], stale: bool
) -> None:
    assert rollout_status_stale({"spec": spec_doc, "status": status}) is stale
