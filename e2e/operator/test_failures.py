"""Issue 14: failures that end instead of looping, no spec drift under a running job, stall detection.

The operator runs as a real process against a real kube-apiserver; KubeRay is played by `KubeRaySim`. The data
error is real: the trainer's entrypoint runs on a truncated parquet file and reports to the RLJob through the
apiserver, as the driver on the Ray head does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness import Cluster
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, condition, wait_until
from kuberl.api.contract import (
    ENV_REPORT_STATUS,
    ENV_RLJOB_UID,
    EXIT_PERMANENT,
    SPEC_FILE,
    SPEC_HASH_ANNOTATION,
    TRAINER_MODULE,
    timestamp,
)

REPO = Path(__file__).resolve().parents[2]
RESYNC_SECONDS = 5  # the operator fixture's --resync-seconds


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def run_trainer(cluster: Cluster, k: Kube, name: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """The RayJob's entrypoint on the spec the pods would read (the ConfigMap), reporting to the RLJob."""
    spec_file = workdir / SPEC_FILE
    spec_file.write_text(k.configmap(f"{name}-spec").data[SPEC_FILE])
    env = {**cluster.env, ENV_REPORT_STATUS: "1", ENV_RLJOB_UID: k.rljob(name)["metadata"]["uid"]}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", TRAINER_MODULE, "--spec-file", str(spec_file), "--name", name, "--namespace", k.ns],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def rayjob_gone(k: Kube, name: str) -> bool:
    try:
        k.rayjob(name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@pytest.mark.timeout(240)
def test_a_data_error_fails_the_job_with_no_retry(
    cluster: Cluster, operator: OperatorProcess, k: Kube, sim: KubeRaySim, tmp_path: Path
) -> None:
    data = (REPO / "examples/data/digits-train.parquet").read_bytes()
    truncated = tmp_path / "train.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    k.create_rljob(rljob("baddata", **{"runPolicy.backoffLimit": 2, "data.trainFiles": [str(truncated)]}))
    assert sim.wait_for(k.ns, "baddata")["spec"]["backoffLimit"] == 2
    sim.initializing(k.ns, "baddata")
    sim.running(k.ns, "baddata")
    k.wait_phase("baddata", "Running")

    proc = run_trainer(cluster, k, "baddata", tmp_path)
    assert proc.returncode == EXIT_PERMANENT, proc.stderr[-3000:]

    failed = k.wait_phase("baddata", "Failed", timeout=30)
    cond = condition(failed, "Failed")
    assert (cond["status"], cond["reason"]) == ("True", "PermanentFailure")
    assert f"DataError: {truncated}" in cond["message"] and "not retried" in cond["message"]
    assert failed["status"]["progress"]["failure"]["kind"] == "Permanent"
    assert failed["status"].get("restarts", 0) == 0
    wait_until("the RayJob deleted (KubeRay has nothing to retry)", lambda: rayjob_gone(k, "baddata"))
    k.wait_events("baddata", ["PermanentFailure"])
    time.sleep(RESYNC_SECONDS + 1)  # a resync does not reopen it
    after = k.rljob("baddata")
    assert after["status"]["phase"] == "Failed" and after["status"].get("restarts", 0) == 0
    assert condition(after, "Failed")["reason"] == "PermanentFailure"


def test_a_transient_failure_is_retried_and_the_restart_names_it(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("lostnode", **{"runPolicy.backoffLimit": 2}))
    sim.wait_for(k.ns, "lostnode")
    sim.initializing(k.ns, "lostnode")
    sim.running(k.ns, "lostnode")
    k.wait_phase("lostnode", "Running")
    failure = {"kind": "Transient", "error": "ActorDiedError", "message": "node lost", "at": timestamp()}
    k.custom.patch_namespaced_custom_object_status(
        "kuberl.io", "v1alpha1", k.ns, "rljobs", "lostnode", {"status": {"progress": {"failure": failure}}}
    )
    sim.retry(k.ns, "lostnode")
    restarting = k.wait_phase("lostnode", "Restarting")
    assert restarting["status"]["restarts"] == 1
    assert "transient failure: ActorDiedError: node lost" in restarting["status"]["message"]
    assert not rayjob_gone(k, "lostnode")


def test_the_configmap_changes_only_with_the_rayjob(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("nodrift"))
    sim.wait_for(k.ns, "nodrift")
    sim.initializing(k.ns, "nodrift")
    sim.running(k.ns, "nodrift")
    k.wait_phase("nodrift", "Running")
    before = k.configmap("nodrift-spec")
    rayjob_hash = k.rayjob("nodrift")["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    assert before.metadata.annotations[SPEC_HASH_ANNOTATION] == rayjob_hash

    k.patch_rljob("nodrift", {"spec": {"trainer": {"saveFreq": 7}}})
    wait_until("the edit reconciled", lambda: k.rljob("nodrift")["status"].get("observedGeneration") == 2)
    sim.retry(k.ns, "nodrift")  # KubeRay's retry runs the same RayJob: its pods must read the same spec
    k.wait_phase("nodrift", "Restarting")
    time.sleep(1)
    assert k.configmap("nodrift-spec").data == before.data
    assert k.rayjob("nodrift")["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == rayjob_hash

    # suspended, the RayJob has no cluster: resuming rebuilds it, and the ConfigMap changes with its template
    sim.running(k.ns, "nodrift")
    k.patch_rljob("nodrift", {"spec": {"runPolicy": {"suspend": True}}})
    wait_until("RayJob suspend=true", lambda: k.rayjob("nodrift")["spec"]["suspend"] is True)
    sim.follow_suspend(k.ns, "nodrift")
    k.wait_phase("nodrift", "Suspended")
    assert k.configmap("nodrift-spec").data == before.data
    k.patch_rljob("nodrift", {"spec": {"runPolicy": {"suspend": False}}})
    wait_until("RayJob resumed", lambda: k.rayjob("nodrift")["spec"]["suspend"] is False)
    after = wait_until(
        "the new spec in the ConfigMap",
        lambda: (
            (cm := k.configmap("nodrift-spec")) and json.loads(cm.data[SPEC_FILE])["trainer"]["saveFreq"] == 7 and cm
        ),
    )
    new_hash = after.metadata.annotations[SPEC_HASH_ANNOTATION]
    assert new_hash != rayjob_hash
    assert k.rayjob("nodrift")["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == new_hash


def test_a_model_path_edit_of_a_running_job_is_refused(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("pinned"))
    sim.wait_for(k.ns, "pinned")
    sim.running(k.ns, "pinned")
    k.wait_phase("pinned", "Running")
    with pytest.raises(ApiException) as err:
        k.patch_rljob("pinned", {"spec": {"model": {"path": "/models/other"}}})
    assert err.value.status == 422
    assert "spec.model, data, reward, storage" in err.value.body


@pytest.mark.timeout(120)
def test_stalled_progress_sets_stalled_then_the_deadline_ends_the_job(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    policy = {"runPolicy.stallTimeoutSeconds": 2, "runPolicy.stallDeadlineSeconds": 15}
    k.create_rljob(rljob("stuck", **policy))
    sim.wait_for(k.ns, "stuck")
    sim.initializing(k.ns, "stuck")
    sim.running(k.ns, "stuck")
    k.wait_phase("stuck", "Running")
    # the trainer reports step 3 once, then hangs
    k.custom.patch_namespaced_custom_object_status(
        "kuberl.io",
        "v1alpha1",
        k.ns,
        "rljobs",
        "stuck",
        {"status": {"progress": {"step": 3, "updatedAt": timestamp()}}},
    )
    stalled = wait_until(
        "Stalled=True",
        lambda: (
            (o := k.rljob("stuck"))
            and any(c["type"] == "Stalled" and c["status"] == "True" for c in o["status"].get("conditions", []))
            and o
        ),
        timeout=3 * RESYNC_SECONDS,
    )
    assert stalled["status"]["phase"] == "Running"
    cond = condition(stalled, "Stalled")
    assert (
        cond["reason"] == "NoProgress" and "step 3" in cond["message"] and "stallTimeoutSeconds = 2" in cond["message"]
    )
    (event,) = [e for e in k.wait_events("stuck", ["Stalled"]) if e.reason == "Stalled"]
    assert event.type == "Warning"

    failed = k.wait_phase("stuck", "Failed", timeout=15 + 3 * RESYNC_SECONDS)
    assert condition(failed, "Failed")["reason"] == "StallDeadlineExceeded"
    wait_until("the RayJob deleted", lambda: rayjob_gone(k, "stuck"))
    k.wait_events("stuck", ["StallDeadlineExceeded"])
