"""A user who may only create RLJobs gets no hostPath pod and no foreign service account through one: the operator
refuses the RLJob naming the field and creates nothing (RBAC impersonation on the harness apiserver)."""

from __future__ import annotations

import json
import time

import pytest

from e2e.harness import Cluster
from e2e.operator.crd import apply_json
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from kuberl.operator import rbac

USER = "alice"


def as_user(cluster: Cluster, *args: str, input: str | None = None):
    return cluster.kubectl(f"--as={USER}", *args, input=input, check=False)


def wait_refused(cluster: Cluster, namespace: str, name: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.get("rljob", name, namespace).get("status") or {}
        if status.get("phase") == "Failed":
            return status
        time.sleep(0.2)
    raise AssertionError(f"RLJob {name} was not refused in {timeout} s: {status}")


@pytest.mark.parametrize(
    ("cluster_spec", "field"),
    [
        (
            {
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "volumeMounts": [{"name": "root", "mountPath": "/host"}],
            },
            "spec.cluster.volumes[0]: (root) volume type hostPath is not allowed",
        ),
        (
            {"serviceAccountName": "namespace-admin"},
            "spec.cluster.serviceAccountName: 'namespace-admin' is not allowed",
        ),
    ],
    ids=["hostPath", "foreign-service-account"],
)
def test_create_rljobs_only_user_gets_no_privileged_pod(
    cluster: Cluster, namespace: str, operator: OperatorProcess, cluster_spec: dict, field: str
) -> None:
    rules = [{"apiGroups": ["kuberl.io"], "resources": ["rljobs"], "verbs": ["create", "get"]}]
    apply_json(cluster, rbac.role("rljob-creator", namespace, rules))
    apply_json(cluster, rbac.binding("rljob-creator", namespace, "rljob-creator", {"kind": "User", "name": USER}))
    for resource in ("pods", "rayjobs.ray.io"):
        assert as_user(cluster, "auth", "can-i", "create", resource, "-n", namespace).stdout.strip() == "no"

    doc = rljob("escalate")
    doc["spec"]["cluster"].update(cluster_spec)
    created = as_user(cluster, "create", "-n", namespace, "-f", "-", input=json.dumps(doc))
    assert created.returncode == 0, created.stderr

    status = wait_refused(cluster, namespace, "escalate")
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and field in valid["message"], valid
    for kind in ("rayjobs.ray.io", "pods", "secrets", "networkpolicies"):
        names = cluster.kubectl("get", kind, "-n", namespace, "-o", "name").stdout.split()
        assert not [n for n in names if "escalate" in n], (kind, names)
