"""The operator owns the status but `progress` (ownership.py), as a real process on the harness apiserver:
an admin's forged phase is restored within a resync period, a finished job is left alone, and a trainer that
never reports progress earns one Warning Event. KubeRay is played by `KubeRaySim`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness import Cluster
from e2e.operator.conftest import running_operator
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import GROUP, PLURAL, VERSION, Kube, condition, wait_until

RESYNC_SECONDS = 2
PROGRESS_TIMEOUT_SECONDS = 3


@pytest.fixture
def operator(cluster: Cluster, rljob_crd: dict, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator with a short resync period and progress timeout; its log is printed on teardown."""
    args = ("--resync-seconds", str(RESYNC_SECONDS), "--progress-timeout-seconds", str(PROGRESS_TIMEOUT_SECONDS))
    with running_operator(cluster, namespace, tmp_path, *args) as proc:
        yield proc


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


def patch_status_as_admin(k: Kube, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """A status write by an identity the chart's policy does not restrain (here: the harness's admin)."""
    return k.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, k.ns, PLURAL, name, {"status": status}, _content_type="application/merge-patch+json"
    )


def reasons(k: Kube, name: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in k.events(name) if e.reason == reason]


def test_an_admin_s_forged_succeeded_is_restored_within_the_resync_period(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("forged"))
    sim.wait_for(k.ns, "forged")
    sim.running(k.ns, "forged")
    k.wait_phase("forged", "Running")
    forged = patch_status_as_admin(k, "forged", {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"})
    assert forged["status"]["phase"] == "Succeeded"
    began = time.monotonic()
    restored = k.wait_phase("forged", "Running", timeout=3 * RESYNC_SECONDS + 5)
    assert time.monotonic() - began < 3 * RESYNC_SECONDS + 5
    assert "completionTime" not in restored["status"]
    assert condition(restored, "Running")["status"] == "True"
    (event,) = wait_until("StatusRestored", lambda: reasons(k, "forged", "StatusRestored"))
    assert event.type == "Warning" and "status.phase was Succeeded but RayJob forged is Running" in event.message
    # the trainer never reports here: once that is recorded too, nothing diverges and nothing is written
    wait_until("ProgressReported", lambda: reasons(k, "forged", "ProgressNotReported"), timeout=15)
    settled = k.rljob("forged")["metadata"]["resourceVersion"]
    time.sleep(2 * RESYNC_SECONDS + 1)
    assert k.rljob("forged")["metadata"]["resourceVersion"] == settled
    assert len(reasons(k, "forged", "StatusRestored")) == 1


def test_a_finished_job_is_not_rewritten_and_its_forged_phase_is_restored(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("done"))
    sim.wait_for(k.ns, "done")
    sim.running(k.ns, "done")
    sim.complete(k.ns, "done")
    done = k.wait_phase("done", "Succeeded")
    time.sleep(2 * RESYNC_SECONDS + 1)  # resyncs of a finished job: reads only
    assert k.rljob("done")["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"]
    patch_status_as_admin(k, "done", {"phase": "Failed"})
    k.wait_phase("done", "Succeeded", timeout=3 * RESYNC_SECONDS + 5)
    assert condition(k.rljob("done"), "Succeeded")["status"] == "True"


def test_a_trainer_that_never_reports_progress_gets_one_warning_event(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("silent"))
    sim.wait_for(k.ns, "silent")
    sim.running(k.ns, "silent")
    k.wait_phase("silent", "Running")
    (event,) = wait_until(
        "ProgressNotReported",
        lambda: reasons(k, "silent", "ProgressNotReported"),
        timeout=PROGRESS_TIMEOUT_SECONDS + 10,
    )
    assert event.type == "Warning"
    assert "'kuberl-trainer'" in event.message and "rljobs/status" in event.message
    assert condition(k.rljob("silent"), "ProgressReported")["status"] == "False"
    time.sleep(3 * RESYNC_SECONDS)  # several resyncs later: still one Event
    assert len(reasons(k, "silent", "ProgressNotReported")) == 1
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    patch_status_as_admin(k, "silent", {"progress": {"step": 1, "totalSteps": 10, "updatedAt": now}})
    wait_until(
        "ProgressReported=True",
        lambda: condition(k.rljob("silent"), "ProgressReported")["status"] == "True",
        timeout=PROGRESS_TIMEOUT_SECONDS,
    )
