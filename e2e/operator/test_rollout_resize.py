"""The elastic rollout pool against KubeRay's real controller: an edit of `cluster.rollout.nodes` while the RLJob runs
reaches the running Ray cluster's rollout worker group, whose pods KubeRay creates and deletes and the stand-in kubelet
runs, without restarting anything (same RayCluster, same head pod); with every rollout pod gone the RLJob says so.

The pods' containers "run" until their pod is deleted (`RunningUntilDeleted`): the submitter never finishes, so
KubeRay keeps the RayJob Running while it polls a dashboard that is not there, as long as the test needs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness import Cluster
from e2e.kubelet import FakeNode, StandInKubelet
from e2e.kuberay import KubeRay
from e2e.operator.conftest import running_operator
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_kuberay_real import rayclusters
from e2e.operator.test_operator import Kube, grant_operator_rules, wait_until

RESIZE_TIMEOUT = 120.0  # the operator's patch, KubeRay's reconcile and the kubelet's 0.3 s tick, on 2 busy cores
SPOT = {"pool": "spot"}  # the rollout pool's node selector: its pods run only on the spot node


class RunningUntilDeleted:
    """`e2e.kubelet.Containers` whose containers run until their pod is deleted (nothing runs on this machine)."""

    def state(self, pod: dict[str, Any]) -> str | int:
        return "running"

    def forget(self, name: str) -> None:
        return None

    def exec(self, pod: dict[str, Any], command: list[str]) -> subprocess.Popen[bytes] | None:
        return None

    def terminate(self, name: str) -> None:
        return None

    def exited(self, name: str) -> bool:
        return True


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


@pytest.fixture
def kubelet(kube: client.ApiClient, namespace: str) -> Iterator[StandInKubelet]:
    """A node for the head, the trainer pod and the submitter, and a spot node for the rollout pool."""
    suffix = namespace[-6:]
    nodes = [FakeNode(f"big-{suffix}", cpu="32", memory="128Gi"), FakeNode(f"spot-{suffix}", cpu="8", labels=SPOT)]
    running = StandInKubelet(kube, namespace, nodes, containers=RunningUntilDeleted()).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def limited_operator(cluster: Cluster, rljob_crd: dict, k: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as `limited`, with exactly rbac.OPERATOR_RULES in the test's namespace."""
    grant_operator_rules(cluster, k.ns)
    args = ("--resync-seconds", "5", "--diagnose-seconds", "1")
    with running_operator(cluster, k.ns, tmp_path, *args, kubeconfig=cluster.limited_kubeconfig) as proc:
        yield proc


def elastic_rljob(name: str, nodes: int) -> dict[str, Any]:
    pool = {"nodes": nodes, "gpusPerNode": 1, "cpu": "1", "memory": "1Gi", "sharedMemory": "256Mi"}
    doc = rljob(name, **{"rollout.placement": "separate", "rollout.overlap": "async", "cluster.rollout": pool})
    doc["spec"]["cluster"]["rollout"]["nodeSelector"] = SPOT
    return doc


def rollout_pods(k: Kube, raycluster: str) -> list[client.V1Pod]:
    """The rollout group's pods that are not being deleted."""
    selector = f"ray.io/cluster={raycluster},ray.io/group=rollout"
    pods = k.core.list_namespaced_pod(k.ns, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def head_pod(k: Kube, raycluster: str) -> client.V1Pod:
    (head,) = k.core.list_namespaced_pod(
        k.ns, label_selector=f"ray.io/cluster={raycluster},ray.io/node-type=head"
    ).items
    return head


def rollout_group(obj: dict[str, Any]) -> dict[str, Any]:
    (group,) = [g for g in obj["workerGroupSpecs"] if g["groupName"] == "rollout"]
    return group


def resize(k: Kube, name: str, nodes: int) -> None:
    k.patch_rljob(name, {"spec": {"cluster": {"rollout": {"nodes": nodes}}}})


def wait_pool(k: Kube, name: str, raycluster: str, nodes: int) -> dict[str, Any]:
    """The RayCluster's rollout group asks for `nodes` pods, `nodes` of them run and the RLJob's status says so."""

    seen: dict[str, Any] = {}

    def followed() -> dict[str, Any] | None:
        (current,) = rayclusters(k, name)
        group = rollout_group(current["spec"])
        sizes = {group["replicas"], group["minReplicas"], group["maxReplicas"]}
        pods = rollout_pods(k, raycluster)
        ready = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        status = k.rljob(name).get("status") or {}
        seen.update(
            group_sizes=sorted(sizes),
            pods={p.metadata.name: (p.spec.node_name, p.status.phase) for p in pods},
            ready=len(ready),
            status_rollout=status.get("rollout"),
        )
        if sizes == {nodes} and len(pods) == len(ready) == nodes:
            return current if status.get("rollout") == {"replicas": nodes, "readyReplicas": nodes} else None
        return None

    try:
        return wait_until(f"the rollout pool of {name} at {nodes} pods", followed, timeout=RESIZE_TIMEOUT, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; seen: {seen}") from None


def wait_pool_empty(k: Kube, name: str, status: str) -> dict[str, Any]:
    """The RLJob's condition RolloutPoolEmpty, once its status is `status`."""

    def reached() -> dict[str, Any] | None:
        conditions = (k.rljob(name).get("status") or {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "RolloutPoolEmpty"), None)
        return found if found is not None and found["status"] == status else None

    return wait_until(f"RolloutPoolEmpty={status} on {name}", reached, timeout=RESIZE_TIMEOUT, interval=0.5)


def test_resizing_the_rollout_pool_of_a_running_job_follows_without_a_restart(
    limited_operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    """2 → 1 → 3 pods, the operator holding only the documented RBAC (rbac.OPERATOR_RULES)."""
    k.create_rljob(elastic_rljob("elastic", nodes=2))
    running = k.wait_phase("elastic", "Running", timeout=RESIZE_TIMEOUT)
    name = running["status"]["rayClusterName"]
    started = wait_pool(k, "elastic", name, 2)
    head = head_pod(k, name)
    wait_pool_empty(k, "elastic", "False")

    resize(k, "elastic", 1)
    wait_pool(k, "elastic", name, 1)
    resize(k, "elastic", 3)
    resized = wait_pool(k, "elastic", name, 3)

    assert resized["metadata"]["uid"] == started["metadata"]["uid"], "the Ray cluster was rebuilt"
    assert head_pod(k, name).metadata.uid == head.metadata.uid, "the head pod was replaced"
    after = k.rljob("elastic")
    assert (after["status"]["phase"], after["status"].get("restarts", 0)) == ("Running", 0)
    wait_until(  # the RayJob's template too: a retry's Ray cluster starts with 3 rollout pods
        "the RayJob's rollout group at 3",
        lambda: rollout_group(k.rayjob("elastic")["spec"]["rayClusterSpec"])["replicas"] == 3,
    )
    events = [e.message for e in k.wait_events("elastic", ["RolloutPoolResized"]) if e.reason == "RolloutPoolResized"]
    assert any(f"{name} resized from 2 to 1 pods" in m and "; removing " in m for m in events), events
    assert any(f"{name} resized from 1 to 3 pods" in m for m in events), events
    logs = limited_operator.logs()
    assert "Traceback" not in logs and "forbidden" not in logs.lower(), logs[-5000:]


def test_a_rollout_pool_with_no_pod_left_is_flagged_until_one_is_back(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    """The spot node goes away and its pods are deleted (a preemption): the RLJob keeps running, flagged."""
    k.create_rljob(elastic_rljob("spot", nodes=2))
    name = k.wait_phase("spot", "Running", timeout=RESIZE_TIMEOUT)["status"]["rayClusterName"]
    wait_pool(k, "spot", name, 2)
    (spot,) = [n for n in kubelet.nodes if n.labels == SPOT]
    kubelet.nodes.remove(spot)
    k.core.delete_node(spot.name)
    for pod in rollout_pods(k, name):
        k.core.delete_namespaced_pod(pod.metadata.name, k.ns)

    empty = wait_pool_empty(k, "spot", "True")
    assert empty["reason"] == "NoReadyRolloutPod"
    assert "runPolicy.emptyRolloutPoolTimeoutSeconds = 900 s" in empty["message"]
    assert k.rljob("spot")["status"]["rollout"] == {"replicas": 2, "readyReplicas": 0}
    k.wait_events("spot", ["RolloutPoolEmpty"])
    kubelet.add_node(spot)
    wait_pool(k, "spot", name, 2)
    assert wait_pool_empty(k, "spot", "False")["reason"] == "RolloutPodsReady"
    assert k.rljob("spot")["status"]["phase"] == "Running"
