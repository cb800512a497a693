"""One verdict: the same hostile RLJobs go to `kuberl validate` and to the real apiserver + operator, and both
refuse (or admit) each, naming the same fields with the same messages, under the chart's defaults and under a
values file that allows more. The operator runs with the flags `helm template` renders from those values;
`kuberl validate` gets the values file (`--policy`) or reads the rendered Deployment from the apiserver
(`--cluster`)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import REPO_ROOT, Cluster
from e2e.operator.conftest import running_operator
from e2e.operator.manifests import rljob
from e2e.operator.process import PYTHONPATH

CHART = REPO_ROOT / "charts" / "kuberl"
POLICY_FLAGS = ("--trainer-service-account", "--allow-", "--pod-", "--kuberay-namespace", "--monitoring-namespace")

PERMISSIVE = {
    "security": {
        "allowedVolumeTypes": ["hostPath"],
        "allowedServiceAccounts": ["namespace-admin"],
        "allowHostNetwork": True,
    }
}


def hostile_rljobs(suffix: str) -> list[dict[str, Any]]:
    """The audit's RLJobs (hostPath /, the containerd socket, a foreign service account) and the operator's other
    refusals, with one harmless job; `suffix` keeps names apart between policies."""
    scratch = {"name": "scratch", "emptyDir": {}}
    terms = [{"matchExpressions": [{"key": "h", "operator": "In", "values": [f"node-{i}"]}]} for i in range(1500)]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    docs = {
        "escalate": rljob(
            "escalate",
            **{
                "cluster.serviceAccountName": "namespace-admin",
                "cluster.volumes": [
                    {"name": "root", "hostPath": {"path": "/"}},
                    {"name": "cri", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}},
                ],
                "cluster.volumeMounts": [
                    {"name": "root", "mountPath": "/host"},
                    {"name": "cri", "mountPath": "/run/containerd/containerd.sock"},
                ],
            },
        ),
        "hostnet": rljob("hostnet", **{"cluster.trainer.pod": {"hostNetwork": True}}),
        "scratch": rljob(
            "scratch",
            **{
                "storage": {},
                "trainer.checkpointDir": "/scratch/ckpt",
                "cluster.volumes": [scratch],
                "cluster.volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            },
        ),
        "reserved": rljob("reserved", **{"cluster.volumes": [{"name": "kuberl-spec", "emptyDir": {}}]}),
        "literal": rljob("literal", **{"cluster.env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "hunter2"}]}),
        "vast": rljob("vast", **{"cluster.trainer.affinity": affinity}),
        "harmless": rljob("harmless"),
    }
    for name, doc in docs.items():
        doc["metadata"]["name"] = f"{name}-{suffix}"
    return list(docs.values())


def rendered_deployment(cluster: Cluster, namespace: str, values: Path) -> dict[str, Any]:
    text = cluster.helm(
        "template", "kuberl", str(CHART), "-n", namespace, "-f", str(values), "--show-only",
        "templates/deployment.yaml",
    ).stdout  # fmt: skip
    (deployment,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    return dict(deployment)


def operator_policy_flags(deployment: dict[str, Any]) -> tuple[str, ...]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    return tuple(arg for arg in container["args"] if arg.startswith(POLICY_FLAGS))


def validate(cluster: Cluster, tmp_path: Path, docs: list[dict[str, Any]], *policy: str) -> dict[str, Any]:
    """`kuberl validate -o json` as a user runs it; by RLJob name."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [sys.executable, "-m", "kuberl.cli", "validate", "-o", "json", *policy, str(jobs)],
        capture_output=True,
        text=True,
        env={**cluster.env, "PYTHONPATH": PYTHONPATH},
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    return {r["name"]: r for r in json.loads(result.stdout)}


def cluster_verdict(cluster: Cluster, namespace: str, doc: dict[str, Any], timeout: float = 60) -> tuple[bool, str]:
    """(admitted, the refusal's text): the apiserver's answer to the create, else the operator's Valid condition
    once it has decided (Valid=False, or a RayJob created)."""
    created = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
    if created.returncode != 0:
        return False, created.stderr
    name = doc["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.get("rljob", name, namespace).get("status") or {}
        valid = next((c for c in status.get("conditions") or [] if c["type"] == "Valid"), None)
        if valid is not None:
            return valid["status"] == "True", valid["message"]
        time.sleep(0.2)
    raise AssertionError(f"the operator decided nothing on {name} in {timeout} s")


def assert_one_verdict(offline: dict[str, Any], admitted: bool, text: str) -> None:
    assert offline["valid"] is admitted, (offline, text)
    for issue in offline["issues"]:
        assert issue["message"] in text, (issue, text)
        if issue["rule"] != "schema":
            assert issue["field"].removeprefix("spec.") in text, (issue, text)


@pytest.mark.parametrize("permissive", [False, True], ids=["chart-defaults", "permissive-values"])
def test_validate_and_the_cluster_give_one_verdict(
    cluster: Cluster, namespace: str, rljob_crd: dict, tmp_path: Path, permissive: bool
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(PERMISSIVE if permissive else {}))
    deployment = rendered_deployment(cluster, namespace, values)
    docs = hostile_rljobs("p" if permissive else "d")
    by_file = validate(cluster, tmp_path, docs, "--policy", str(values))
    cluster.apply(copy.deepcopy(deployment), namespace=namespace)  # never runs here (no kubelet): read by --cluster
    by_cluster = validate(cluster, tmp_path, docs, "--cluster", "--operator-namespace", namespace)
    assert by_cluster == by_file
    refused = {name for name, result in by_file.items() if not result["valid"]}
    expected = {"escalate", "hostnet", "scratch", "reserved", "literal", "vast"} - (
        {"escalate", "hostnet"} if permissive else set()
    )
    assert {name.rsplit("-", 1)[0] for name in refused} == expected

    with running_operator(cluster, namespace, tmp_path, *operator_policy_flags(deployment)):
        for doc in docs:
            admitted, text = cluster_verdict(cluster, namespace, doc)
            assert_one_verdict(by_file[doc["metadata"]["name"]], admitted, text)
