"""Kueue preempts a queued RLJob by suspending its RayJob (not the RLJob): the RLJob must show Suspended, the
operator must leave Kueue's `suspend` alone, and on re-admission the job runs again (resuming from its checkpoint,
`trainer.resume: auto`). KubeRay is played by `KubeRaySim`; Kueue's two writes are made as Kueue makes them."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, condition


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def kueue_sets_suspend(k: Kube, name: str, suspend: bool) -> None:
    k.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        k.ns,
        "rayjobs",
        name,
        {"spec": {"suspend": suspend}},
        _content_type="application/merge-patch+json",
    )


def test_kueue_preemption_shows_as_suspended_and_readmission_runs_the_job_again(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("queued", **{"cluster.queueName": "team-a"}))
    sim.wait_for(k.ns, "queued")
    sim.initializing(k.ns, "queued")
    sim.running(k.ns, "queued")
    k.wait_phase("queued", "Running")

    kueue_sets_suspend(k, "queued", True)  # preempted
    sim.follow_suspend(k.ns, "queued")
    suspended = k.wait_phase("queued", "Suspended")
    assert condition(suspended, "Suspended")["status"] == "True"
    time.sleep(3)  # a resync or two: the operator must not undo Kueue's decision
    assert k.rayjob("queued")["spec"]["suspend"] is True
    assert k.rljob("queued")["spec"]["runPolicy"].get("suspend", False) is False

    kueue_sets_suspend(k, "queued", False)  # admitted again
    sim.follow_suspend(k.ns, "queued")
    sim.running(k.ns, "queued")
    resumed = k.wait_phase("queued", "Running")
    assert condition(resumed, "Suspended")["status"] == "False"
    assert len(k.rayjobs("kuberl.io/rljob=queued")) == 1
