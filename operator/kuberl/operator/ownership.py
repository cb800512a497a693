"""The resync: the operator owns every part of an RLJob's status but `progress`, and says so when it is wrong.

Each resync period, for every RLJob (finished ones included), the status is recomputed from the RayJob and the
operator's own records in the status, and written only where it diverges (so a quiet cluster costs reads, never
writes):

- **Restore.** The chart's ValidatingAdmissionPolicy keeps the trainer to `status.progress`, but a cluster admin
  (or the operator's own identity, misused) can still write the rest. A terminal phase is normally final
  (`status.next_status`), so a forged `Succeeded` would stay; here a finished RLJob whose RayJob still exists
  gets its phase decided again by the RayJob. Only the fields the RayJob decides (phase, RayJob name, the
  lifecycle conditions) count as divergence, so a genuinely finished job is never rewritten. A job the operator
  refused (Failed with Valid=False) and one whose RayJob is gone keep their verdict: nothing to recompute from.
- **Progress watch.** A Running RLJob whose trainer has not written `status.progress.updatedAt` for
  `progress_timeout` seconds (counted from the Running transition when it never did) gets the condition
  `ProgressReported=False` and, on that transition only, one Warning Event `ProgressNotReported` naming the
  service account and the Role the trainer needs. The condition is the record that makes the Event once per
  silence; a later report sets it True.

- **Stall watch.** A Running RLJob whose progress is older than runPolicy.stallTimeoutSeconds gets
  `Stalled=True` and one Warning Event `Stalled`; past runPolicy.stallDeadlineSeconds (optional) it is ended
  Failed (`StallDeadlineExceeded`) and its RayJob deleted. The resync period bounds how late either comes.

Events go through `post_event` (a core/v1 Event, as clusterwatch posts them): kopf's event queue exists only
inside its handlers, and this runs in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from kuberl.api.contract import timestamp
from kuberl.api.spec import DEFAULT_STALL_TIMEOUT_SECONDS
from kuberl.api.status import TERMINAL_PHASES, ConditionType, Phase
from kuberl.operator import metrics
from kuberl.operator.reconcile import Api, ensure, write_status
from kuberl.operator.status import (
    STALL_DEADLINE,
    Event,
    ended_by_operator,
    ended_status,
    get_condition,
    next_status,
    observe,
    set_condition,
    sort_conditions,
)

log = logging.getLogger("kuberl.operator")

PostEvent = Callable[[dict[str, Any], Event], None]

# The conditions the RayJob decides; with phase and rayJobName, what a restore compares.
LIFECYCLE = (
    ConditionType.CREATED,
    ConditionType.RUNNING,
    ConditionType.SUSPENDED,
    ConditionType.SUCCEEDED,
    ConditionType.FAILED,
)


def refused_by_operator(status: dict[str, Any]) -> bool:
    """Failed because the operator refused the spec (`status.invalid_status`) or ended the job itself
    (`status.ended_status`): its verdict, not the RayJob's."""
    valid, failed = get_condition(status, ConditionType.VALID), get_condition(status, ConditionType.FAILED)
    return ended_by_operator(status) or (
        status.get("phase") == Phase.FAILED
        and valid is not None
        and failed is not None
        and valid.get("status") == "False"
        and valid.get("reason") == failed.get("reason")
    )


def _decided(status: dict[str, Any]) -> tuple[Any, ...]:
    """What the RayJob decides. Condition statuses only: an older operator may have worded reasons differently."""
    conditions = tuple((get_condition(status, t) or {}).get("status") for t in LIFECYCLE)
    return status.get("phase"), status.get("rayJobName"), conditions


def owned_status(
    old: dict[str, Any], rayjob: dict[str, Any] | None, *, now: str | None = None
) -> tuple[dict[str, Any], list[Event]]:
    """The status the operator owns, recomputed from `rayjob`; a finished status that the RayJob contradicts is
    restored with a Warning Event `StatusRestored`."""
    phase = old.get("phase")
    if rayjob is None or phase not in TERMINAL_PHASES or refused_by_operator(old):
        return next_status(old, rayjob, now=now)
    base = {k: v for k, v in old.items() if k not in ("phase", "completionTime")}  # the RayJob decides again
    new, _ = next_status(base, rayjob, now=now)
    if _decided(new) == _decided(old):
        return old, []
    name = (rayjob.get("metadata") or {}).get("name")
    message = (
        f"status.phase was {phase} but RayJob {name} is {new['phase']}: restored the status the operator owns "
        "(another identity wrote it; only the trainer may write status.progress, docs/security.md)"
    )
    return new, [Event("Warning", "StatusRestored", message)]


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def progress_status(
    old: dict[str, Any],
    rayjob: dict[str, Any] | None,
    *,
    timeout: float,
    service_account: str,
    namespace: str,
    now: datetime | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """`old` with `ProgressReported` set for a Running job: False (and one Event) once the trainer has been silent
    for `timeout` seconds, True again when it reports."""
    if timeout <= 0 or rayjob is None or old.get("phase") != Phase.RUNNING or observe(rayjob).phase != Phase.RUNNING:
        return old, []
    now = now or datetime.now(UTC)
    reported = _parse((old.get("progress") or {}).get("updatedAt"))
    running = get_condition(old, ConditionType.RUNNING) or {}
    since = reported or _parse(running.get("lastTransitionTime")) or _parse(old.get("startTime"))
    if since is None:
        return old, []
    silent = (now - since).total_seconds()
    current = (get_condition(old, ConditionType.PROGRESS_REPORTED) or {}).get("status")
    conditions = list(old.get("conditions") or [])
    stamp = timestamp()
    if silent > timeout:
        if current == "False":
            return old, []
        last = f"last report {reported.isoformat()}" if reported else "status.progress.updatedAt never set"
        message = (
            f"the trainer has not reported progress for {silent:.0f} s while the Ray job runs ({last}): the Ray pods' "
            f"service account {service_account!r} needs a Role in namespace {namespace!r} that may get and patch "
            "rljobs/status (the chart creates both, the Role as <release>-trainer, in each namespace of its "
            "trainer.namespaces; README, 'Run on a cluster'), or the trainer is stuck (see the Ray head's logs)"
        )
        set_condition(conditions, ConditionType.PROGRESS_REPORTED, False, "ProgressNotReported", message, stamp)
        events = [Event("Warning", "ProgressNotReported", message)]
    elif current == "False" and reported is not None:
        message = f"the trainer reports progress (last report {reported.isoformat()})"
        set_condition(conditions, ConditionType.PROGRESS_REPORTED, True, "ProgressReported", message, stamp)
        events = []
    else:
        return old, []
    return {**old, "conditions": sort_conditions(conditions)}, events


def stall_status(
    old: dict[str, Any], rayjob: dict[str, Any] | None, run_policy: dict[str, Any], *, now: datetime | None = None
) -> tuple[dict[str, Any], list[Event]]:
    """`old` with `Stalled` set from the age of the trainer's progress (`status.progress.updatedAt`, or the Running
    transition of this attempt when that is newer): True and a Warning Event `Stalled` past
    runPolicy.stallTimeoutSeconds, False again on a fresh report or when the job stops running; past
    runPolicy.stallDeadlineSeconds the job is ended Failed (`StallDeadlineExceeded`; write_status deletes the
    RayJob)."""
    current = (get_condition(old, ConditionType.STALLED) or {}).get("status")
    conditions = list(old.get("conditions") or [])
    stamp = timestamp()
    running = rayjob is not None and old.get("phase") == Phase.RUNNING and observe(rayjob).phase == Phase.RUNNING
    if not running:
        if current != "True":
            return old, []
        message = f"the job is {old.get('phase')}"
        set_condition(conditions, ConditionType.STALLED, False, "NotRunning", message, stamp)
        return {**old, "conditions": sort_conditions(conditions)}, []
    now = now or datetime.now(UTC)
    reported = _parse((old.get("progress") or {}).get("updatedAt"))
    started = _parse((get_condition(old, ConditionType.RUNNING) or {}).get("lastTransitionTime"))
    marks = [t for t in (reported, started) if t is not None] or [
        t for t in (_parse(old.get("startTime")),) if t is not None
    ]
    if not marks:
        return old, []
    since = max(marks)
    age = (now - since).total_seconds()
    timeout = int(run_policy.get("stallTimeoutSeconds") or DEFAULT_STALL_TIMEOUT_SECONDS)
    deadline = run_policy.get("stallDeadlineSeconds")
    step = (old.get("progress") or {}).get("step")
    last = f"step {step}, reported {reported.isoformat()}" if reported else "no progress reported in this attempt"
    if deadline is not None and age > int(deadline):
        message = (
            f"no training progress for {age:.0f} s ({last}), past runPolicy.stallDeadlineSeconds = {deadline}: the job "
            "is ended and its RayJob deleted; see the Ray head's logs for where the trainer hangs"
        )
        return ended_status(old, STALL_DEADLINE, message)
    if age > timeout:
        if current == "True":
            return old, []
        message = (
            f"no training progress for {age:.0f} s ({last}), past runPolicy.stallTimeoutSeconds = {timeout}: the "
            "trainer may hang (a reward function, a collective, a full disk); see the Ray head's logs"
        )
        set_condition(conditions, ConditionType.STALLED, True, "NoProgress", message, stamp)
        return {**old, "conditions": sort_conditions(conditions)}, [Event("Warning", "Stalled", message)]
    if current == "True":
        set_condition(
            conditions, ConditionType.STALLED, False, "Progressing", f"the trainer progresses ({last})", stamp
        )
        return {**old, "conditions": sort_conditions(conditions)}, []
    return old, []


CREATE_GRACE_SECONDS = 60.0
"""How long the create handler has to give an RLJob its RayJob before the resync does it instead."""


def resync(api: Api, rljob: dict[str, Any], *, progress_timeout: float, post_event: PostEvent) -> bool:
    """Recompute one RLJob's status (a net for a missed watch event, a forged write, a silent trainer); True when
    it wrote. An RLJob still without its RayJob after CREATE_GRACE_SECONDS gets it here: its create handler was
    lost (seen when an RLJob is deleted and created again under the same name at once: the new object's create
    handler failed temporarily, waiting for the old children's garbage collection, and kopf never ran it again)."""
    meta, status = rljob["metadata"], rljob.get("status") or {}
    if meta.get("deletionTimestamp"):
        return False
    if not status.get("rayJobName") and status.get("phase") not in TERMINAL_PHASES:
        created = _parse(meta.get("creationTimestamp"))
        if created is None or (datetime.now(UTC) - created).total_seconds() < CREATE_GRACE_SECONDS:
            return False  # the create handler is on it; it writes the status itself
        log.warning(
            "RLJob %s/%s has no RayJob %.0f s after creation; creating it",
            meta["namespace"],
            meta["name"],
            (datetime.now(UTC) - created).total_seconds(),
        )
        try:
            ensure(api, rljob)
        except (kopf.TemporaryError, kopf.PermanentError) as exc:  # refused or not yet possible: status says why
            log.warning("RLJob %s/%s: %s", meta["namespace"], meta["name"], exc)
        return True
    cluster = (rljob.get("spec") or {}).get("cluster") or {}
    account = cluster.get("serviceAccountName") or api.trust.trainer_service_account
    events: list[Event] = []

    def compute(old: dict[str, Any], rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        new, owned = owned_status(old, rayjob)
        new, progress = progress_status(
            new, rayjob, timeout=progress_timeout, service_account=account, namespace=meta["namespace"]
        )
        new, stall = stall_status(new, rayjob, (rljob.get("spec") or {}).get("runPolicy") or {})
        events[:] = owned + progress + stall
        return new, []  # posted below, once the write succeeded

    after = write_status(api, meta["namespace"], meta["name"], compute, uid=meta["uid"], rljob=rljob)
    if after is None or after["metadata"]["resourceVersion"] == meta["resourceVersion"]:
        return False
    for event in events:
        log.info("RLJob %s/%s: %s %s", meta["namespace"], meta["name"], event.reason, event.message)
        post_event(after, event)
    return True


def resync_all(api: Api, namespaces: list[str] | None, *, progress_timeout: float, post_event: PostEvent) -> int:
    """`resync` every RLJob of `namespaces` (None: the cluster's); returns how many statuses it wrote.

    Run by the operator's resync thread, not a kopf timer: kopf puts a finalizer on every object a timer serves,
    and deleting an RLJob must never wait for the operator.
    """
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    writes = 0
    for ns in scopes:
        for rljob in api.list_rljobs(ns):
            try:
                writes += resync(api, rljob, progress_timeout=progress_timeout, post_event=post_event)
            except Exception:  # one RLJob's failure (a refused write, a malformed object) must not stop the pass
                meta = rljob.get("metadata") or {}
                log.exception("resync of RLJob %s/%s failed; continuing", meta.get("namespace"), meta.get("name"))
                metrics.RECONCILE_ERRORS.labels("resync").inc()
    return writes
