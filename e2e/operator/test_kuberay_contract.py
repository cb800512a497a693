"""The RLJob contract on KubeRay's real controller: success, retry with resume, suspend and resume.

Everything KubeRay does is its own: RayCluster, its Ray token Secret (the RayJob's `authOptions`), head Service,
submitter Job (K8sJobMode, as the operator renders it), status polling through the Ray dashboard's job API with that
token (any 401 or 403 fails the test), retries on a new cluster, suspension. The stand-in kubelet
(`e2e/kubelet.py`) runs the Ray pods' containers on this machine (`e2e/raypods.py`): each head pod is a real local
Ray head, each submitter pod runs KubeRay's `ray job submit` command, which starts the real trainer entrypoint.
Faults are real: the trainer process is killed with SIGKILL; a suspension (the user's, or Kueue's on the RayJob)
deletes the Ray pods, whose preStop hooks the kubelet runs before SIGTERM. Each job is the tiny CPU example cut to a
few steps.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import require_tools
from e2e.harness import REPO_ROOT, Cluster
from e2e.kubelet import FakeNode, StandInKubelet
from e2e.kuberay import KubeRay
from e2e.operator.conftest import add_trainer_service_account
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, wait_until
from e2e.raypods import LocalRayPods
from kuberl.api.contract import RAY_AUTH_MODE_TOKEN, RLJOB_LABEL, TOKEN_SECRET_KEY

pytestmark = pytest.mark.slow


class KubeRayRefused(AssertionError):
    """The Ray dashboard refused a call of KubeRay's controller (401, 403): KubeRay and the Ray cluster disagree on
    the token. With `authOptions` KubeRay both gives the cluster its token and sends it: there must be none."""


EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
RUN_TIMEOUT = 420.0  # a Ray head, the trainer's start and a few steps on 2 busy cores, plus KubeRay's 3 s polls


@dataclass
class RealStack:
    cluster: Cluster
    k: Kube
    operator: OperatorProcess
    kuberay: KubeRay
    pods: LocalRayPods

    def apply(self, name: str, run_policy: dict[str, Any] | None = None, **trainer: Any) -> Path:
        """`kubectl apply` the tiny example as `name`, its data in the job's folder; returns that folder."""
        job = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
        job["metadata"]["name"] = name
        job["spec"]["trainer"].update(
            testFreq=-1, valBeforeTrain=False, metricsPort=0, checkpointDir="checkpoints", **trainer
        )
        job["spec"]["runPolicy"] = run_policy or {}
        workdir = self.pods.pod_root / name
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "examples").symlink_to(REPO_ROOT / "examples")
        self.cluster.kubectl("apply", "-n", self.k.ns, "-f", "-", input=json.dumps(job))
        return workdir

    def status(self, name: str) -> dict[str, Any]:
        return self.k.rljob(name).get("status") or {}

    def wait_phase(self, name: str, phase: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            assert status.get("phase") != "Failed" or phase == "Failed", f"{status}\n{self.diagnostics(name)}"
            blocked = [
                c for c in status.get("conditions") or [] if c["type"] == "ClusterReady" and c["status"] == "False"
            ]
            assert not blocked or blocked[0]["reason"] == "Unschedulable", f"{blocked}\n{self.diagnostics(name)}"
            if refused := self.pods.unauthorized():
                raise KubeRayRefused(f"KubeRay's dashboard client was refused: {refused[:3]}")
            return status if status.get("phase") == phase else None

        try:
            return wait_until(f"RLJob {name} {phase}", reached, timeout=timeout, interval=1)
        except AssertionError as exc:
            raise type(exc)(f"{exc}\n{self.diagnostics(name)}") from None

    def diagnostics(self, name: str) -> str:
        parts = []
        for kind in ("rljob", "rayjob"):
            got = self.cluster.kubectl("get", kind, name, "-n", self.k.ns, "-o", "yaml", check=False)
            parts.append(got.stdout[-2500:] or got.stderr)
        for log in sorted(self.pods.pod_root.glob("**/*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}")
        for driver in sorted(Path("/tmp").glob("krl-*/session_*/logs/job-driver-*.log")):
            parts.append(f"--- {driver.name}\n{driver.read_text(errors='replace')[-2000:]}")
        parts.append(f"--- ray-operator\n{self.kuberay.log_tail(40)}")
        return "\n".join(parts)


def logged_steps(workdir: Path, name: str) -> list[int]:
    metrics = workdir / "runs" / name / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return [json.loads(line)["step"] for line in lines]


def trainer_pids(name: str, namespace: str) -> list[int]:
    """The trainer processes of RLJob `namespace/name` (the entrypoint's `python -m ...trainer`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--spec-file" in argv and name.encode() in argv and namespace.encode() in argv and b"-m" in argv:
            pids.append(int(proc.name))
    return pids


@pytest.fixture
def stack(cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path) -> Iterator[RealStack]:
    require_tools(cluster.tools, ["ray-operator"])
    kube = cluster.api_client()
    pods = LocalRayPods(
        kube, namespace, tmp_path / "pods", pod_env={"KUBECONFIG": str(cluster.kubeconfig), "OMP_NUM_THREADS": "1"}
    )
    add_trainer_service_account(cluster, namespace)  # the trainer itself reports with `pod_env`'s KUBECONFIG
    kuberay = KubeRay(cluster, namespaces=(namespace,), log_dir=tmp_path / "kuberay", env=pods.proxy_env())
    kubelet = StandInKubelet(
        kube, namespace, [FakeNode(f"big-{namespace[-6:]}", cpu="32", memory="128Gi")], containers=pods
    )
    kuberay.start()
    kubelet.start()
    try:
        yield RealStack(cluster, Kube(kube, namespace), operator, kuberay, pods)
    finally:
        kubelet.stop()
        kuberay.stop()
        pods.stop()
        print(kuberay.log_tail(200))


def dashboard_status(port: int, token: str | None) -> int:
    """HTTP status of the Ray dashboard's job list on the head itself (not through the Service proxy)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/jobs/")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def check_kuberay_token(stack: RealStack, name: str) -> None:
    """While the job runs: KubeRay made the token Secret of the Ray cluster (named after it, owned by it; the
    operator makes none), and the head's dashboard refuses a caller without that token or with another one."""
    head = wait_until("the Ray head up", lambda: stack.pods.head_of(name), timeout=RUN_TIMEOUT, interval=0.5)
    secret = stack.k.core.read_namespaced_secret(head.cluster, stack.k.ns)
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name) == ("RayCluster", head.cluster)
    token = base64.b64decode(secret.data[TOKEN_SECRET_KEY]).decode()
    rljob_secrets = stack.k.core.list_namespaced_secret(stack.k.ns, label_selector=f"{RLJOB_LABEL}={name}").items
    assert not rljob_secrets, "the operator creates no Secret of its own"
    assert dashboard_status(head.dashboard_port, None) == 401
    assert dashboard_status(head.dashboard_port, "x" * len(token)) == 403
    assert dashboard_status(head.dashboard_port, token) == 200


def test_a_killed_trainer_is_retried_on_a_new_cluster_and_resumes_to_succeeded_with_its_progress(
    stack: RealStack,
) -> None:
    """One job is the success path and the retry: KubeRay's token guards the head while the first attempt trains, its
    trainer is killed after two steps, and the retry on a new cluster resumes from the checkpoint to Succeeded."""
    name, total = "contract-retry", 12
    workdir = stack.apply(name, {"backoffLimit": 1}, totalSteps=total, saveFreq=1, maxCheckpoints=2)
    check_kuberay_token(stack, name)
    # with saveFreq 1 every logged step was checkpointed first (the trainer saves, then logs)
    wait_until("two trained steps", lambda: len(logged_steps(workdir, name)) >= 2, timeout=RUN_TIMEOUT, interval=0.5)
    first_cluster = stack.k.rayjob(name)["status"]["rayClusterName"]
    pids = trainer_pids(name, stack.k.ns)
    assert pids, "the trainer process of the first attempt"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed_after = len(logged_steps(workdir, name))
    assert killed_after < total, "the job finished before it could be killed; make it longer"

    status = stack.wait_phase(name, "Succeeded")
    assert status["restarts"] == 1
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == total
    assert progress["rewardMean"] is not None and progress["lastCheckpoint"]
    rayjob = stack.k.rayjob(name)
    assert rayjob["status"]["rayClusterName"] != first_cluster, "KubeRay retried on a new cluster"
    assert rayjob["spec"]["submissionMode"] == "K8sJobMode" and rayjob["status"]["jobStatus"] == "SUCCEEDED"
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": RAY_AUTH_MODE_TOKEN}
    assert rayjob["status"]["jobDeploymentStatus"] == "Complete"
    steps = logged_steps(workdir, name)
    assert steps == list(range(1, total + 1)), f"each step trained once, in order, across both attempts: {steps}"


def set_suspend(stack: RealStack, name: str, by: str, value: bool) -> None:
    """Suspend or resume RLJob `name` as a user does (runPolicy.suspend) or as Kueue preempts and re-admits it
    (the RayJob's spec.suspend, the RLJob left alone)."""
    if by == "user":
        body = {"spec": {"runPolicy": {"suspend": value}}}
        stack.k.custom.patch_namespaced_custom_object("kuberl.io", "v1alpha1", stack.k.ns, "rljobs", name, body)
    else:
        stack.k.custom.patch_namespaced_custom_object(
            "ray.io",
            "v1",
            stack.k.ns,
            "rayjobs",
            name,
            {"spec": {"suspend": value}},
            _content_type="application/merge-patch+json",
        )


def suspend_and_check_its_checkpoint(stack: RealStack, name: str, by: str, workdir: Path, total: int) -> list[int]:
    """Suspend `name` (by the user or by Kueue) and check what the stop left: the Ray cluster and its pods deleted,
    the trainer ended, the stop's checkpoint complete and reported, the head's preStop hook ran. Returns the steps
    trained so far."""
    hooks_before = "".join(p.read_text() for p in workdir.glob("*.prestop.log")).count("stopping Ray job")
    set_suspend(stack, name, by, True)
    stack.wait_phase(name, "Suspended", timeout=120)
    selector = f"ray.io/originated-from-cr-name={name}"
    wait_until(
        "the Ray cluster and its pods deleted",
        lambda: (
            not stack.k.custom.list_namespaced_custom_object(
                "ray.io", "v1", stack.k.ns, "rayclusters", label_selector=selector
            )["items"]
            and not stack.k.core.list_namespaced_pod(stack.k.ns, label_selector="ray.io/node-type=head").items
        ),
        timeout=180,
    )
    assert not trainer_pids(name, stack.k.ns), "the trainer ended with its Ray head"
    suspended_at = logged_steps(workdir, name)
    assert suspended_at == list(range(1, len(suspended_at) + 1)) and len(suspended_at) < total, suspended_at
    checkpoint = stack.status(name)["progress"]["lastCheckpoint"]
    assert checkpoint.endswith(f"global_step_{suspended_at[-1]}"), f"the stop's checkpoint reported: {checkpoint}"
    assert (workdir / checkpoint / "manifest.json").exists(), "a complete checkpoint"  # (an absolute path stays one)
    hook_logs = "".join(p.read_text() for p in workdir.glob("*.prestop.log"))
    assert hook_logs.count("stopping Ray job") > hooks_before, hook_logs
    return suspended_at


def test_suspend_checkpoints_before_the_ray_cluster_dies_and_resume_continues_from_that_step(
    stack: RealStack,
) -> None:
    """saveFreq far beyond the job: the only checkpoints before the end are the ones the stops make. One job is
    suspended twice, by the user (runPolicy.suspend) and then by Kueue (the RayJob's spec.suspend), each after steps
    of its own. The head's preStop hook (run by the stand-in kubelet on the pod's deletion, as a kubelet does) stops
    the Ray job; the trainer finishes its step, saves and reports it before its Ray head dies."""
    name, total = "contract-suspend", 16
    workdir = stack.apply(name, totalSteps=total, saveFreq=100, maxCheckpoints=2)
    rayjob = wait_until("the RayJob", lambda: stack.k.rayjob(name), timeout=RUN_TIMEOUT)
    head_template = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head_template["containers"][0]["lifecycle"]["preStop"], "the operator rendered the head's hook"

    trained = 0
    for by in ("user", "kueue"):
        suspend_after = trained + 3  # three steps of this attempt
        wait_until(
            f"{suspend_after} trained steps",
            lambda after=suspend_after: len(logged_steps(workdir, name)) >= after,
            timeout=RUN_TIMEOUT,
            interval=0.5,
        )
        trained = len(suspend_and_check_its_checkpoint(stack, name, by, workdir, total))
        set_suspend(stack, name, by, False)

    status = stack.wait_phase(name, "Succeeded")
    assert status["progress"]["step"] == total
    steps = logged_steps(workdir, name)
    assert steps == list(range(1, total + 1)), f"each step trained once, in order, across both suspensions: {steps}"
