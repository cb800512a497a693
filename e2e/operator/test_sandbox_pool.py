"""The operator (a real process) renders an RLJob's sandbox pool on the harness's apiserver: a Deployment, a
Service and a NetworkPolicy owned by the RLJob, readiness in the status, no pods while suspended or finished, and
garbage-collected with the RLJob. The harness runs no Deployment controller: the test writes the Deployment's
status as that controller would."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness import Cluster
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, condition, wait_until
from kuberl.api.spec import RLJobSpec
from kuberl.operator.sandbox import render_pools

SANDBOX = {"replicas": 2, "executionsPerPod": 1, "cpuPerExecution": "500m", "execution": {"wallSeconds": 5}}


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def deployment(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    apps = client.AppsV1Api(kube)
    try:
        return kube.sanitize_for_serialization(apps.read_namespaced_deployment(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pool_status(k: Kube, name: str) -> list[dict[str, Any]] | None:
    return (k.rljob(name).get("status") or {}).get("sandboxes")


def test_the_operator_creates_the_pool_and_reports_its_readiness(
    operator: OperatorProcess, k: Kube, kube: client.ApiClient
) -> None:
    created = k.create_rljob(rljob("coder", **{"reward.sandbox": SANDBOX}))
    uid = created["metadata"]["uid"]
    stored = wait_until("Deployment", lambda: deployment(kube, k.ns, "coder-sandbox-reward"))
    expected = {o["kind"]: o for o in render_pools("coder", k.ns, uid, RLJobSpec.model_validate(created["spec"]))}
    assert (
        stored["spec"]["template"]["spec"]["containers"][0]["command"]
        == (expected["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"])
    )
    assert [r["uid"] for r in stored["metadata"]["ownerReferences"]] == [uid]
    service = k.core.read_namespaced_service("coder-sandbox-reward", k.ns)
    assert service.spec.selector == expected["Service"]["spec"]["selector"]
    policy = client.NetworkingV1Api(kube).read_namespaced_network_policy("coder-sandbox-reward", k.ns)
    assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.egress

    waiting = wait_until("status.sandboxes", lambda: pool_status(k, "coder"))
    assert waiting == [{"pool": "reward", "replicas": 2, "readyReplicas": 0}]
    assert condition(k.rljob("coder"), "SandboxReady")["reason"] == "PodsNotReady"

    client.AppsV1Api(kube).patch_namespaced_deployment_status(
        "coder-sandbox-reward", k.ns, {"status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2}}
    )
    wait_until("SandboxReady", lambda: condition(k.rljob("coder"), "SandboxReady")["status"] == "True")
    assert pool_status(k, "coder") == [{"pool": "reward", "replicas": 2, "readyReplicas": 2}]


def test_a_suspended_or_finished_job_keeps_no_sandbox_pods(
    operator: OperatorProcess, k: Kube, kube: client.ApiClient, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("pausing", **{"reward.sandbox": SANDBOX}))
    sim.wait_for(k.ns, "pausing")

    def replicas() -> int | None:
        return (deployment(kube, k.ns, "pausing-sandbox-reward") or {}).get("spec", {}).get("replicas")

    wait_until("two replicas", lambda: replicas() == 2)
    k.patch_rljob("pausing", {"spec": {"runPolicy": {"suspend": True}}})
    wait_until("no replicas while suspended", lambda: replicas() == 0)
    k.patch_rljob("pausing", {"spec": {"runPolicy": {"suspend": False}}})
    wait_until("replicas back on resume", lambda: replicas() == 2)

    sim.initializing(k.ns, "pausing")
    sim.running(k.ns, "pausing")
    sim.complete(k.ns, "pausing")
    k.wait_phase("pausing", "Succeeded")
    wait_until("no replicas once finished", lambda: replicas() == 0)
    wait_until(
        "status follows", lambda: pool_status(k, "pausing") == [{"pool": "reward", "replicas": 0, "readyReplicas": 0}]
    )


def test_deleting_the_rljob_collects_its_pool(
    cluster: Cluster, operator: OperatorProcess, k: Kube, kube: client.ApiClient
) -> None:
    k.create_rljob(rljob("done", **{"reward.sandbox": SANDBOX}))
    wait_until("Deployment", lambda: deployment(kube, k.ns, "done-sandbox-reward"))
    k.custom.delete_namespaced_custom_object("kuberl.io", "v1alpha1", k.ns, "rljobs", "done")
    if not cluster.controller_manager:
        pytest.skip("no kube-controller-manager: ownerReferences checked, GC not observable")
    wait_until("Deployment collected", lambda: deployment(kube, k.ns, "done-sandbox-reward") is None, timeout=120)

    def gone(read: Any) -> bool:
        try:
            read("done-sandbox-reward", k.ns)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_until("Service collected", lambda: gone(k.core.read_namespaced_service), timeout=120)
    policies = client.NetworkingV1Api(kube)
    wait_until("NetworkPolicy collected", lambda: gone(policies.read_namespaced_network_policy), timeout=120)
