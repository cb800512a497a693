"""The resync (ownership.py): recompute the status the operator owns, restore a forged one, warn about a silent
trainer once; and never write when nothing diverges."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from kuberl.operator import ownership, reconcile
from kuberl.operator.status import Event
from tests.operator.test_reconcile_idempotence import NS, FakeApi, rljob

RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
SUCCEEDED = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}


class Events(list[tuple[str, Event]]):
    def __call__(self, rljob: dict[str, Any], event: Event) -> None:
        self.append((rljob["metadata"]["name"], event))


def started(api: FakeApi, name: str = "job", rayjob_status: dict[str, Any] | None = None) -> dict[str, Any]:
    """An RLJob the operator created children for, its RayJob in `rayjob_status`, the status caught up."""
    reconcile.ensure(api, rljob(api, name))
    if rayjob_status is not None:
        api.objects[("rayjob", name)]["status"] = dict(rayjob_status)
        reconcile.sync_status(api, NS, name)
    return stored(api, name)


def stored(api: FakeApi, name: str = "job") -> dict[str, Any]:
    return copy.deepcopy(api.objects[("rljob", name)])


def forge(api: FakeApi, name: str, **status: Any) -> None:
    obj = api.objects[("rljob", name)]
    obj["status"].update(status)
    obj["metadata"]["resourceVersion"] += "9"


def resync(api: FakeApi, events: Events, name: str = "job", timeout: float = 0) -> bool:
    return ownership.resync(api, stored(api, name), progress_timeout=timeout, post_event=events)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_a_forged_succeeded_phase_of_a_running_job_is_restored_once_with_a_warning() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=RUNNING)
    forge(api, "job", phase="Succeeded", completionTime="2026-01-01T00:00:00Z")
    assert resync(api, events) is True
    status = stored(api)["status"]
    assert status["phase"] == "Running" and "completionTime" not in status
    assert condition(status, "Running")["status"] == "True" and condition(status, "Succeeded")["status"] == "False"
    ((_, event),) = events
    assert (event.type, event.reason) == ("Warning", "StatusRestored")
    assert "status.phase was Succeeded but RayJob job is Running" in event.message
    assert resync(api, events) is False and len(events) == 1  # nothing diverges any more: no write, no Event


def test_forged_lifecycle_conditions_of_a_finished_job_are_restored() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=SUCCEEDED)
    conditions = copy.deepcopy(stored(api)["status"]["conditions"])
    condition({"conditions": conditions}, "Succeeded")["status"] = "False"
    forge(api, "job", phase="Failed", conditions=conditions)
    assert resync(api, events) is True
    status = stored(api)["status"]
    assert status["phase"] == "Succeeded" and condition(status, "Succeeded")["status"] == "True"


def test_a_genuinely_finished_job_is_never_rewritten() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=SUCCEEDED)
    # KubeRay rewords its message after the job finished: not a divergence the operator owns
    api.objects[("rayjob", "job")]["status"]["message"] = "cluster deleted"
    before = len(api.calls)
    assert resync(api, events) is False
    assert "patch status" not in api.calls[before:] and events == []


def test_a_refused_job_and_a_job_whose_rayjob_is_gone_keep_their_verdict() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=RUNNING)
    del api.objects[("rayjob", "job")]
    assert resync(api, events) is True  # the RayJob was deleted under a running job: Failed, RayJobDeleted
    assert stored(api)["status"]["phase"] == "Failed"
    assert resync(api, events) is False
    refused = {
        "phase": "Failed",
        "conditions": [
            {"type": "Valid", "status": "False", "reason": "Untrusted", "message": "", "lastTransitionTime": "t"},
            {"type": "Failed", "status": "True", "reason": "Untrusted", "message": "", "lastTransitionTime": "t"},
        ],
    }
    assert ownership.owned_status(refused, {"metadata": {"name": "job"}, "status": RUNNING}) == (refused, [])


def test_resync_skips_an_rljob_the_create_handler_has_not_finished() -> None:
    api, events = FakeApi(), Events()
    assert ownership.resync(api, rljob(api), progress_timeout=0, post_event=events) is False
    assert api.calls == []


def test_resync_all_corrects_every_rljob_behind_its_rayjob_and_counts_the_writes() -> None:
    api, events = FakeApi(), Events()
    for name in ("a", "b", "c"):
        started(api, name)
    ownership.resync_all(api, [NS], progress_timeout=0, post_event=events)
    for name in ("a", "b"):
        api.objects[("rayjob", name)]["status"] = dict(RUNNING)
    assert ownership.resync_all(api, [NS], progress_timeout=0, post_event=events) == 2
    assert [stored(api, n)["status"]["phase"] for n in "abc"] == ["Running", "Running", "Pending"]
    assert [(name, e.reason) for name, e in events] == [("a", "Running"), ("b", "Running")]
    assert ownership.resync_all(api, [NS], progress_timeout=0, post_event=events) == 0


def at(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_a_silent_trainer_gets_one_warning_naming_its_account_and_role_then_a_report_clears_it() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=RUNNING)
    assert resync(api, events, timeout=60) is False  # running for a moment only
    running = condition(stored(api)["status"], "Running")
    running["lastTransitionTime"] = at(120)
    forge(api, "job", conditions=[*(c for c in stored(api)["status"]["conditions"] if c["type"] != "Running"), running])
    assert resync(api, events, timeout=60) is True
    ((_, event),) = events
    assert (event.type, event.reason) == ("Warning", "ProgressNotReported")
    assert (
        "'kuberl-trainer'" in event.message
        and "rljobs/status" in event.message
        and "updatedAt never set" in event.message
    )
    assert condition(stored(api)["status"], "ProgressReported")["status"] == "False"
    assert resync(api, events, timeout=60) is False and len(events) == 1  # once, not every resync
    forge(api, "job", progress={"step": 3, "updatedAt": at(1)})
    assert resync(api, events, timeout=60) is True and len(events) == 1
    assert condition(stored(api)["status"], "ProgressReported")["status"] == "True"
    forge(api, "job", progress={"step": 3, "updatedAt": at(300)})  # silent again: a new episode, a new Event
    assert resync(api, events, timeout=60) is True and "last report" in events[-1][1].message


def test_no_progress_check_outside_running_or_when_disabled() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status={"jobDeploymentStatus": "Initializing"})
    forge(api, "job", startTime=at(10_000))
    assert resync(api, events, timeout=60) is False
    started(api, "b", rayjob_status=RUNNING)
    forge(api, "b", progress={"updatedAt": at(10_000)})
    assert resync(api, events, "b", timeout=0) is False and events == []


# --- failures the operator ends (issue 14) -------------------------------------------------------------------------


def report_failure(api: FakeApi, kind: str, name: str = "job") -> None:
    """What the trainer's StatusReporter.report_failure writes."""
    failure = {"kind": kind, "error": "DataError", "message": "row 3: no prompt", "at": "2026-01-01T00:00:00Z"}
    forge(api, name, progress={"step": 2, "failure": failure})


def test_a_permanent_failure_ends_the_job_deletes_the_rayjob_and_stays_ended() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=RUNNING)
    report_failure(api, "Permanent")
    assert resync(api, events) is True
    status = stored(api)["status"]
    assert status["phase"] == "Failed" and status.get("restarts", 0) == 0
    failed = condition(status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "PermanentFailure")
    assert "DataError: row 3: no prompt" in failed["message"]
    assert ("rayjob", "job") not in api.objects
    assert [e.reason for _, e in events] == ["PermanentFailure"]
    api.calls.clear()
    assert resync(api, events) is False
    assert "patch status" not in api.calls


def test_a_transient_failure_leaves_the_retry_to_kuberay_and_names_the_error() -> None:
    api, events = FakeApi(), Events()
    started(api, rayjob_status=RUNNING)
    report_failure(api, "Transient")
    api.objects[("rayjob", "job")]["status"] = {"jobDeploymentStatus": "Retrying", "failed": 1}
    assert resync(api, events) is True
    status = stored(api)["status"]
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert "transient failure: DataError: row 3: no prompt" in status["message"]
    assert ("rayjob", "job") in api.objects


def stalled(status: dict[str, Any], seconds: float, **policy: Any) -> tuple[dict[str, Any], list[Event]]:
    """`stall_status` `seconds` after the trainer's last report."""
    reported = datetime(2026, 1, 1, tzinfo=UTC)
    old = {**status, "progress": {"step": 4, "updatedAt": reported.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    return ownership.stall_status(old, {"status": RUNNING}, policy, now=reported + timedelta(seconds=seconds))


def running_status() -> dict[str, Any]:
    api = FakeApi()
    status = started(api, rayjob_status=RUNNING)["status"]
    for cond in status["conditions"]:
        cond["lastTransitionTime"] = "2025-12-31T00:00:00Z"  # long before the report: the report counts
    return status


def test_progress_older_than_the_stall_timeout_sets_stalled_once_with_a_warning() -> None:
    status = running_status()
    assert stalled(status, 1799) == ({**status, "progress": {"step": 4, "updatedAt": "2026-01-01T00:00:00Z"}}, [])
    new, events = stalled(status, 1801)
    cond = condition(new, "Stalled")
    assert (cond["status"], cond["reason"]) == ("True", "NoProgress")
    assert "step 4" in cond["message"] and "stallTimeoutSeconds = 1800" in cond["message"]
    assert [(e.type, e.reason) for e in events] == [("Warning", "Stalled")]
    again, events = stalled(new, 2500)
    assert events == [] and condition(again, "Stalled") == cond
    fresh, _ = stalled(new, 10)
    assert condition(fresh, "Stalled")["status"] == "False"


def test_the_stall_deadline_ends_the_job() -> None:
    status = running_status()
    new, events = stalled(status, 61, stallTimeoutSeconds=30, stallDeadlineSeconds=60)
    assert new["phase"] == "Failed" and condition(new, "Failed")["reason"] == "StallDeadlineExceeded"
    assert [e.reason for e in events] == ["StallDeadlineExceeded"]


def test_a_job_that_is_not_running_is_not_stalled() -> None:
    status = running_status()
    new, _ = stalled(status, 1801)
    paused = {**new, "phase": "Suspended"}
    cleared, events = ownership.stall_status(paused, {"status": {"jobDeploymentStatus": "Suspended"}}, {})
    assert condition(cleared, "Stalled")["status"] == "False" and events == []


def test_an_rljob_whose_create_handler_was_lost_gets_its_rayjob_from_the_resync() -> None:
    api, events = FakeApi(), Events()
    rljob(api, "young")
    rljob(api, "lost")
    now = datetime.now(UTC)
    api.objects[("rljob", "young")]["metadata"]["creationTimestamp"] = (now - timedelta(seconds=10)).isoformat()
    api.objects[("rljob", "lost")]["metadata"]["creationTimestamp"] = (
        now - timedelta(seconds=ownership.CREATE_GRACE_SECONDS + 5)
    ).isoformat()
    assert resync(api, events, "young") is False and ("rayjob", "young") not in api.objects  # the handler's turn
    assert resync(api, events, "lost") is True
    assert ("rayjob", "lost") in api.objects and stored(api, "lost")["status"]["rayJobName"] == "lost"
