"""The chart's ValidatingAdmissionPolicy on the harness apiserver: the trainer's identity (its service account,
with a token bound to the Ray head pod of its RLJob) may patch only status.progress, and only of its own RLJob."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.harness import Cluster
from e2e.operator.crd import apply_json
from e2e.operator.manifests import rljob
from kuberl.api.policy import TRAINER_SERVICE_ACCOUNT
from kuberl.api.status import RLJobStatus
from kuberl.operator import rbac

CHART = Path(__file__).resolve().parents[2] / "charts" / "kuberl"
POLICY_NAME = "kuberl-rljob-status"
PROGRESS = {"progress": {"step": 3, "totalSteps": 10}}


def chart_security_objects(cluster: Cluster, *args: str) -> list[dict]:
    text = cluster.helm(
        "template", "kuberl", str(CHART), "-n", "kuberl-system", "--show-only", "templates/security.yaml", *args
    )
    return [d for d in yaml.safe_load_all(text.stdout) if d]


@pytest.fixture
def status_policy(cluster: Cluster, namespace: str) -> Iterator[None]:
    """The chart's policy and binding in its namespaced mode (bound to `namespace` only), deleted afterwards: the
    policy is cluster-scoped, and left behind it would refuse the status writes of every later test's operator."""
    objects = [
        obj
        for obj in chart_security_objects(cluster, "--set", f"watchNamespaces={{{namespace}}}")
        if obj["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    for obj in objects:
        apply_json(cluster, obj)
    yield
    for obj in reversed(objects):
        cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--wait=false", check=False)


def test_the_policy_lists_every_status_field_but_progress(cluster: Cluster) -> None:
    (policy,) = [d for d in chart_security_objects(cluster) if d["kind"] == "ValidatingAdmissionPolicy"]
    fields_rule = policy["spec"]["validations"][1]["expression"]
    wire = {f.alias or name for name, f in RLJobStatus.model_fields.items()}
    listed = {f for f in wire if f"has(object.status.{f})" in fields_rule}
    assert listed == wire - {"progress"}, "a new status field must be added to templates/security.yaml"


def patch_status(cluster: Cluster, name: str, namespace: str, body: dict, kubeconfig: Path | None = None):
    return cluster.kubectl(
        "patch",
        "rljob",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(body),
        kubeconfig=kubeconfig,
        check=False,
    )


@pytest.fixture
def trainer_kubeconfig(cluster: Cluster, namespace: str) -> Path:
    """The trainer's service account with the Role the chart gives it, and a token bound to job-a's head pod."""
    cluster.kubectl("create", "serviceaccount", TRAINER_SERVICE_ACCOUNT, "-n", namespace)
    rules = [*rbac.RAY_POD_RULES, {"apiGroups": ["kuberl.io"], "resources": ["rljobs"], "verbs": ["get"]}]
    apply_json(cluster, rbac.role("trainer", namespace, rules))
    subject = {"kind": "ServiceAccount", "name": TRAINER_SERVICE_ACCOUNT, "namespace": namespace}
    apply_json(cluster, rbac.binding("trainer", namespace, "trainer", subject))
    head = "job-a-x7k2p-head-q9z4m"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": head, "namespace": namespace},
        "spec": {"serviceAccountName": TRAINER_SERVICE_ACCOUNT, "containers": [{"name": "ray-head", "image": "x"}]},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    token = cluster.kubectl(
        "create",
        "token",
        TRAINER_SERVICE_ACCOUNT,
        "-n",
        namespace,
        "--bound-object-kind=Pod",
        f"--bound-object-name={head}",
    ).stdout.strip()
    user = f"system:serviceaccount:{namespace}:{TRAINER_SERVICE_ACCOUNT}"
    return cluster._write_kubeconfig(
        cluster.workdir / f"trainer-{namespace}.kubeconfig", user, {"token": token}, namespace
    )


def test_the_trainer_patches_only_its_own_progress(
    cluster: Cluster, namespace: str, trainer_kubeconfig: Path, rljob_crd: dict, status_policy: None
) -> None:
    for name in ("job-a", "job-b"):
        cluster.create(rljob(name), namespace=namespace)
        assert patch_status(cluster, name, namespace, {"status": {"phase": "Running"}}).returncode == 0  # as admin

    # the policy takes effect once the apiserver has loaded it: wait for the first denial
    deadline = time.monotonic() + 30
    while True:
        other = patch_status(cluster, "job-b", namespace, {"status": {"phase": "Succeeded"}}, trainer_kubeconfig)
        if other.returncode != 0 or time.monotonic() > deadline:
            break
        patch_status(cluster, "job-b", namespace, {"status": {"phase": "Running"}})  # undo, as admin
        time.sleep(0.5)
    assert other.returncode != 0 and "only the trainer of RLJob job-b" in other.stderr, other.stderr
    assert cluster.get("rljob", "job-b", namespace)["status"]["phase"] == "Running"

    other_progress = patch_status(cluster, "job-b", namespace, {"status": PROGRESS}, trainer_kubeconfig)
    assert other_progress.returncode != 0 and "ValidatingAdmissionPolicy" in other_progress.stderr

    own_phase = patch_status(cluster, "job-a", namespace, {"status": {"phase": "Succeeded"}}, trainer_kubeconfig)
    assert own_phase.returncode != 0 and "may change status.progress only" in own_phase.stderr, own_phase.stderr

    own_progress = patch_status(cluster, "job-a", namespace, {"status": PROGRESS}, trainer_kubeconfig)
    assert own_progress.returncode == 0, own_progress.stderr
    status = cluster.get("rljob", "job-a", namespace)["status"]
    assert status["progress"]["step"] == 3 and status["phase"] == "Running"
