"""The rendered sandbox pool on the apiserver under Pod Security `restricted`: its pods are admitted without a
warning, and its NetworkPolicy and Service are accepted as rendered (server-side, strict field validation)."""

from __future__ import annotations

import json

from e2e.harness import Cluster
from e2e.security.test_restricted_pods import as_pod, restricted_namespace
from kuberl.api.spec import RLJobSpec
from kuberl.operator.sandbox import render_pools

UID = "0b0b0b0b-1111-2222-3333-444444444440"
SPEC = {
    "model": {"path": "/models/policy"},
    "data": {"trainFiles": ["/data/train.parquet"]},
    "batch": {"trainBatchSize": 8, "rolloutN": 2, "ppoMiniBatchSize": 8, "ppoMicroBatchSizePerGPU": 2},
    "cluster": {"trainer": {"nodes": 1, "gpusPerNode": 2}},
    "reward": {"sandbox": {"replicas": 2}},
    "rollout": {"agent": {"tools": [{"name": "calculator"}], "sandbox": {"runtimeClassName": "gvisor"}}},
}


def test_the_pools_pods_deployments_services_and_policies_are_admitted_under_restricted(
    cluster: Cluster, namespace: str
) -> None:
    restricted_namespace(cluster, namespace)
    gvisor = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "gvisor"},
        "handler": "runsc",
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(gvisor))  # a pod may name only a RuntimeClass that exists
    objects = render_pools("coder", namespace, UID, RLJobSpec.model_validate(SPEC))
    assert sorted(o["kind"] for o in objects) == ["Deployment"] * 2 + ["NetworkPolicy"] * 2 + ["Service"] * 2
    for obj in objects:
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}}
        result = cluster.kubectl(
            "create", "-n", namespace, "--validate=strict", "-f", "-", input=json.dumps(obj), check=False
        )
        assert result.returncode == 0, f"{obj['kind']} {obj['metadata']['name']}: {result.stderr}"
        assert "Warning" not in result.stderr, result.stderr  # PodSecurity warns on a workload's template
        if obj["kind"] == "Deployment":
            pod = as_pod(obj["spec"]["template"], obj["metadata"]["name"] + "-pod")
            admitted = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
            assert admitted.returncode == 0, admitted.stderr
