"""next_status: RayJob states → RLJob phase, conditions, times, restarts and Events."""

from __future__ import annotations

import pytest

from kuberl.api.status import RLJobStatus
from kuberl.operator.status import (
    EVENT_MESSAGE_BYTES,
    camel_reason,
    get_condition,
    invalid_status,
    next_status,
    status_patch,
    valid_condition,
)

T0, T1, T2, T3 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z"


def rayjob(
    jds: str = "",
    job: str = "",
    *,
    suspend: bool = False,
    failed: int = 0,
    reason: str = "",
    message: str = "",
    cluster: str | None = "j-raycluster-abcde",
    queue: str | None = None,
    end: str | None = None,
) -> dict:
    status = {"jobDeploymentStatus": jds, "jobStatus": job, "failed": failed, "succeeded": 0}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if cluster and jds not in ("", "New"):
        status["rayClusterName"] = cluster
        status["dashboardURL"] = f"{cluster}-head-svc.ns.svc.cluster.local:8265"
    if end:
        status["endTime"] = end
    labels = {"kuberl.io/rljob": "j"}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "j", "labels": labels},
        "spec": {"suspend": suspend, "shutdownAfterJobFinishes": True},
        "status": status,
    }


def cond(status: dict, type_: str) -> dict:
    c = get_condition(status, type_)
    assert c is not None, f"no {type_} condition in {status}"
    return c


def walk(*steps: tuple[dict | None, str]) -> tuple[dict, list]:
    """Apply next_status over (rayjob, now) steps from an empty status; return the final status and all events."""
    status: dict = {}
    events = []
    for rj, now in steps:
        status, evs = next_status(status, rj, now=now)
        events += evs
    return status, events


@pytest.mark.parametrize(
    ("rj", "phase"),
    [
        (rayjob(""), "Pending"),
        (rayjob("New"), "Pending"),
        (rayjob("Initializing"), "Pending"),
        (rayjob("Waiting"), "Pending"),
        (rayjob("Running", "PENDING"), "Running"),
        (rayjob("Running", "RUNNING"), "Running"),
        (rayjob("Retrying", failed=1), "Restarting"),
        (rayjob("Initializing", failed=1), "Restarting"),
        (rayjob("Suspending", suspend=True), "Suspended"),
        (rayjob("Suspended", suspend=True), "Suspended"),
        (rayjob("", suspend=True), "Suspended"),
        (rayjob("Running", "RUNNING", suspend=True), "Suspended"),
        (rayjob("Complete", "SUCCEEDED"), "Succeeded"),
        (rayjob("Complete", "FAILED"), "Failed"),
        (rayjob("Complete", "STOPPED"), "Failed"),
        (rayjob("Failed", "FAILED", reason="AppFailed"), "Failed"),
        (rayjob("Failed", reason="DeadlineExceeded"), "Failed"),
        (rayjob("ValidationFailed", reason="ValidationFailed", message="RayJob name too long"), "Failed"),
    ],
)
def test_rayjob_states_map_to_phases(rj: dict, phase: str) -> None:
    status, _ = next_status({}, rj, now=T0)
    assert status["phase"] == phase


def test_every_status_written_fits_the_declared_status_schema() -> None:
    status, _ = walk(
        (None, T0),
        (rayjob("Initializing"), T1),
        (rayjob("Running", "RUNNING"), T2),
        (rayjob("Failed", "FAILED", reason="AppFailed", failed=1), T3),
    )
    RLJobStatus.model_validate(status)  # extra="forbid": every key is declared, so nothing gets pruned


def test_a_successful_run_goes_pending_running_succeeded_with_events() -> None:
    status, events = walk(
        (rayjob(""), T0),
        (rayjob("Initializing"), T1),
        (rayjob("Running", "RUNNING"), T2),
        (rayjob("Complete", "SUCCEEDED", end=T3), T3),
    )
    assert status["phase"] == "Succeeded"
    assert [(e.type, e.reason) for e in events] == [  # no Event for a new RLJob's first phase: its creation says it
        ("Normal", "Running"),
        ("Normal", "Succeeded"),
    ]
    assert status["startTime"] == T2
    assert status["completionTime"] == T3
    assert cond(status, "Succeeded")["status"] == "True"
    assert cond(status, "Running")["status"] == "False"
    assert cond(status, "Failed")["status"] == "False"
    assert cond(status, "Created")["status"] == "True"
    assert status["rayClusterName"] == "j-raycluster-abcde"
    assert status["dashboardURL"].endswith(":8265")
    assert status["rayJobName"] == "j"


def test_last_transition_time_changes_only_when_the_condition_status_changes() -> None:
    s1, _ = next_status({}, rayjob("Initializing"), now=T0)
    s2, _ = next_status(s1, rayjob("Running", "PENDING"), now=T1)
    s3, _ = next_status(s2, rayjob("Running", "RUNNING"), now=T2)
    assert cond(s1, "Created")["lastTransitionTime"] == T0
    assert cond(s3, "Created")["lastTransitionTime"] == T0
    assert cond(s2, "Running")["lastTransitionTime"] == T1
    assert cond(s3, "Running")["lastTransitionTime"] == T1  # PENDING → RUNNING: message changes, status doesn't
    assert cond(s3, "Running")["message"] != cond(s2, "Running")["message"]
    assert cond(s3, "Failed")["lastTransitionTime"] == T0


def test_the_same_rayjob_twice_changes_nothing_and_posts_no_event() -> None:
    s1, _ = next_status({}, rayjob("Running", "RUNNING"), now=T0)
    s2, events = next_status(s1, rayjob("Running", "RUNNING"), now=T1)
    assert s2 == s1
    assert events == []
    assert status_patch(s1, s2) == {}


def test_app_failure_reports_kuberays_reason_and_message() -> None:
    status, events = walk(
        (rayjob("Running", "RUNNING"), T0),
        (rayjob("Failed", "FAILED", reason="AppFailed", message="Job failed: OOM"), T1),
    )
    assert status["phase"] == "Failed"
    assert status["message"] == "Job failed: OOM"
    failed = cond(status, "Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "AppFailed", "Job failed: OOM")
    assert events[-1].type == "Warning" and events[-1].reason == "Failed"
    assert status["completionTime"] == T1


def test_retries_count_restarts_and_warn_once_per_attempt() -> None:
    status, events = walk(
        (rayjob("Running", "RUNNING"), T0),
        (rayjob("Retrying", failed=1, reason="AppFailed"), T1),
        (rayjob("Initializing", failed=1), T1),
        (rayjob("Running", "RUNNING", failed=1), T2),
        (rayjob("Retrying", failed=2), T2),
        (rayjob("Running", "RUNNING", failed=2), T3),
    )
    assert status["phase"] == "Running"
    assert status["restarts"] == 2
    assert [e.reason for e in events].count("Restarting") == 2
    assert status["startTime"] == T0  # the first attempt's start


def test_restarts_are_counted_even_when_retrying_was_never_seen() -> None:
    status, events = walk((rayjob("Running", "RUNNING"), T0), (rayjob("Initializing", failed=1), T1))
    assert (status["phase"], status["restarts"]) == ("Restarting", 1)
    assert any(e.reason == "Restarting" and e.type == "Warning" for e in events)


def test_final_failure_after_retries_does_not_count_the_last_attempt_as_a_restart() -> None:
    status, _ = walk(
        (rayjob("Running", "RUNNING"), T0),
        (rayjob("Retrying", failed=1), T1),
        (rayjob("Failed", "FAILED", failed=2, reason="AppFailed"), T2),
    )
    assert (status["phase"], status["restarts"]) == ("Failed", 1)


def test_suspend_and_resume() -> None:
    s1, _ = next_status({}, rayjob("Running", "RUNNING"), now=T0)
    s2, e2 = next_status(s1, rayjob("Suspending", suspend=True), now=T1)
    s3, e3 = next_status(s2, rayjob("Suspended", suspend=True), now=T2)
    s4, e4 = next_status(s3, rayjob("Initializing"), now=T3)
    assert [s["phase"] for s in (s2, s3, s4)] == ["Suspended", "Suspended", "Pending"]
    assert cond(s3, "Suspended")["status"] == "True"
    assert cond(s3, "Suspended")["lastTransitionTime"] == T1
    assert cond(s4, "Suspended")["status"] == "False"
    assert [e.reason for e in e2] == ["Suspended"]
    assert e3 == []
    assert [e.reason for e in e4] == ["Resumed", "Pending"]


def test_kueue_suspension_names_the_queue() -> None:
    status, _ = next_status({}, rayjob("Suspended", suspend=True, queue="gpu-queue"), now=T0)
    assert "gpu-queue" in status["message"]


def test_terminal_phases_are_final() -> None:
    done, _ = next_status({}, rayjob("Complete", "SUCCEEDED"), now=T0)
    later, events = next_status(done, rayjob("Suspended", suspend=True), now=T1)
    assert later == done
    assert events == []


def test_status_without_a_rayjob_is_pending_without_an_event() -> None:
    s1, e1 = next_status({}, None, now=T0)
    s2, e2 = next_status(s1, None, now=T1)
    assert s1["phase"] == s2["phase"] == "Pending"
    assert e1 == e2 == []


def test_progress_and_kopf_are_left_alone() -> None:
    old = {"phase": "Running", "progress": {"step": 5}, "kopf": {"progress": {}}}
    new, _ = next_status(old, rayjob("Running", "RUNNING"), now=T0)
    assert new["progress"] == {"step": 5}
    assert "kopf" not in new
    assert "progress" not in status_patch(old, new)


def test_observed_generation_is_recorded_when_given() -> None:
    status, _ = next_status({}, rayjob("Running", "RUNNING"), now=T0, generation=3)
    assert status["observedGeneration"] == 3
    assert cond(status, "Running")["observedGeneration"] == 3


def test_invalid_spec_fails_with_valid_false_and_the_rules_message() -> None:
    status, events = invalid_status({}, ["spec.batch.ppoMiniBatchSize: 96 is not divisible by 16"], now=T0)
    assert status["phase"] == "Failed"
    valid = cond(status, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "96 is not divisible by 16" in valid["message"]
    assert [(e.type, e.reason) for e in events] == [("Warning", "InvalidSpec")]
    again, events = invalid_status(status, ["spec.batch.ppoMiniBatchSize: 96 is not divisible by 16"], now=T1)
    assert again == status and events == []
    RLJobStatus.model_validate(status)


def test_valid_condition_is_kept_through_rayjob_updates() -> None:
    s0 = valid_condition({}, now=T0)
    s1, _ = next_status(s0, rayjob("Running", "RUNNING"), now=T1)
    assert cond(s1, "Valid") == {
        "type": "Valid",
        "status": "True",
        "reason": "SpecValid",
        "message": "the spec passed validation",
        "lastTransitionTime": T0,
    }
    assert [c["type"] for c in s1["conditions"]] == ["Valid", "Created", "Running", "Suspended", "Succeeded", "Failed"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("AppFailed", "AppFailed"),
        ("APP_FAILED", "AppFailed"),
        ("", "Unknown"),
        ("deadline exceeded", "DeadlineExceeded"),
    ],
)
def test_condition_reasons_are_camel_case(text: str, reason: str) -> None:
    assert camel_reason(text) == reason


def test_a_refusals_event_keeps_its_head_within_the_apiservers_bytes_not_characters() -> None:
    plan = "RLJob does not fit one H100-80GB: maxTokenLenPerGPU: 19456 fits\n" + "  1 × H100-80GB\n" * 100
    assert len(plan) < 2000 and len(plan.encode()) > len(plan)  # "×" takes two bytes
    _, events = invalid_status({}, [plan], now=T0)
    (event,) = events
    assert len(event.message.encode()) <= EVENT_MESSAGE_BYTES
    assert event.message.startswith("RLJob does not fit one H100-80GB: maxTokenLenPerGPU: 19456 fits")
    assert event.message.endswith("(cut; the RLJob's conditions have all of it)")
