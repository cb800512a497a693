"""KubeRay's CRDs on a real apiserver: structural schema, pruning, strict field validation, status subresource.

These pin the semantics the operator relies on when it writes RayJobs, and that offline JSON-schema checks
cannot show (pruning instead of rejection, spec/status separation, generation bumps).
"""

from __future__ import annotations

import copy
import json

import pytest

from e2e.fixtures import missing_tool
from e2e.harness import Cluster, kuberay_crd_files

KUBERAY_CRDS = ("rayjobs.ray.io", "rayclusters.ray.io", "rayservices.ray.io", "raycronjobs.ray.io")


def rayjob(name: str = "sample") -> dict:
    """A minimal RayJob as the operator would render one: head without GPUs, one worker group."""
    pod = {
        "containers": [
            {"name": "ray", "image": "rayproject/ray:2.60.0", "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}
        ]
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -m kuberl.trainer",
            "shutdownAfterJobFinishes": True,
            "backoffLimit": 1,
            "rayClusterSpec": {
                "rayVersion": "2.60.0",
                "authOptions": {"mode": "token"},
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": copy.deepcopy(pod)}},
                "workerGroupSpecs": [
                    {
                        "groupName": "trainer",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {"spec": copy.deepcopy(pod)},
                    }
                ],
            },
        },
    }


@pytest.fixture(autouse=True)
def _kuberay_crds_present(cluster: Cluster):
    if not kuberay_crd_files():
        missing_tool(f"KubeRay CRDs not found in {cluster.tools.kuberay_crd_dir()}")
    refused = {str(p): e for p, e in cluster.crd_errors.items() if p in kuberay_crd_files()}
    assert not refused, refused


def test_every_crd_of_the_kuberay_module_is_installed(cluster: Cluster):
    """All of KubeRay's CRDs, not just the two kuberl writes: KubeRay's controller watches the others too."""
    names = {f.name for f in kuberay_crd_files()}
    assert names == {f"ray.io_{crd.split('.')[0]}.yaml" for crd in KUBERAY_CRDS}


def test_the_rayjob_crd_keeps_worker_group_labels(cluster: Cluster):
    """KubeRay >= 1.5: `workerGroupSpecs[].labels` (Ray node labels, the pool label) is in the schema, not pruned."""
    crd = cluster.get("crd", "rayjobs.ray.io")
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    cluster_spec = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rayClusterSpec"]
    assert "labels" in cluster_spec["properties"]["workerGroupSpecs"]["items"]["properties"]


def test_the_rayjob_keeps_its_token_auth_mode(cluster: Cluster, namespace: str):
    """KubeRay >= 1.5.1: `rayClusterSpec.authOptions` is in the schema, so the token mode is stored, not pruned."""
    cluster.create(rayjob("auth"), namespace=namespace, validate="strict")
    stored = cluster.get("rayjob", "auth", namespace)
    assert stored["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    doc = rayjob("typo")
    doc["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "tokens"
    result = cluster.apply(doc, namespace=namespace, dry_run="server", check=False)
    assert result.returncode != 0 and "spec.rayClusterSpec.authOptions.mode" in result.stderr


@pytest.mark.parametrize("crd", KUBERAY_CRDS)
def test_kuberay_crd_is_established(cluster: Cluster, crd: str):
    conditions = {c["type"]: c["status"] for c in cluster.get("crd", crd)["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"


def test_sample_rayjob_passes_strict_server_side_validation(cluster: Cluster, namespace: str):
    result = cluster.apply(rayjob(), namespace=namespace, dry_run="server", validate="strict")
    assert "rayjob.ray.io/sample created (server dry run)" in result.stdout


def test_unknown_rayjob_field_is_refused_under_strict_validation(cluster: Cluster, namespace: str):
    doc = rayjob()
    doc["spec"]["entrypointt"] = "typo"
    doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicaz"] = 3
    result = cluster.apply(doc, namespace=namespace, dry_run="server", validate="strict", check=False)
    assert result.returncode != 0
    assert 'unknown field "spec.entrypointt"' in result.stderr
    assert 'unknown field "spec.rayClusterSpec.workerGroupSpecs[0].replicaz"' in result.stderr


def test_unknown_rayjob_field_is_pruned_when_validation_is_off(cluster: Cluster, namespace: str):
    doc = rayjob()
    doc["spec"]["entrypointt"] = "typo"
    cluster.create(doc, namespace=namespace, validate="ignore")
    stored = cluster.get("rayjob", "sample", namespace)
    assert "entrypointt" not in stored["spec"]
    assert stored["spec"]["entrypoint"] == "python -m kuberl.trainer"


def test_wrong_type_is_refused_with_the_field_path(cluster: Cluster, namespace: str):
    doc = rayjob()
    doc["spec"]["backoffLimit"] = "two"
    result = cluster.apply(doc, namespace=namespace, dry_run="server", check=False)
    assert result.returncode != 0
    assert "spec.backoffLimit" in result.stderr


def test_schema_defaults_are_applied(cluster: Cluster, namespace: str):
    doc = rayjob()
    del doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"]
    out = cluster.create(doc, "-o", "json", namespace=namespace, dry_run="server").stdout
    group = json.loads(out)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["minReplicas"] == 0  # `default: 0` in the CRD
    assert group["numOfHosts"] == 1


def test_status_written_through_the_main_resource_is_ignored(cluster: Cluster, namespace: str):
    cluster.create(rayjob(), namespace=namespace)
    cluster.kubectl(
        "patch", "rayjob", "sample", "-n", namespace, "--type=merge", "-p", '{"status": {"jobStatus": "RUNNING"}}'
    )
    assert "jobStatus" not in cluster.get("rayjob", "sample", namespace).get("status", {})


def test_status_subresource_writes_status_without_bumping_generation(cluster: Cluster, namespace: str):
    cluster.create(rayjob(), namespace=namespace)
    before = cluster.get("rayjob", "sample", namespace)["metadata"]["generation"]
    cluster.kubectl(
        "patch",
        "rayjob",
        "sample",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running", "bogus": 1}}',
    )
    after = cluster.get("rayjob", "sample", namespace)
    assert after["status"]["jobStatus"] == "RUNNING"
    assert "bogus" not in after["status"]  # status is pruned like spec
    assert after["metadata"]["generation"] == before


def test_spec_change_bumps_generation(cluster: Cluster, namespace: str):
    cluster.create(rayjob(), namespace=namespace)
    before = cluster.get("rayjob", "sample", namespace)["metadata"]["generation"]
    cluster.kubectl("patch", "rayjob", "sample", "-n", namespace, "--type=merge", "-p", '{"spec": {"backoffLimit": 2}}')
    assert cluster.get("rayjob", "sample", namespace)["metadata"]["generation"] == before + 1


def test_managed_by_is_immutable_through_cel(cluster: Cluster, namespace: str):
    doc = rayjob()
    doc["spec"]["managedBy"] = "ray.io/kuberay-operator"
    cluster.create(doc, namespace=namespace)
    result = cluster.kubectl(
        "patch",
        "rayjob",
        "sample",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}',
        check=False,
    )
    assert result.returncode != 0
    assert "spec.managedBy" in result.stderr
    assert "the managedBy field is immutable" in result.stderr
