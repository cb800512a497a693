"""The whole flow on one machine: `kubectl apply` an RLJob and watch it reach Succeeded.

Real parts: kube-apiserver, etcd and kube-controller-manager (the harness), the Helm chart
installed with real helm, the operator as a process with the chart's service account, the
trainer on a real local Ray, Prometheus scraping it. Only KubeRay is played, by
`KubeRayRunner`, which runs each RayJob's entrypoint the way KubeRay's submitter does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from e2e.harness import REPO_ROOT, Cluster
from e2e.kuberay_runner import KubeRayRunner
from e2e.operator.process import OperatorProcess
from e2e.prometheus import Prometheus, ScrapeJob

pytestmark = pytest.mark.slow

RELEASE = "kuberl"  # the chart names its objects after a release name containing "kuberl"
TRAINER_SA = "kuberl-trainer"
EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
STEPS = 6  # enough for Prometheus (1 s scrapes) to see a step while the trainer serves its metrics
T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, diagnostics: Callable[[], str]) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnostics()}")


@dataclass
class Stack:
    cluster: Cluster
    namespace: str
    operator: OperatorProcess
    runner: KubeRayRunner
    pods: Path

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.runner.api_client)

    def rljob(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object("kuberl.io", "v1alpha1", self.namespace, "rljobs", name)

    def exists(self, resource: str, name: str) -> bool:
        result = self.cluster.kubectl("get", resource, name, "-n", self.namespace, "-o", "name", check=False)
        return result.returncode == 0

    def prepare_pod_filesystem(self, name: str) -> Path:
        """The job's working directory: the example's relative data paths resolve inside it."""
        workdir = self.pods / name
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "examples").symlink_to(REPO_ROOT / "examples")
        return workdir

    def diagnostics(self, name: str) -> str:
        parts = [f"runner errors: {self.runner.errors[-5:]}"]
        for kind in ("rljob", "rayjob"):
            got = self.cluster.kubectl("get", kind, name, "-n", self.namespace, "-o", "yaml", check=False)
            parts.append(got.stdout[-3000:] or got.stderr)
        attempt = self.runner.attempts.get(name)
        if attempt:
            parts.append(f"--- job driver\n{attempt.driver_log()}")
        for log in sorted((self.pods / name).glob("*.log")):
            parts.append(f"--- {log}\n{log.read_text()[-2000:]}")
        parts.append(f"--- operator\n{self.operator.logs()[-3000:]}")
        return "\n".join(parts)

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.rljob(name).get("status") or {}
            assert status.get("phase") != "Failed" or phase == "Failed", f"RLJob failed: {status.get('message')}"
            return status if status.get("phase") == phase else None

        return wait_until(f"RLJob {name} to be {phase}", reached, timeout, lambda: self.diagnostics(name))


@pytest.fixture
def stack(cluster: Cluster, namespace: str, helm_bin: Path, tmp_path: Path) -> Iterator[Stack]:
    cluster.helm(
        "install",
        RELEASE,
        str(REPO_ROOT / "charts" / "kuberl"),
        "--namespace",
        namespace,
        "--skip-crds",
        "--set",
        f"watchNamespaces={{{namespace}}}",
    )
    operator = OperatorProcess(
        kubeconfig=cluster.service_account_kubeconfig(namespace, RELEASE),
        log_dir=tmp_path / "operator",
        namespaces=(namespace,),
    )
    runner = KubeRayRunner(
        cluster.api_client(),
        namespace,
        tmp_path / "pods",
        pod_env={"OMP_NUM_THREADS": "1"},
        head_credentials=lambda pod: {
            "KUBECONFIG": str(cluster.service_account_kubeconfig(namespace, TRAINER_SA, bound_pod=pod))
        },
    )
    operator.start()
    runner.start()
    try:
        yield Stack(cluster, namespace, operator, runner, tmp_path / "pods")
    finally:
        runner.stop()
        operator.stop()
        cluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait=false", check=False)


def test_apply_trains_to_succeeded_and_delete_cleans_up(stack: Stack) -> None:
    """The README's example, cut to a few steps: that it learns is `tests/trainer/test_run_tiny_cpu.py`'s check."""
    example = yaml.safe_load(EXAMPLE.read_text())
    example["spec"]["trainer"].update(totalSteps=STEPS, saveFreq=STEPS, testFreq=STEPS)
    name, total = example["metadata"]["name"], STEPS
    port = example["spec"]["trainer"].get("metricsPort", 9400)
    stack.prepare_pod_filesystem(name)
    with Prometheus([ScrapeJob("trainer", [f"127.0.0.1:{port}"])]) as prometheus:
        stack.cluster.kubectl("apply", "-n", stack.namespace, "-f", "-", input=json.dumps(example))
        wait_until("the RayJob", lambda: stack.exists("rayjob", name), 60, lambda: stack.diagnostics(name))
        stack.wait_phase(name, "Running", timeout=180)
        scraped = prometheus.wait_for(f'kuberl_step{{rljob="{name}"}}', timeout=300)
        status = stack.wait_phase(name, "Succeeded", timeout=600)

    assert scraped, "Prometheus never scraped the trainer"
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == total
    assert progress["rewardMean"] is not None and progress["lastCheckpoint"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"

    stack.cluster.kubectl("delete", "rljob", name, "-n", stack.namespace, "--wait=true", "--timeout=60s")
    wait_until(
        "the RayJob and ConfigMap to be garbage-collected",
        lambda: not stack.exists("rayjob", name) and not stack.exists("configmap", f"{name}-spec"),
        180,
        lambda: stack.diagnostics(name),
    )
