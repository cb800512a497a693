"""The harness's start order: kube-controller-manager comes up after the CRDs, so its garbage collector and its Job
controller work on custom resources and Jobs from the first second."""

from __future__ import annotations

import time

from e2e.fixtures import require_tools
from e2e.harness import REPO_ROOT, Cluster, Tools, rljob_crd_file

GC_DEADLINE_S = 8.0  # the GC's own resync is 30 s: a collector that missed the CRD would take that long or more


def test_a_child_of_an_rljob_deleted_right_after_start_is_gone_within_seconds(kube_tools: Tools) -> None:
    require_tools(kube_tools, ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"])
    assert rljob_crd_file().is_file()
    with Cluster(tools=kube_tools, kuberay_crds=False) as cluster:
        cluster.kubectl("create", "namespace", "gc")
        cluster.create(REPO_ROOT / "examples" / "tiny-cpu.yaml", namespace="gc")
        owner = cluster.get("rljob", "tiny-cpu", "gc")["metadata"]
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "name": "tiny-cpu", "uid": owner["uid"]}
                ],
            },
        }
        cluster.create(child, namespace="gc")
        cluster.kubectl("delete", "rljob", "tiny-cpu", "-n", "gc", "--wait=true")
        t0 = time.monotonic()
        while cluster.kubectl("get", "configmap", "child", "-n", "gc", check=False).returncode == 0:
            elapsed = time.monotonic() - t0
            assert elapsed < GC_DEADLINE_S, f"the RLJob's ConfigMap outlived it by {elapsed:.1f} s"
            time.sleep(0.2)


def test_the_job_controller_runs(cluster: Cluster, namespace: str) -> None:
    """KubeRay's submitter is a Job: without the Job controller it never gets a pod."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "submitter"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                }
            },
        },
    }
    cluster.create(job, namespace=namespace)
    deadline = time.monotonic() + 15
    while not cluster.kubectl("get", "pods", "-n", namespace, "-l", "job-name=submitter", "-o", "name").stdout:
        assert time.monotonic() < deadline, "the Job controller created no pod for a Job"
        time.sleep(0.2)
