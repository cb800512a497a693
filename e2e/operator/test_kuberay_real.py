"""The operator with KubeRay's real controller (not the simulator), which runs with its own ClusterRole.

Without a scheduler and a kubelet pods stay Pending: those tests cover what KubeRay does before a pod runs
(RayCluster, Service, pod creation, refusals, its finalizer on deletion). With the stand-in kubelet
(`e2e/kubelet.py`) pods are scheduled, run, or fail to, and the RLJob says why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness import Cluster
from e2e.kubelet import FakeNode, StandInKubelet
from e2e.kuberay import KubeRay
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import GROUP, PLURAL, VERSION, Kube, wait_until
from kuberl.operator import rbac

DIAGNOSIS_TIMEOUT = 30.0  # KubeRay's retry back-off plus the operator's 1 s diagnosis period, on 2 busy cores


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def cluster_ready(k: Kube, name: str) -> dict[str, Any] | None:
    conditions = (k.rljob(name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ClusterReady"), None)


def ray_pods(k: Kube, raycluster: str) -> list[Any]:
    return k.core.list_namespaced_pod(k.ns, label_selector=f"ray.io/cluster={raycluster}").items


def rayclusters(k: Kube, rljob_name: str) -> list[dict[str, Any]]:
    selector = f"ray.io/originated-from-cr-name={rljob_name}"
    return k.custom.list_namespaced_custom_object("ray.io", "v1", k.ns, "rayclusters", label_selector=selector)["items"]


def wait_blocked(k: Kube, name: str, reason: str) -> dict[str, Any]:
    return wait_until(
        f"ClusterReady=False/{reason} on {name}",
        lambda: (c := cluster_ready(k, name)) and c["status"] == "False" and c["reason"] == reason and c,
        timeout=DIAGNOSIS_TIMEOUT,
    )


def test_kuberay_makes_the_ray_cluster_of_an_rljob_with_its_own_rbac(
    operator: OperatorProcess, kuberay: KubeRay, k: Kube
) -> None:
    k.create_rljob(rljob("real"))
    rayjob = wait_until("RayJob", lambda: k.rayjob("real"))
    (raycluster,) = wait_until("RayCluster", lambda: rayclusters(k, "real"))
    assert raycluster["metadata"]["ownerReferences"][0]["uid"] == rayjob["metadata"]["uid"]
    name = raycluster["metadata"]["name"]
    pods = wait_until("head and worker pods", lambda: len(ray_pods(k, name)) >= 2 and ray_pods(k, name))
    roles = sorted(p.metadata.labels["ray.io/node-type"] for p in pods)
    assert roles == ["head", "worker"]
    worker = next(p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker")
    assert worker.metadata.labels["ray.io/group"] == "trainer"
    wait_until("the RLJob names its Ray cluster", lambda: (k.rljob("real").get("status") or {}).get("rayClusterName"))
    assert "forbidden" not in kuberay.log_tail(400).lower()
    assert cluster_ready(k, "real") is None  # nothing blocks it: no condition, no status write


def test_a_missing_priority_class_is_pod_forbidden_until_it_exists(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube
) -> None:
    priority = f"batch-high-{uuid.uuid4().hex[:6]}"
    k.create_rljob(rljob("prio", **{"cluster.priorityClassName": priority}))
    blocked = wait_blocked(k, "prio", "PodForbidden")
    assert f"no PriorityClass with name {priority} was found" in blocked["message"]
    assert "PodForbidden" in cluster.kubectl("get", "rljobs", "-n", k.ns).stdout
    k.wait_events("prio", ["PodForbidden"], timeout=10)
    cluster.apply(
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority}, "value": 1000}
    )
    try:
        wait_until(
            "ClusterReady no longer False",
            lambda: (c := cluster_ready(k, "prio")) and c["status"] != "False",
            timeout=DIAGNOSIS_TIMEOUT,
        )
    finally:
        cluster.kubectl("delete", "priorityclass", priority, "--wait=false", check=False)
    assert len([e for e in k.events("prio") if e.reason == "PodForbidden"]) == 1


def test_an_exceeded_quota_is_quota_exceeded_until_it_is_lifted(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube
) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "0"}}}
    cluster.apply(quota, namespace=k.ns)
    wait_until(
        "quota status",
        lambda: k.core.read_namespaced_resource_quota("pods", k.ns).status.hard,
        timeout=DIAGNOSIS_TIMEOUT,
    )
    k.create_rljob(rljob("quota"))
    blocked = wait_blocked(k, "quota", "QuotaExceeded")
    assert "exceeded quota: pods, requested: pods=1, used: pods=0, limited: pods=0" in blocked["message"]
    k.core.delete_namespaced_resource_quota("pods", k.ns)
    wait_until(
        "ClusterReady no longer False",
        lambda: (c := cluster_ready(k, "quota")) and c["status"] != "False",
        timeout=DIAGNOSIS_TIMEOUT,
    )


@pytest.fixture
def kubelet(kube: client.ApiClient, namespace: str) -> Iterator[StandInKubelet]:
    """One small CPU node (1 core): the tests' Ray pods (2 cores each) do not fit until a test adds a node."""
    suffix = namespace[-6:]
    running = StandInKubelet(kube, namespace, [FakeNode(f"small-{suffix}", cpu="1")]).start()
    try:
        yield running
    finally:
        running.stop()


def big_node(k: Kube) -> FakeNode:
    return FakeNode(f"big-{k.ns[-6:]}", cpu="32", memory="128Gi")


def wait_unblocked(k: Kube, name: str) -> dict[str, Any]:
    return wait_until(
        f"ClusterReady of {name} no longer False",
        lambda: (c := cluster_ready(k, name)) and c["status"] != "False" and c,
        timeout=DIAGNOSIS_TIMEOUT,
    )


def test_unschedulable_pods_quote_the_scheduler_until_a_node_fits(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    k.create_rljob(rljob("nofit"))
    blocked = wait_blocked(k, "nofit", "Unschedulable")
    assert "0/1 nodes are available: 1 Insufficient cpu." in blocked["message"]
    kubelet.add_node(big_node(k))
    ready = wait_until(
        "ClusterReady=True", lambda: (c := cluster_ready(k, "nofit")) and c["status"] == "True" and c, timeout=30
    )
    assert ready["reason"] == "RayClusterReady"


def test_a_gpu_request_no_node_has_is_unschedulable(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    kubelet.add_node(big_node(k))
    k.create_rljob(rljob("gpus", **{"cluster.device": "cuda"}))
    blocked = wait_blocked(k, "gpus", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in blocked["message"]


def test_an_image_that_cannot_be_pulled_is_image_pull_back_off_until_it_can(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    image = "registry.example/kuberl/trainer:missing"
    kubelet.add_node(big_node(k))
    kubelet.pull_failures.add(image)
    k.create_rljob(rljob("pull", **{"cluster.image": image}))
    blocked = wait_blocked(k, "pull", "ImagePullBackOff")
    assert f'Back-off pulling image "{image}"' in blocked["message"]
    kubelet.pull_failures.discard(image)
    wait_unblocked(k, "pull")


def test_a_crashing_container_is_crash_loop_back_off(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    image = "registry.example/kuberl/trainer:crashes"
    kubelet.add_node(big_node(k))
    kubelet.crash_images.add(image)
    k.create_rljob(rljob("crash", **{"cluster.image": image}))
    blocked = wait_blocked(k, "crash", "CrashLoopBackOff")
    assert "back-off 10s restarting failed container" in blocked["message"]
    assert "last exit: exit code 1 (Error)" in blocked["message"]


def test_deleting_the_rljob_collects_rayjob_raycluster_submitter_pods_and_configmap(
    operator: OperatorProcess, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube
) -> None:
    """KubeRay finalizes RayJobs: with KubeRay running, deletion completes and leaves nothing, running pods included."""
    kubelet.add_node(big_node(k))
    k.create_rljob(rljob("gone"))
    wait_until("RayCluster", lambda: rayclusters(k, "gone"))
    batch = client.BatchV1Api(k.core.api_client)
    wait_until("the submitter Job, once the Ray cluster is ready", lambda: batch.list_namespaced_job(k.ns).items)
    wait_until(
        "its pod, completed",
        lambda: [p for p in k.core.list_namespaced_pod(k.ns).items if p.status.phase == "Succeeded"],
    )
    assert k.rayjob("gone")["metadata"].get("finalizers"), "KubeRay finalizes RayJobs"
    k.custom.delete_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, "gone")

    def configmap_gone() -> bool:
        try:
            k.configmap("gone-spec")
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_until("RayJob collected", lambda: not k.rayjobs("kuberl.io/rljob=gone"), timeout=30)
    wait_until("RayCluster collected", lambda: not rayclusters(k, "gone"), timeout=30)
    wait_until("submitter Job collected", lambda: not batch.list_namespaced_job(k.ns).items, timeout=30)
    wait_until("every pod collected", lambda: not k.core.list_namespaced_pod(k.ns).items, timeout=30)
    wait_until("ConfigMap collected", configmap_gone, timeout=30)


def test_the_diagnosis_needs_only_the_documented_rbac(
    cluster: Cluster, kuberay: KubeRay, kubelet: StandInKubelet, k: Kube, tmp_path
) -> None:
    """The operator as `limited` with only rbac.OPERATOR_RULES: it reads pods and Events, writes the condition."""
    cluster.apply(
        [
            rbac.role("kuberl-operator", k.ns, rbac.OPERATOR_RULES),
            rbac.binding(
                "kuberl-operator",
                k.ns,
                "kuberl-operator",
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "limited"},
            ),
        ]
    )
    proc = OperatorProcess(
        kubeconfig=cluster.limited_kubeconfig,
        log_dir=tmp_path / "op",
        namespaces=(k.ns,),
        extra_args=("--diagnose-seconds", "1"),
    )
    proc.start()
    try:
        k.create_rljob(rljob("least"))
        blocked = wait_blocked(k, "least", "Unschedulable")
        assert "0/1 nodes are available: 1 Insufficient cpu." in blocked["message"]
        k.wait_events("least", ["Unschedulable"], timeout=10)
        assert "forbidden" not in proc.logs().lower(), proc.logs()[-5000:]
    finally:
        proc.stop()
        print(proc.logs()[-20000:])
