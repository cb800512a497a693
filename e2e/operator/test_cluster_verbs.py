"""`kuberl submit | status | logs | stop | resume` and `kuberl crd --apply` as a user runs them (the CLI as a
process, with a kubeconfig), against the harness's kube-apiserver, the operator as a process and KubeRay's real
controller; the stand-in kubelet runs the pods and `PodLogs` answers pods/log for the log reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness import Cluster
from e2e.kubelet import FakeNode, StandInKubelet
from e2e.kuberay import KubeRay
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, wait_until
from e2e.pod_logs import PodLogs
from kuberl.api.contract import DRIVER_LOG

pytestmark = pytest.mark.slow  # the CLI starts as a process each time: 3-7 s on two busy cores
WAIT = 60.0  # KubeRay's and the operator's loops on two busy cores


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


@pytest.fixture
def node(kube: client.ApiClient, namespace: str) -> Iterator[str]:
    name = f"node-{namespace[-6:]}"
    running = StandInKubelet(kube, namespace, [FakeNode(name, cpu="32", memory="128Gi")]).start()
    try:
        yield name
    finally:
        running.stop()


@pytest.fixture
def pod_logs(kube: client.ApiClient, node: str, tmp_path: Path) -> Iterator[PodLogs]:
    with PodLogs(kube, tmp_path / "claims").start([node]) as logs:
        yield logs


def kuberl(
    cluster: Cluster, namespace: str, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kuberl.cli", *args, "--kubeconfig", str(kubeconfig or cluster.kubeconfig)]
    return subprocess.run([*command, "-n", namespace], capture_output=True, text=True, timeout=180)


def manifest(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def head_pods(k: Kube, name: str) -> list[client.V1Pod]:
    pods = k.core.list_namespaced_pod(k.ns, label_selector=f"kuberl.io/rljob={name},ray.io/node-type=head").items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def driver_log(claims: Path, k: Kube, name: str) -> Path:
    """The claim folder's driver log: storage.claim's `<name>-checkpoints`, the RLJob's own `<name>-<uid>` folder
    there, checkpointDir `checkpoints`."""
    uid = k.rljob(name)["metadata"]["uid"]
    path = claims / f"{name}-checkpoints" / f"{name}-{uid}" / "checkpoints" / DRIVER_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def submitted(cluster: Cluster, k: Kube, tmp_path: Path, name: str) -> None:
    result = kuberl(cluster, k.ns, "submit", str(manifest(tmp_path, rljob(name))))
    assert result.returncode == 0, result.stderr
    wait_until(f"the head pod of {name}", lambda: head_pods(k, name), timeout=WAIT)


# --- submit -----------------------------------------------------------------------------------------------------


def test_submit_validates_applies_server_side_and_prints_the_name(
    cluster: Cluster, rljob_crd: dict[str, Any], k: Kube, tmp_path: Path
) -> None:
    bad = rljob("bad", **{"batch.ppoMiniBatchSize": 3})
    result = kuberl(cluster, k.ns, "submit", str(manifest(tmp_path, bad)))
    assert result.returncode == 1 and "batch.ppoMiniBatchSize" in result.stderr
    assert not k.custom.list_namespaced_custom_object("kuberl.io", "v1alpha1", k.ns, "rljobs")["items"]
    path = manifest(tmp_path, rljob("good"))
    for _ in range(2):  # applying again is a no-op, as kubectl apply
        result = kuberl(cluster, k.ns, "submit", str(path))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"rljob.kuberl.io/good applied in namespace {k.ns}"
    managers = {f["manager"] for f in k.rljob("good")["metadata"]["managedFields"]}
    assert "kuberl" in managers
    result = kuberl(cluster, k.ns, "submit", str(path), "--set", "batch.rolloutN=8")
    assert result.returncode == 0 and k.rljob("good")["spec"]["batch"]["rolloutN"] == 8


# --- status -----------------------------------------------------------------------------------------------------


def test_status_shows_the_phase_progress_conditions_and_the_ray_pods(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube, node: str, tmp_path: Path
) -> None:
    submitted(cluster, k, tmp_path, "watched")
    status = {
        "step": 3,
        "totalSteps": 12,
        "percentComplete": 25,
        "rewardMean": 0.125,
        "estimatedRemainingTimeSummary": "4m10s",
        "lastCheckpoint": "/ck/global_step_2",
    }
    k.custom.patch_namespaced_custom_object_status(
        "kuberl.io", "v1alpha1", k.ns, "rljobs", "watched", {"status": {"progress": status}}
    )
    result = kuberl(cluster, k.ns, "status", "watched")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"RLJob watched in {k.ns}: ")
    assert "step 3/12 (25%)  reward 0.125  ETA 4m10s" in out and "last checkpoint: /ck/global_step_2" in out
    head = next(line for line in out.splitlines() if "-head-" in line)
    assert head.split()[1:4] == ["head", "Running", "1/1"] and head.split()[-1] == node
    assert any(line.split()[1:3] == ["trainer", "Running"] for line in out.splitlines() if "-worker-" in line)
    as_json = kuberl(cluster, k.ns, "status", "watched", "-o", "json")
    assert '"rewardMean": 0.125' in as_json.stdout


def test_status_of_a_missing_job_and_of_a_stopped_apiserver_say_what_and_where(
    cluster: Cluster, rljob_crd: dict[str, Any], k: Kube, tmp_path: Path
) -> None:
    result = kuberl(cluster, k.ns, "status", "nothing")
    assert result.returncode == 2
    assert f"RLJob nothing not found in namespace {k.ns}" in result.stderr and "Traceback" not in result.stderr
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens: a stopped apiserver
    stopped = tmp_path / "stopped.kubeconfig"
    stopped.write_text(yaml.safe_dump(config))
    result = kuberl(cluster, k.ns, "status", "nothing", kubeconfig=stopped)
    assert result.returncode == 2 and "https://127.0.0.1:1" in result.stderr and "Traceback" not in result.stderr


# --- logs -------------------------------------------------------------------------------------------------------


def test_logs_read_the_driver_log_on_the_claim_also_after_the_head_pod_restarted(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube, pod_logs: PodLogs, tmp_path: Path
) -> None:
    submitted(cluster, k, tmp_path, "logged")
    log = driver_log(pod_logs.claims, k, "logged")
    log.write_text("=== attempt 1\nstep 1/12 reward 0.10\nstep 2/12 reward 0.12\n")
    result = kuberl(cluster, k.ns, "logs", "logged")
    assert result.returncode == 0, result.stderr
    assert result.stdout == log.read_text()
    (first,) = head_pods(k, "logged")
    k.core.delete_namespaced_pod(first.metadata.name, k.ns, grace_period_seconds=0)
    wait_until(
        "a new head pod", lambda: [p for p in head_pods(k, "logged") if p.metadata.uid != first.metadata.uid], WAIT
    )
    with log.open("a") as handle:
        handle.write("=== attempt 1, head restarted\nstep 3/12 reward 0.15\n")
    result = kuberl(cluster, k.ns, "logs", "logged", "--tail", "2")
    assert result.stdout == "=== attempt 1, head restarted\nstep 3/12 reward 0.15\n", result.stderr
    assert kuberl(cluster, k.ns, "logs", "logged").stdout.count("step ") == 3
    readers = k.core.list_namespaced_pod(k.ns, label_selector="app.kubernetes.io/component=log-reader").items
    assert not [p for p in readers if not p.metadata.deletion_timestamp]


def test_logs_follow_streams_new_lines_until_interrupted_and_removes_its_reader(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube, pod_logs: PodLogs, tmp_path: Path
) -> None:
    submitted(cluster, k, tmp_path, "followed")
    log = driver_log(pod_logs.claims, k, "followed")
    log.write_text("step 1/12\n")
    command = [sys.executable, "-m", "kuberl.cli", "logs", "followed", "-f", "--kubeconfig", str(cluster.kubeconfig)]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a SIGABRT prints every thread's stack
    # Ctrl-C as a terminal sends it: under a runner started in the background (`cmd &`) SIGINT is ignored, and a
    # Python started with it ignored never raises KeyboardInterrupt, so the CLI gets SIGINT's default back
    process = subprocess.Popen(
        [*command, "-n", k.ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "step 1/12\n"
        with log.open("a") as handle:
            handle.write("step 2/12\n")
        assert process.stdout.readline() == "step 2/12\n"
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            raise AssertionError(
                f"kuberl logs -f still ran 30 s after Ctrl-C; its threads:\n{stderr[-6000:]}"
            ) from None
        assert code == 130
    finally:
        if process.poll() is None:
            process.kill()
    assert "Traceback" not in (process.stderr.read() if process.stderr else "")
    wait_until(
        "the reader pod deleted",
        lambda: not k.core.list_namespaced_pod(k.ns, label_selector="app.kubernetes.io/component=log-reader").items,
        timeout=WAIT,
    )


def test_logs_before_the_trainer_started_say_why(
    cluster: Cluster, rljob_crd: dict[str, Any], k: Kube, tmp_path: Path
) -> None:
    k.create_rljob(rljob("early"))  # no operator: no RayJob
    result = kuberl(cluster, k.ns, "logs", "early")
    assert result.returncode == 2 and "RLJob early has no RayJob yet (Pending)" in result.stderr


# --- stop / resume ------------------------------------------------------------------------------------------------


def test_stop_suspends_through_kuberay_and_resume_brings_the_cluster_back(
    cluster: Cluster, operator: OperatorProcess, kuberay: KubeRay, k: Kube, node: str, tmp_path: Path
) -> None:
    submitted(cluster, k, tmp_path, "paused")
    result = kuberl(cluster, k.ns, "stop", "paused", "--timeout", str(WAIT))
    assert result.returncode == 0, result.stderr
    assert "rljob.kuberl.io/paused stopping" in result.stdout and "last checkpoint: none yet" in result.stdout
    assert k.phase("paused") == "Suspended"
    rayjob_name = k.rljob("paused")["status"]["rayJobName"]
    assert k.rayjob(rayjob_name)["spec"]["suspend"] is True
    wait_until("the Ray pods gone", lambda: not head_pods(k, "paused"), timeout=WAIT)
    result = kuberl(cluster, k.ns, "resume", "paused", "--timeout", str(WAIT))
    assert result.returncode == 0, result.stderr
    assert k.phase("paused") != "Suspended" and k.rayjob(rayjob_name)["spec"]["suspend"] is False
    wait_until("a head pod again", lambda: head_pods(k, "paused"), timeout=WAIT)


# --- crd --apply --------------------------------------------------------------------------------------------------


def test_crd_apply_upgrades_the_crd_helm_installed_once(
    cluster: Cluster, rljob_crd: dict[str, Any], tmp_path: Path
) -> None:
    ext = client.ApiextensionsV1Api(cluster.api_client())
    crd = ext.read_custom_resource_definition("rljobs.kuberl.io")
    columns = [c.name for c in crd.spec.versions[0].additional_printer_columns]
    older = [{"op": "remove", "path": "/spec/versions/0/additionalPrinterColumns/1"}]  # an older CRD: no Cluster
    ext.patch_custom_resource_definition("rljobs.kuberl.io", older)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    dry = subprocess.run(
        [sys.executable, "-m", "kuberl.cli", "crd", "--apply", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert dry.returncode == 0 and "applied (dry run)" in dry.stdout, dry.stderr
    assert "Cluster" not in [
        c.name
        for c in ext.read_custom_resource_definition("rljobs.kuberl.io").spec.versions[0].additional_printer_columns
    ]
    result = subprocess.run(
        [sys.executable, "-m", "kuberl.cli", "crd", "--apply"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "customresourcedefinition.apiextensions.k8s.io/rljobs.kuberl.io applied"
    upgraded = ext.read_custom_resource_definition("rljobs.kuberl.io")
    assert [c.name for c in upgraded.spec.versions[0].additional_printer_columns] == columns
