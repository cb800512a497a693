"""Fixtures of the operator's apiserver tests: the RLJob CRD, a running operator process per test, the KubeRay
simulator, and KubeRay's real controller."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import require_tools
from e2e.harness import Cluster, rljob_crd_file
from e2e.kuberay import KubeRay
from e2e.operator.crd import require_rljob_crd
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.process import OperatorProcess


@pytest.fixture(scope="module")
def rljob_crd(cluster: Cluster) -> dict[str, Any]:
    """The generated `crds/rljob.yaml` as the harness installed it."""
    if not rljob_crd_file().exists():
        pytest.skip("crds/rljob.yaml is missing")
    return require_rljob_crd(cluster)


@pytest.fixture
def kube(cluster: Cluster):
    return cluster.api_client()


@pytest.fixture
def sim(kube) -> KubeRaySim:
    return KubeRaySim(kube)


@contextmanager
def running_operator(
    cluster: Cluster, namespace: str, tmp_path: Path, *args: str, kubeconfig: Path | None = None
) -> Iterator[OperatorProcess]:
    """`python -m kuberl.operator --namespace <namespace> ARGS` as admin (or as `kubeconfig` says); its log is
    printed when it stops."""
    proc = OperatorProcess(
        kubeconfig=kubeconfig or cluster.kubeconfig,
        log_dir=tmp_path / "operator",
        namespaces=(namespace,),
        extra_args=args,
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        print(proc.logs()[-20000:])


@pytest.fixture
def operator(cluster: Cluster, rljob_crd: dict, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator of the test's namespace, resyncing every 5 s and diagnosing every second."""
    with running_operator(cluster, namespace, tmp_path, "--resync-seconds", "5", "--diagnose-seconds", "1") as proc:
        yield proc


TRAINER_SA = "kuberl-trainer"


def add_trainer_service_account(cluster: Cluster, namespace: str) -> None:
    """The Ray pods' ServiceAccount, which the chart creates: without it KubeRay's pod creation is forbidden."""
    cluster.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TRAINER_SA}}, namespace=namespace)


@pytest.fixture
def kuberay(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[KubeRay]:
    """KubeRay's real controller watching the test's namespace, with its own ClusterRole; its log on teardown."""
    require_tools(cluster.tools, ["ray-operator"])
    add_trainer_service_account(cluster, namespace)
    running = KubeRay(cluster, namespaces=(namespace,), log_dir=tmp_path / "kuberay").start()
    try:
        yield running
    finally:
        running.stop()
        print(running.log_tail(200))
