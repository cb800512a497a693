"""Admission's memory verdict against a real kube-apiserver and a real operator process: issue 35's colocated run with
a token budget an H100 cannot hold (tests.api.plan_cases.py), its trainer pool on H100 nodes, ends `Failed` before any
RayJob exists, with the plan `kuberl validate` prints for it; the same runs with the token budget left out are
admitted and get their RayJob."""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, condition, wait_until
from kuberl.api.documents import check
from kuberl.api.memory_admission import PLAN_FITS_RULE
from tests.api.plan_cases import COLOCATED_UTILIZATIONS, fitting_rljob, too_large_rljob


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


@pytest.fixture
def k(kube, namespace: str) -> Kube:
    return Kube(kube, namespace)


def test_colocated_runs_too_large_for_an_h100_are_refused_before_any_rayjob_with_the_plan(
    operator: OperatorProcess, k: Kube
) -> None:
    docs = {
        f"oom-colo-{int(utilization * 10)}": too_large_rljob(
            f"oom-colo-{int(utilization * 10)}", utilization=utilization
        )
        for utilization in COLOCATED_UTILIZATIONS
    }
    offline = {name: check(f"{name}.yaml", doc).issues for name, doc in docs.items()}  # kuberl validate's verdict
    for doc in docs.values():
        k.create_rljob(doc)
    for name, issues in offline.items():
        (issue,) = issues
        assert issue.rule == PLAN_FITS_RULE
        failed = k.wait_phase(name, "Failed", timeout=60)
        valid = condition(failed, "Valid")
        assert (valid["status"], valid["reason"], valid["message"]) == ("False", "InvalidSpec", str(issue))
        assert condition(failed, "Failed")["status"] == "True"
        assert failed["status"]["message"] == str(issue)
        assert "does not fit one H100-80GB" in valid["message"] and "phase: train" in valid["message"]
        events = k.wait_events(name, ["InvalidSpec"])
        (event,) = [e for e in events if e.reason == "InvalidSpec"]
        assert event.type == "Warning" and event.message.startswith(str(issue)[:400])  # kopf keeps 1 KiB of it
    time.sleep(1)
    assert k.rayjobs() == []
    for name in docs:
        with pytest.raises(ApiException) as missing:
            k.configmap(f"{name}-spec")
        assert missing.value.status == 404


@pytest.mark.parametrize("separate", [False, True], ids=["colocated", "one-step-off"])
def test_the_same_run_with_the_budget_left_out_is_admitted(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim, separate: bool
) -> None:
    doc = fitting_rljob("fits", separate=separate)
    assert check("fits.yaml", doc).issues == []
    k.create_rljob(doc)
    workers = sim.wait_for(k.ns, "fits")["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers[0]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    wait_until("fits admitted", lambda: (k.rljob("fits").get("status") or {}).get("rayJobName") == "fits")
    assert condition(k.rljob("fits"), "Valid")["status"] == "True"
