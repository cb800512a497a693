"""KubeRay's real controller against the harness's apiserver, with exactly the RBAC its own manifests grant it.

    with KubeRay(cluster, namespaces=("team-a",), log_dir=tmp_path) as kuberay:
        ...                                  # RayJobs in team-a now get RayClusters, Services, pods, submitters

The binary, its CRDs and its ClusterRole (`config/rbac/role.yaml`) come from one version of the
`github.com/ray-project/kuberay/ray-operator` module (`bash e2e/tools.sh install`). It runs as ServiceAccount
`kuberay-system/kuberay-operator` (a TokenRequest token, not admin) bound to that ClusterRole, without leader
election and metrics, and watches only `namespaces`, so that the KubeRay simulator (`e2e/operator/kuberay_sim.py`)
keeps the other namespaces of the session to itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import Cluster, _die_with_parent, free_port

NAMESPACE = "kuberay-system"
SERVICE_ACCOUNT = "kuberay-operator"
ROLE = "kuberl-e2e-kuberay-operator"


def rbac_objects(role_file: Path) -> list[dict[str, Any]]:
    """KubeRay's ServiceAccount, its own ClusterRole (renamed, rules untouched) and the binding."""
    role = yaml.safe_load(role_file.read_text())
    assert role["kind"] == "ClusterRole", role_file
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": ROLE},
            "rules": role["rules"],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]


@dataclass
class KubeRay:
    cluster: Cluster
    namespaces: tuple[str, ...]
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment, e.g. `LocalRayPods.proxy_env()` so that its dashboard client reaches the Ray heads."""
    health_port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = field(init=False, default=None)

    @property
    def log_path(self) -> Path:
        return self.log_dir / "ray-operator.log"

    def start(self, timeout: float = 60) -> KubeRay:
        tools = self.cluster.tools
        tools.require(["ray-operator"])
        self.cluster.apply(rbac_objects(tools.kuberay_role()))
        kubeconfig = self.cluster.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(tools.path("ray-operator")),
            f"-kubeconfig={kubeconfig}",
            f"-watch-namespace={','.join(self.namespaces)}",
            "-enable-leader-election=false",
            "-metrics-addr=0",
            f"-health-probe-bind-address=127.0.0.1:{self.health_port}",
            "-log-stdout-encoder=console",
        ]
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                preexec_fn=_die_with_parent,
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise RuntimeError(f"ray-operator exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"ray-operator not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> KubeRay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
