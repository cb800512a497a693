"""Faults of issue 38 against a real kube-apiserver and a real operator process (KubeRay played by `KubeRaySim`):
a RayJob deleted while the operator is down, a resync pass meeting an RLJob whose status write is refused, a
290 KiB affinity, and RLJobs that would share a checkpoint folder."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness import Cluster
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import GROUP, PLURAL, VERSION, Kube, condition, grant_operator_rules, wait_until
from kuberl.api.contract import CHECKPOINT_MOUNT, SPEC_FILE

KOPF_DIFFBASE = "kuberl.io/last-handled-configuration"
ANNOTATION_LIMIT = 262144  # bytes of all annotations of an object (apimachinery's TotalAnnotationSizeLimitB)


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def spec_json_of(k: Kube, name: str) -> dict[str, Any]:
    """The spec the RLJob's pods read, from its ConfigMap."""
    data: dict[str, Any] = json.loads(k.configmap(f"{name}-spec").data[SPEC_FILE])
    return data


def rayjob_exists(k: Kube, name: str) -> bool:
    return bool(k.rayjobs(f"kuberl.io/rljob={name}"))


# --- a RayJob deleted while the operator is down ------------------------------------------------------------


def test_a_rayjob_deleted_while_the_operator_is_down_fails_the_rljob_instead_of_a_new_run(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    created = k.create_rljob(rljob("away"))
    sim.wait_for(k.ns, "away")
    sim.running(k.ns, "away")
    k.wait_phase("away", "Running")
    operator.stop()
    k.custom.delete_namespaced_custom_object("ray.io", "v1", k.ns, "rayjobs", "away")
    wait_until("RayJob gone", lambda: not rayjob_exists(k, "away"))
    operator.start()
    failed = k.wait_phase("away", "Failed")
    assert condition(failed, "Failed")["reason"] == "RayJobDeleted"
    assert failed["metadata"]["uid"] == created["metadata"]["uid"]
    time.sleep(7)  # a resync period (5 s) and the resume handler's retries: still no new RayJob
    assert not rayjob_exists(k, "away")
    assert k.phase("away") == "Failed"


# --- the resync continues past an RLJob it cannot write -----------------------------------------------------


@contextmanager
def status_writes_refused(cluster: Cluster, namespace: str, rljob_name: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy refusing the `limited` user's status writes to one RLJob of `namespace` (the
    fault: a write the apiserver refuses for that RLJob only), in force when this enters; removed on exit."""
    name = f"deny-{rljob_name}-{namespace[-6:]}"  # the namespace ends in a random suffix
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["UPDATE"],
                        "resources": ["rljobs/status"],
                    }
                ]
            },
            "matchConditions": [{"name": "operator", "expression": "request.userInfo.username == 'limited'"}],
            "validations": [
                {"expression": f"object.metadata.name != '{rljob_name}'", "message": "refused for the test"}
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    cluster.apply([policy, binding])
    probe = ["patch", "rljob", rljob_name, "-n", namespace, "--subresource=status", "--type=merge"]

    def enforced() -> bool:
        result = cluster.kubectl(
            *probe, "-p", '{"status": {"message": "probe"}}', kubeconfig=cluster.limited_kubeconfig, check=False
        )
        return "refused for the test" in result.stderr

    try:
        wait_until("the policy in force", enforced)
        yield
    finally:
        for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
            cluster.kubectl("delete", kind, name, "--wait=false", check=False)


def test_the_resync_restores_the_next_rljob_when_one_status_write_is_refused(
    cluster: Cluster, namespace: str, k: Kube, sim: KubeRaySim, tmp_path: Path
) -> None:
    grant_operator_rules(cluster, namespace)
    proc = OperatorProcess(
        kubeconfig=cluster.limited_kubeconfig,
        log_dir=tmp_path / "op",
        namespaces=(namespace,),
        extra_args=("--resync-seconds", "2"),
    )
    poison, healthy = "a-poison", "b-drift"  # the RLJobs are listed by name: the refused one comes first
    proc.start()
    try:
        for name in (poison, healthy):
            k.create_rljob(rljob(name))
            sim.wait_for(k.ns, name)
            sim.running(k.ns, name)
            k.wait_phase(name, "Running")
        with status_writes_refused(cluster, namespace, poison):
            # a status nobody's watch event explains: only the resync restores it
            for name in (poison, healthy):
                k.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, k.ns, PLURAL, name, {"status": {"phase": "Suspended"}},
                    _content_type="application/merge-patch+json",
                )  # fmt: skip
            k.wait_phase(healthy, "Running", timeout=30)
            assert k.phase(poison) == "Suspended"  # its write is refused, every pass
            wait_until(
                "the refused write logged", lambda: f"resync of RLJob {namespace}/{poison} failed" in proc.logs()
            )
    finally:
        proc.stop()
        print(proc.logs()[-20000:])


# --- bounded input: a 290 KiB affinity ----------------------------------------------------------------------


def huge_affinity(kib: int = 290) -> dict[str, Any]:
    expression = {"key": "kubernetes.io/hostname", "operator": "In"}
    terms = [{"matchExpressions": [{**expression, "values": [f"gpu-node-{i:05d}"]}]} for i in range(kib * 12)]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    assert len(json.dumps(affinity)) > kib * 1024
    return affinity


def test_a_290_kib_affinity_is_refused_once_naming_the_field_without_a_handler_loop(
    operator: OperatorProcess, k: Kube
) -> None:
    doc = rljob("vast")
    doc["spec"]["cluster"]["trainer"]["affinity"] = huge_affinity()
    k.create_rljob(doc)  # the apiserver admits it: the affinity is free-form
    failed = k.wait_phase("vast", "Failed")
    message = condition(failed, "Valid")["message"]
    assert "free-form fields" in message and "spec.cluster.trainer.affinity" in message, message
    # kopf stored its bookkeeping: the handler is done, not retried forever on a 422
    annotations = wait_until(
        "kopf's diffbase", lambda: (a := k.rljob("vast")["metadata"].get("annotations") or {}).get(KOPF_DIFFBASE) and a
    )
    assert sum(len(key) + len(value) for key, value in annotations.items()) < ANNOTATION_LIMIT // 8
    time.sleep(5)
    logs = operator.logs()
    assert "422" not in logs and "Unprocessable" not in logs, logs[-5000:]
    assert logs.count("spec.cluster.trainer.affinity") <= 2, logs[-5000:]  # refused once (+ its Event), no loop
    assert not rayjob_exists(k, "vast")


# --- checkpoint folders: one RLJob each -----------------------------------------------------------------------

ON_CLAIM = {"storage.claimName": "shared-checkpoints"}


def test_two_rljobs_on_one_claim_get_folders_of_their_own(operator: OperatorProcess, k: Kube) -> None:
    uids = {name: k.create_rljob(rljob(name, **ON_CLAIM))["metadata"]["uid"] for name in ("one", "two")}
    for name in uids:
        wait_until(f"RayJob {name}", lambda n=name: rayjob_exists(k, n))
    folders = {name: spec_json_of(k, name)["trainer"]["checkpointDir"] for name in uids}
    assert folders == {name: f"{CHECKPOINT_MOUNT}/{name}-{uid}/checkpoints" for name, uid in uids.items()}


def test_a_second_rljob_on_the_same_absolute_folder_is_refused_naming_the_first(
    operator: OperatorProcess, k: Kube
) -> None:
    folder = {**ON_CLAIM, "trainer.checkpointDir": f"{CHECKPOINT_MOUNT}/team-run"}
    first = k.create_rljob(rljob("first", **folder))
    wait_until("RayJob first", lambda: rayjob_exists(k, "first"))
    k.create_rljob(rljob("second", **folder))
    failed = k.wait_phase("second", "Failed")
    message = condition(failed, "Valid")["message"]
    assert f"{CHECKPOINT_MOUNT}/team-run" in message and first["metadata"]["uid"] in message, message
    assert not rayjob_exists(k, "second")
    assert rayjob_exists(k, "first") and k.phase("first") != "Failed"


def test_a_recreated_rljob_of_the_same_name_does_not_take_the_old_ones_folder(
    operator: OperatorProcess, k: Kube
) -> None:
    old = k.create_rljob(rljob("redo", **ON_CLAIM))
    wait_until("RayJob", lambda: rayjob_exists(k, "redo"))
    old_folder = spec_json_of(k, "redo")["trainer"]["checkpointDir"]
    k.custom.delete_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, "redo")
    listing = k.custom.list_namespaced_custom_object
    wait_until(
        "RLJob gone",
        lambda: all(
            o["metadata"]["uid"] != old["metadata"]["uid"] for o in listing(GROUP, VERSION, k.ns, PLURAL)["items"]
        ),
    )
    new = k.create_rljob(rljob("redo", **ON_CLAIM))
    # the old children go first (garbage collector); the new ConfigMap then names the new RLJob's own folder
    new_folder = wait_until(
        "the new ConfigMap",
        lambda: (
            (cm := k.configmap("redo-spec")).metadata.owner_references[0].uid == new["metadata"]["uid"]
            and json.loads(cm.data[SPEC_FILE])["trainer"]["checkpointDir"]
        ),
        timeout=300,
    )
    assert old_folder == f"{CHECKPOINT_MOUNT}/redo-{old['metadata']['uid']}/checkpoints"
    assert new_folder == f"{CHECKPOINT_MOUNT}/redo-{new['metadata']['uid']}/checkpoints"
