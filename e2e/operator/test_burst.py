"""What a burst of RLJobs costs the operator, against a real kube-apiserver and a real operator process: creating N
RLJobs reads no RLJob list (the checkpoint-folder check read the whole namespace for every job: N × N RLJobs, the
operator's peak RSS in a burst; docs/operator.md, Benchmark), and once they are deleted the operator's phase gauge
holds none of them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families

from e2e.fixtures import require_tools
from e2e.harness import Cluster, Tools
from e2e.operator.conftest import running_operator
from e2e.operator.manifests import rljob
from e2e.operator.test_operator import Kube, wait_until
from kuberl.api.contract import CHECKPOINT_MOUNT

JOBS = 12


@pytest.fixture(scope="module")
def cluster(kube_tools: Tools) -> Iterator[Cluster]:
    """An apiserver of its own, without a controller-manager: its namespace controller LISTs the RLJobs of every
    namespace that earlier tests delete (some stay Terminating for minutes), which the LIST count here would take for
    the operator's."""
    require_tools(kube_tools, ["etcd", "kube-apiserver", "kubectl"])
    with Cluster(tools=kube_tools, controller_manager=False) as c:
        yield c


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


def rljob_lists(cluster: Cluster) -> float:
    """LIST requests for RLJobs the apiserver has served so far (its own apiserver_request_total)."""
    status, body = cluster.request("GET", "/metrics")
    assert status == 200, status
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        if family.name == "apiserver_request"
        for sample in family.samples
        if sample.name.endswith("_total")
        and sample.labels.get("verb") == "LIST"
        and sample.labels.get("resource") == "rljobs"
    )


def settled_rljob_lists(cluster: Cluster) -> float:
    """The LIST count once the operator's kopf watches have listed the RLJobs (they start a moment after the process):
    at least one LIST, then none for 2 s."""
    wait_until("kopf's first RLJob LIST", lambda: rljob_lists(cluster) >= 1)
    while True:
        seen = rljob_lists(cluster)
        time.sleep(2)
        if rljob_lists(cluster) == seen:
            return seen


def reconciled(k: Kube, name: str) -> bool:
    return bool((k.rljob(name).get("status") or {}).get("rayJobName"))


def test_a_burst_reads_no_rljob_list_and_the_operator_forgets_the_deleted_jobs(
    cluster: Cluster, namespace: str, kube: ApiClient, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    with running_operator(cluster, namespace, tmp_path, "--resync-seconds", "0") as operator:
        lists_before = settled_rljob_lists(cluster)
        names = [f"burst-{i}" for i in range(JOBS)]
        for name in names:
            k.create_rljob(rljob(name))
        for name in names:
            wait_until(f"{name} reconciled", lambda name=name: reconciled(k, name), timeout=120)
        assert rljob_lists(cluster) == lists_before

        shared = rljob("shared", **{"storage": {"claimName": "team"}, "trainer.checkpointDir": f"{CHECKPOINT_MOUNT}/x"})
        k.create_rljob(shared)  # an absolute folder another RLJob could use: the namespace is read once
        wait_until("shared reconciled", lambda: reconciled(k, "shared"), timeout=60)
        assert rljob_lists(cluster) == lists_before + 1

        assert 'kuberl_operator_rljobs{phase="Pending"} 13.0' in operator.metrics()
        for name in [*names, "shared"]:
            k.custom.delete_namespaced_custom_object("kuberl.io", "v1alpha1", namespace, "rljobs", name)
        wait_until("the phase gauge empty", lambda: 'kuberl_operator_rljobs{phase="Pending"} 0.0' in operator.metrics())
        assert not any(
            line.startswith("kuberl_operator_rljobs{") and not line.endswith(" 0.0")
            for line in operator.metrics().splitlines()
        )
