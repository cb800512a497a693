"""RLJob status from its RayJob: phase, metav1 conditions, times, restarts, and the Events a change deserves.

`next_status(old, rayjob)` is a pure function: the RLJob's stored status (a dict, wire names) and the RayJob as
read from the apiserver (or None when there is none yet) in, the new status and the Events out. Conditions keep
their `lastTransitionTime` unless their `status` changes (metav1 convention); `startTime` is set once, when the
job first runs; `completionTime` when it reaches a terminal phase; `restarts` never decreases.

KubeRay's states (`ray-operator/apis/ray/v1/rayjob_types.go`: `JobDeploymentStatus`, `JobStatus`) map to phases:

| RayJob jobDeploymentStatus              | jobStatus                 | RLJob phase                              |
|-----------------------------------------|---------------------------|------------------------------------------|
| "" / New / Initializing / Waiting       |                           | Pending (Restarting after a failure)     |
| Running                                 | any                       | Running                                  |
| Retrying                                |                           | Restarting                               |
| Suspending / Suspended, or spec.suspend |                           | Suspended                                |
| Complete                                | SUCCEEDED                 | Succeeded                                |
| Complete                                | FAILED / STOPPED          | Failed                                   |
| Failed / ValidationFailed               |                           | Failed (reason: the RayJob's reason)     |
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from kuberl.api.contract import PROGRESS_FIELD, QUEUE_LABEL, timestamp
from kuberl.api.status import TERMINAL_PHASES, ConditionType, FailureClass, Phase

# RayJob .status.jobDeploymentStatus values (KubeRay rayjob_types.go)
JDS_NEW = "New"
JDS_INITIALIZING = "Initializing"
JDS_RUNNING = "Running"
JDS_COMPLETE = "Complete"
JDS_FAILED = "Failed"
JDS_VALIDATION_FAILED = "ValidationFailed"
JDS_SUSPENDING = "Suspending"
JDS_SUSPENDED = "Suspended"
JDS_RETRYING = "Retrying"
JDS_WAITING = "Waiting"

CONDITION_ORDER = (
    ConditionType.VALID,
    ConditionType.CREATED,
    ConditionType.RUNNING,
    ConditionType.SUSPENDED,
    ConditionType.SUCCEEDED,
    ConditionType.FAILED,
)

WARNING_PHASES = frozenset({Phase.FAILED, Phase.RESTARTING})

# Failed condition reasons of a job the operator ended itself; it deletes the RayJob (KubeRay would retry it)
PERMANENT_FAILURE = "PermanentFailure"  # the trainer reported a failure a retry cannot fix (status.progress.failure)
STALL_DEADLINE = "StallDeadlineExceeded"  # no progress for runPolicy.stallDeadlineSeconds
ENDED_BY_OPERATOR = frozenset({PERMANENT_FAILURE, STALL_DEADLINE})


EVENT_MESSAGE_BYTES = 1024
"""The apiserver's bound on an Event's message, in bytes of UTF-8. kopf cuts a message at 1024 characters, so one
with non-ASCII characters (a memory plan's "×") was refused whole (422) and the Event lost."""
EVENT_CUT_NOTE = " … (cut; the RLJob's conditions have all of it)"


def event_message(text: str) -> str:
    """`text` within EVENT_MESSAGE_BYTES: its head (a refusal's verdict and fixes come first) and a note."""
    if len(text.encode()) <= EVENT_MESSAGE_BYTES:
        return text
    room = EVENT_MESSAGE_BYTES - len(EVENT_CUT_NOTE.encode())
    return text.encode()[:room].decode(errors="ignore") + EVENT_CUT_NOTE


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the RLJob; its message bounded as the apiserver bounds it."""

    type: str  # Normal | Warning
    reason: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", event_message(self.message))


def camel_reason(text: str, default: str = "Unknown") -> str:
    """A metav1.Condition reason (^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$) from free text such as `APP_FAILED`."""
    words = re.findall(r"[A-Za-z0-9]+", text or "")
    reason = "".join(w.capitalize() if w.isupper() or w.islower() else w[0].upper() + w[1:] for w in words)
    if not reason:
        return default
    if not reason[0].isalpha():
        reason = default + reason
    return reason[:1024]


def get_condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    conditions: list[dict[str, Any]] = (status or {}).get("conditions") or []
    return next((cond for cond in conditions if cond.get("type") == type_), None)


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: str,
    observed_generation: int | None = None,
) -> None:
    """Upsert a condition in place; lastTransitionTime changes only when `status` changes."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    new: dict[str, Any] = {
        "type": str(type_),
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    for i, cond in enumerate(conditions):
        if cond.get("type") == str(type_):
            if cond.get("status") == value and cond.get("lastTransitionTime"):
                new["lastTransitionTime"] = cond["lastTransitionTime"]
            conditions[i] = new
            return
    conditions.append(new)


def sort_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {str(t): i for i, t in enumerate(CONDITION_ORDER)}
    return sorted(conditions, key=lambda c: order.get(c.get("type", ""), len(order)))


@dataclass(frozen=True)
class Observation:
    """What the RayJob says, reduced to what the RLJob status needs."""

    phase: Phase
    reason: str
    message: str
    restarts: int
    ray_cluster_name: str | None
    dashboard_url: str | None
    end_time: str | None


def observe(rayjob: dict[str, Any]) -> Observation:
    """Map one RayJob (spec + status) to an RLJob phase with a reason and message."""
    spec = rayjob.get("spec") or {}
    st = rayjob.get("status") or {}
    jds = st.get("jobDeploymentStatus") or ""
    job = st.get("jobStatus") or ""
    kuberay_reason = st.get("reason") or ""
    kuberay_message = st.get("message") or ""
    failed = int(st.get("failed") or 0)
    cluster = st.get("rayClusterName") or None
    suspended_by = _suspender(rayjob)

    def detail(default: str) -> str:
        return kuberay_message or default

    if jds in (JDS_FAILED, JDS_VALIDATION_FAILED) or (jds == JDS_COMPLETE and job in ("FAILED", "STOPPED")):
        if jds == JDS_VALIDATION_FAILED:
            reason = "ValidationFailed"
        elif kuberay_reason:
            reason = camel_reason(kuberay_reason)
        else:
            reason = "RayJob" + camel_reason(job or "Failed")
        message = detail(
            f"RayJob {jds or 'Failed'}"
            + (f": {kuberay_reason}" if kuberay_reason else "")
            + (f" (Ray job {job})" if job else "")
        )
        phase = Phase.FAILED
        restarts = max(0, failed - 1)  # the last failure was not retried
    elif jds == JDS_COMPLETE:
        phase, reason, message = Phase.SUCCEEDED, "RayJobSucceeded", detail("the Ray job succeeded")
        restarts = failed
    elif jds in (JDS_SUSPENDING, JDS_SUSPENDED) or (spec.get("suspend") and jds not in (JDS_RUNNING, JDS_INITIALIZING)):
        phase = Phase.SUSPENDED
        reason = "Suspending" if jds == JDS_SUSPENDING else "Suspended"
        message = f"the Ray cluster is {'being deleted' if jds == JDS_SUSPENDING else 'deleted'}; {suspended_by}"
        restarts = failed
    elif spec.get("suspend"):
        # suspend was requested but KubeRay has not acted on it yet (still Running/Initializing)
        phase, reason = Phase.SUSPENDED, "Suspending"
        message = f"waiting for KubeRay to delete the Ray cluster; {suspended_by}"
        restarts = failed
    elif jds == JDS_RETRYING or (failed > 0 and jds in ("", JDS_NEW, JDS_INITIALIZING, JDS_WAITING)):
        phase, reason = Phase.RESTARTING, "Retrying"
        message = (
            f"attempt {failed + 1} after {failed} failure{'s' if failed != 1 else ''}: starting a new Ray cluster"
            + (f" (last failure: {kuberay_reason})" if kuberay_reason else "")
        )
        restarts = failed
    elif jds == JDS_RUNNING:
        phase, reason = Phase.RUNNING, "RayJobRunning"
        message = f"the Ray job is {job or 'being submitted'}" + (f" on {cluster}" if cluster else "")
        restarts = failed
    else:  # "", New, Initializing, Waiting, or a state this version does not know
        phase = Phase.PENDING
        reason = {JDS_INITIALIZING: "Initializing", JDS_WAITING: "Waiting"}.get(
            jds, "RayJobCreated" if not jds else camel_reason(jds)
        )
        message = {
            JDS_INITIALIZING: "waiting for the Ray cluster" + (f" {cluster}" if cluster else "") + " to become ready",
            JDS_WAITING: "waiting for the Ray job to be submitted",
        }.get(jds, "waiting for KubeRay to start the RayJob" if not jds else f"RayJob is {jds}")
        restarts = failed
    return Observation(phase, reason, message, restarts, cluster, st.get("dashboardURL") or None, st.get("endTime"))


def _suspender(rayjob: dict[str, Any]) -> str:
    queue = ((rayjob.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    if queue:
        return f"resume with runPolicy.suspend: false, or wait for Kueue (queue {queue}) to admit it"
    return "resume with runPolicy.suspend: false"


def next_status(
    old: dict[str, Any] | None,
    rayjob: dict[str, Any] | None,
    *,
    now: str | None = None,
    generation: int | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """The RLJob status after observing `rayjob` (None: not created yet), and the Events for what changed.

    A terminal phase is final: later RayJob changes (KubeRay deleting the cluster) do not reopen the job.
    """
    now = now or timestamp()
    old = copy.deepcopy(old or {})
    new = copy.deepcopy(old)
    new.pop("kopf", None)
    conditions: list[dict[str, Any]] = list(new.get("conditions") or [])
    events: list[Event] = []
    old_phase = Phase(old["phase"]) if old.get("phase") in set(Phase) else None
    if generation is not None:
        new["observedGeneration"] = generation

    created = (get_condition(old, ConditionType.CREATED) or {}).get("status") == "True"
    if rayjob is None and created and old_phase not in TERMINAL_PHASES:
        message = (
            f"RayJob {old.get('rayJobName') or ''} was deleted while the job was {old_phase}; "
            "delete and recreate the RLJob to run it again"
        ).replace("RayJob  ", "RayJob ")
        set_condition(conditions, ConditionType.CREATED, False, "RayJobDeleted", message, now, generation)
        set_condition(conditions, ConditionType.RUNNING, False, "RayJobDeleted", message, now, generation)
        set_condition(conditions, ConditionType.FAILED, True, "RayJobDeleted", message, now, generation)
        new.update(phase=str(Phase.FAILED), message=message, conditions=sort_conditions(conditions))
        new.setdefault("completionTime", now)
        return _clean(new), [Event("Warning", str(Phase.FAILED), message)]
    if old_phase in TERMINAL_PHASES or rayjob is None:
        if old_phase is None and rayjob is None:
            new["phase"] = str(Phase.PENDING)
            new["message"] = "creating the RayJob"
        new["conditions"] = sort_conditions(conditions)
        return _clean(new), events
    failure = reported_failure(old)
    if failure is not None and failure.get("kind") == FailureClass.PERMANENT:
        message = (
            f"the trainer failed with {failure.get('error')}: {failure.get('message')}; a retry cannot fix this "
            "(a permanent failure), so the job is not retried and its RayJob is deleted"
        )
        return ended_status(old, PERMANENT_FAILURE, message, now=now, generation=generation)

    obs = observe(rayjob)
    if failure is not None and obs.phase in (Phase.RESTARTING, Phase.FAILED):
        obs = dataclasses.replace(
            obs,
            message=f"{obs.message} (the trainer reported a transient failure: {failure.get('error')}: "
            f"{failure.get('message')})",
        )
    name = (rayjob.get("metadata") or {}).get("name")
    new["rayJobName"] = name
    if obs.ray_cluster_name:
        new["rayClusterName"] = obs.ray_cluster_name
    if obs.dashboard_url:
        new["dashboardURL"] = obs.dashboard_url
    if obs.phase == Phase.SUSPENDED and not obs.ray_cluster_name:  # KubeRay deleted the cluster
        new.pop("rayClusterName", None)
        new.pop("dashboardURL", None)
    new["phase"] = str(obs.phase)
    new["message"] = obs.message
    old_restarts = int(old.get("restarts") or 0)
    new["restarts"] = max(old_restarts, obs.restarts)

    g = generation
    set_condition(conditions, ConditionType.CREATED, True, "RayJobCreated", f"RayJob {name} exists", now, g)
    running = obs.phase == Phase.RUNNING
    set_condition(
        conditions,
        ConditionType.RUNNING,
        running,
        obs.reason if running else _not_running_reason(obs),
        obs.message,
        now,
        g,
    )
    suspended = obs.phase == Phase.SUSPENDED
    set_condition(
        conditions,
        ConditionType.SUSPENDED,
        suspended,
        obs.reason if suspended else "NotSuspended",
        obs.message if suspended else "",
        now,
        g,
    )
    succeeded = obs.phase == Phase.SUCCEEDED
    set_condition(
        conditions,
        ConditionType.SUCCEEDED,
        succeeded,
        obs.reason if succeeded else "NotSucceeded",
        obs.message if succeeded else "",
        now,
        g,
    )
    failed = obs.phase == Phase.FAILED
    set_condition(
        conditions,
        ConditionType.FAILED,
        failed,
        obs.reason if failed else "NotFailed",
        obs.message if failed else "",
        now,
        g,
    )
    new["conditions"] = sort_conditions(conditions)

    if running and not new.get("startTime"):
        new["startTime"] = now
    if obs.phase in TERMINAL_PHASES and not new.get("completionTime"):
        new["completionTime"] = obs.end_time or now

    if new["restarts"] > old_restarts:
        events.append(
            Event(
                "Warning",
                "Restarting",
                f"attempt {new['restarts']} failed; KubeRay retries on a new Ray cluster "
                f"({new['restarts']} restart{'s' if new['restarts'] != 1 else ''} so far)",
            )
        )
    # a new RLJob's first phase, Pending, is no news (its creation is): one Event write per RLJob less
    if obs.phase != old_phase and not (old_phase is None and obs.phase == Phase.PENDING):
        if old_phase == Phase.SUSPENDED and obs.phase != Phase.SUSPENDED:
            events.append(Event("Normal", "Resumed", f"resumed; {obs.message}"))
        if not (obs.phase == Phase.RESTARTING and events and events[-1].reason == "Restarting"):
            events.append(Event("Warning" if obs.phase in WARNING_PHASES else "Normal", str(obs.phase), obs.message))
    return _clean(new), events


def reported_failure(status: dict[str, Any] | None) -> dict[str, Any] | None:
    """The failure the trainer reported for its last attempt (`status.progress.failure`), if any."""
    failure = ((status or {}).get(PROGRESS_FIELD) or {}).get("failure")
    return failure if isinstance(failure, dict) else None


def ended_by_operator(status: dict[str, Any] | None) -> bool:
    """Failed by the operator's own verdict (ENDED_BY_OPERATOR), not by the RayJob's state."""
    failed = get_condition(status, ConditionType.FAILED) or {}
    return (status or {}).get("phase") == Phase.FAILED and failed.get("reason") in ENDED_BY_OPERATOR


def ended_status(
    old: dict[str, Any] | None, reason: str, message: str, *, now: str | None = None, generation: int | None = None
) -> tuple[dict[str, Any], list[Event]]:
    """A job the operator ends itself (ENDED_BY_OPERATOR): Failed with `reason`, restarts as they were, and the
    Warning Event; the caller deletes the RayJob."""
    now = now or timestamp()
    new = copy.deepcopy(old or {})
    new.pop("kopf", None)
    conditions = list(new.get("conditions") or [])
    set_condition(conditions, ConditionType.RUNNING, False, reason, message, now, generation)
    set_condition(conditions, ConditionType.FAILED, True, reason, message, now, generation)
    new.update(phase=str(Phase.FAILED), message=message, conditions=sort_conditions(conditions))
    new.setdefault("completionTime", now)
    if generation is not None:
        new["observedGeneration"] = generation
    return _clean(new), [Event("Warning", reason, message)]


def _not_running_reason(obs: Observation) -> str:
    return {
        Phase.SUCCEEDED: "Completed",
        Phase.FAILED: "Failed",
        Phase.SUSPENDED: "Suspended",
        Phase.RESTARTING: "Restarting",
    }.get(obs.phase, obs.reason)


def invalid_status(
    old: dict[str, Any] | None,
    messages: list[str],
    *,
    reason: str = "InvalidSpec",
    now: str | None = None,
    generation: int | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """Status of an RLJob the operator refuses (it got past admission, e.g. with an older CRD): Failed, Valid=False."""
    now = now or timestamp()
    new = copy.deepcopy(old or {})
    new.pop("kopf", None)
    message = "; ".join(messages)
    conditions = list(new.get("conditions") or [])
    set_condition(conditions, ConditionType.VALID, False, reason, message, now, generation)
    set_condition(conditions, ConditionType.FAILED, True, reason, message, now, generation)
    new["conditions"] = sort_conditions(conditions)
    events = []
    if new.get("phase") != Phase.FAILED or get_condition(old, ConditionType.VALID) != get_condition(
        new, ConditionType.VALID
    ):
        events.append(Event("Warning", reason, message))
    new["phase"] = str(Phase.FAILED)
    new["message"] = message
    new.setdefault("completionTime", now)
    if generation is not None:
        new["observedGeneration"] = generation
    return _clean(new), events


def valid_condition(
    old: dict[str, Any] | None, *, now: str | None = None, generation: int | None = None
) -> dict[str, Any]:
    """`old` with Valid=True set (the spec passed the operator's own validation)."""
    now = now or timestamp()
    new = copy.deepcopy(old or {})
    new.pop("kopf", None)
    conditions = list(new.get("conditions") or [])
    set_condition(conditions, ConditionType.VALID, True, "SpecValid", "the spec passed validation", now, generation)
    new["conditions"] = sort_conditions(conditions)
    return new


def _clean(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v is not None}


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch for `.status` turning `old` into `new` for the fields the operator owns.

    `progress` belongs to the trainer and is never included; `conditions` is replaced as a whole.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key in (PROGRESS_FIELD, "kopf"):
            continue
        if old.get(key) != value:
            patch[key] = value
    for key in old.keys() - new.keys() - {PROGRESS_FIELD, "kopf"}:
        patch[key] = None  # merge patch: null removes the field
    return patch
