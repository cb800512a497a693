"""The operator's reads and writes: create-or-adopt the children, propagate spec changes, write status.

Everything here reads the current state from the apiserver and writes what the pure functions (`rayjob.py`,
`status.py`) say; nothing is remembered between calls, so the operator can be killed at any point and restarted.

- Children are created by name; a 409 reads the existing object and accepts it only if its controller owner
  reference carries this RLJob's uid (a leftover of a deleted RLJob of the same name is waited for: the
  garbage collector removes it).
- Status writes are JSON merge patches of `.status` carrying `metadata.resourceVersion`, so two writers (the
  RLJob handlers and the RayJob watch) cannot overwrite each other with stale data: a 409 re-reads both objects
  and recomputes. The trainer's `status.progress` is never part of the patch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from kuberl.api.contract import (
    GROUP,
    PLURAL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_PLURAL,
    RLJOB_LABEL,
    ROLLOUT_POOL,
    SPEC_HASH_ANNOTATION,
    VERSION,
    sandbox_name,
    timestamp,
)
from kuberl.api.policy import Policy, operator_issues
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import TERMINAL_PHASES, ConditionType, FailureClass, Phase
from kuberl.api.validation import validate_document
from kuberl.operator import metrics, rollout_pool, sandbox
from kuberl.operator.checkpoint_folders import shared_folder_issue
from kuberl.operator.diagnosis import RAY_CLUSTER_LABEL, RAY_GROUP_LABEL
from kuberl.operator.rayjob import (
    NO_CLUSTER_STATES,
    RenderError,
    configmap_name,
    guarded,
    rayjob_update_ops,
    render_checkpoint_claim,
    render_configmap,
    render_networkpolicy,
    render_rayjob,
)
from kuberl.operator.status import (
    Event,
    ended_by_operator,
    get_condition,
    invalid_status,
    next_status,
    reported_failure,
    set_condition,
    sort_conditions,
    status_patch,
    valid_condition,
)

STATUS_WRITE_ATTEMPTS = 8
RAYCLUSTER_PLURAL = "rayclusters"  # KubeRay's RayCluster (ray.io/v1), which it builds from the RayJob
TRANSIENT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}

log = logging.getLogger("kuberl.operator")
_T = TypeVar("_T")


class Api:
    """The clients the operator uses, sharing one connection pool, and the chart's security settings (`trust`)
    that every RLJob it creates children for is held to."""

    def __init__(self, api_client: client.ApiClient | None = None, trust: Policy | None = None) -> None:
        self.client = api_client or client.ApiClient()
        self.custom = client.CustomObjectsApi(self.client)
        self.core = client.CoreV1Api(self.client)
        self.networking = client.NetworkingV1Api(self.client)
        self.apps = client.AppsV1Api(self.client)
        self.trust = trust or Policy()

    # the NetworkPolicy (created once, never updated)
    def create_networkpolicy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._plain(
            self.networking.create_namespaced_network_policy(namespace, cast(client.V1NetworkPolicy, body))
        )

    def get_networkpolicy(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(lambda: self._plain(self.networking.read_namespaced_network_policy(name, namespace)))

    # the sandbox pools (operator/sandbox.py): Deployments and Services, created once; replicas follow the job
    def create_deployment(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._plain(self.apps.create_namespaced_deployment(namespace, cast(client.V1Deployment, body)))

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(lambda: self._plain(self.apps.read_namespaced_deployment(name, namespace)))

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment(name, namespace, {"spec": {"replicas": replicas}})

    def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._plain(self.core.create_namespaced_service(namespace, cast(client.V1Service, body)))

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(lambda: self._plain(self.core.read_namespaced_service(name, namespace)))

    # the RayCluster KubeRay built for the RayJob: its rollout group is resized in place (rollout_pool.py)
    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(
            lambda: _obj(
                self.custom.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYCLUSTER_PLURAL, name)
            )
        )

    def json_patch_raycluster(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return _obj(
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                namespace,
                RAYCLUSTER_PLURAL,
                name,
                ops,
                _content_type="application/json-patch+json",
            )
        )

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._plain(
            self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        )["items"]
        return items

    # RLJobs
    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(
            lambda: _obj(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        )

    def patch_rljob_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _obj(
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, body, _content_type="application/merge-patch+json"
            )
        )

    def list_rljobs(self, namespace: str | None) -> list[dict[str, Any]]:
        """The RLJobs of one namespace, or of the whole cluster (None)."""
        if namespace is None:
            listing = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            listing = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        items: list[dict[str, Any]] = _obj(listing)["items"]
        return items

    # RayJobs
    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(
            lambda: _obj(
                self.custom.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name)
            )
        )

    def create_rayjob(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return _obj(self.custom.create_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, body))

    def delete_rayjob(self, namespace: str, name: str) -> None:
        """Delete the RayJob (its Ray cluster goes with it); gone already is fine."""
        _none_on_404(
            lambda: self.custom.delete_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name, propagation_policy="Background"
            )
        )

    def json_patch_rayjob(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return _obj(
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name, ops, _content_type="application/json-patch+json"
            )
        )

    # ConfigMaps
    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(lambda: self._plain(self.core.read_namespaced_config_map(name, namespace)))

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        # the client serializes a plain dict body as is; its stubs ask for a V1ConfigMap
        return self._plain(self.core.create_namespaced_config_map(namespace, cast(client.V1ConfigMap, body)))

    def patch_configmap(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.core.patch_namespaced_config_map(name, namespace, body)

    # PersistentVolumeClaims (checkpoint storage)
    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _none_on_404(lambda: self._plain(self.core.read_namespaced_persistent_volume_claim(name, namespace)))

    def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._plain(
            self.core.create_namespaced_persistent_volume_claim(namespace, cast(client.V1PersistentVolumeClaim, body))
        )

    def _plain(self, model: object) -> dict[str, Any]:
        return _obj(self.client.sanitize_for_serialization(model))


def _obj(value: object) -> dict[str, Any]:
    """The custom-objects client returns `object`; what it returns is the decoded JSON object."""
    return cast(dict[str, Any], value)


def _none_on_404(call: Callable[[], _T]) -> _T | None:
    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS or exc.status == 0
    return isinstance(exc, (HTTPError, ConnectionError, TimeoutError))


def api_error_text(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}: {(exc.body or '')[:500]}"
    return f"{type(exc).__name__}: {exc}"


def controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref["uid"])
    return None


def post_events(rljob: dict[str, Any], events: list[Event]) -> None:
    for event in events:
        try:
            kopf.event(cast(kopf.Body, rljob), type=event.type, reason=event.reason, message=event.message)
        except LookupError:  # outside a running operator (unit tests, scripts): log only
            log.info("event %s %s: %s", event.type, event.reason, event.message)


# --- children ----------------------------------------------------------------------


def _adopt_or_refuse(kind: str, existing: dict[str, Any], uid: str) -> None:
    owner = controller_uid(existing)
    name = existing["metadata"]["name"]
    if owner == uid:
        return
    if owner is not None and any(r.get("kind") == "RLJob" for r in existing["metadata"].get("ownerReferences") or []):
        # an RLJob of the same name was deleted and recreated; the garbage collector has not removed its child yet
        raise kopf.TemporaryError(
            f"{kind} {name} still belongs to a deleted RLJob (uid {owner}); waiting for the "
            "garbage collector to remove it",
            delay=5,
        )
    raise kopf.PermanentError(
        f"{kind} {name} already exists and is not owned by this RLJob; delete it or rename the RLJob"
    )


def create_or_read(
    kind: str,
    desired: dict[str, Any],
    create: Callable[[str, dict[str, Any]], dict[str, Any]],
    read: Callable[[str, str], dict[str, Any] | None],
) -> tuple[dict[str, Any], bool]:
    """Create `desired`; on 409 read the object that is there. (object, created)."""
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    try:
        return create(namespace, desired), True
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = read(namespace, name)
    if existing is None:
        raise kopf.TemporaryError(f"{kind} {name} vanished after a conflict; retrying", delay=1)
    return existing, False


def ensure_configmap(api: Api, desired: dict[str, Any], uid: str, *, update: bool) -> dict[str, Any]:
    """The spec ConfigMap, created if missing; an existing one is rewritten only with `update`: together with the
    RayJob whose pods read it (`spec_follows`), never under a running Ray cluster."""
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    existing, created = create_or_read("ConfigMap", desired, api.create_configmap, api.get_configmap)
    if created:
        return existing
    _adopt_or_refuse("ConfigMap", existing, uid)
    if update and existing.get("data") != desired["data"]:
        api.patch_configmap(
            namespace, name, {"metadata": {"annotations": desired["metadata"]["annotations"]}, "data": desired["data"]}
        )
    return existing


def spec_follows(rayjob: dict[str, Any] | None) -> bool:
    """Whether the spec ConfigMap may change now: the RayJob is created with it, or has no Ray cluster and gets the
    new template in the same update (`rayjob_update_ops`). A running cluster, and a retry KubeRay starts from the
    same RayJob, read the spec it started with."""
    return rayjob is None or ((rayjob.get("status") or {}).get("jobDeploymentStatus") or "") in NO_CLUSTER_STATES


def ensure_networkpolicy(api: Api, networkpolicy: dict[str, Any], uid: str) -> None:
    """RLJob's NetworkPolicy, created once and never updated; an existing one is accepted only if it is ours (the
    Ray token Secret is KubeRay's, one per Ray cluster)."""
    existing, created = create_or_read("NetworkPolicy", networkpolicy, api.create_networkpolicy, api.get_networkpolicy)
    if not created:
        _adopt_or_refuse("NetworkPolicy", existing, uid)


def ensure_sandboxes(api: Api, body: kopf.Body | dict[str, Any], unrenderable: Refusal) -> None:
    """Create-or-adopt the sandbox pools' Deployments, Services and NetworkPolicies (operator/sandbox.py), and give
    their Deployments the replicas the job's state asks for: none while suspended or finished."""
    meta = body["metadata"]
    spec = RLJobSpec.model_validate(_plain(body["spec"]))
    try:
        objects = sandbox.render_pools(meta["name"], meta["namespace"], meta["uid"], spec, stopped=pools_stopped(body))
    except RenderError as exc:
        unrenderable(api, body, [str(exc)])
    if not objects:
        return
    calls = {
        "Deployment": (api.create_deployment, api.get_deployment),
        "Service": (api.create_service, api.get_service),
        "NetworkPolicy": (api.create_networkpolicy, api.get_networkpolicy),
    }
    for desired in objects:
        kind = desired["kind"]
        existing, created = create_or_read(kind, desired, *calls[kind])
        if created:
            continue
        _adopt_or_refuse(kind, existing, meta["uid"])
        wanted = desired["spec"].get("replicas")
        if kind == "Deployment" and (existing.get("spec") or {}).get("replicas") != wanted:
            api.scale_deployment(meta["namespace"], desired["metadata"]["name"], wanted)


def pools_stopped(body: kopf.Body | dict[str, Any]) -> bool:
    """Whether the sandbox pools should have no pods: the job is suspended or has finished."""
    return suspend_of(body.get("spec")) or (body.get("status") or {}).get("phase") in TERMINAL_PHASES


def sandboxes_outlive_job(body: kopf.Body | dict[str, Any]) -> bool:
    """The job has finished but status.sandboxes still shows pods asked for (the RLJob watch's filter)."""
    status = body.get("status") or {}
    return status.get("phase") in TERMINAL_PHASES and any(p.get("replicas") for p in status.get("sandboxes") or [])


def stop_sandboxes(api: Api, body: kopf.Body | dict[str, Any]) -> None:
    """Scale a finished job's pools to no pods (their Deployments stay, owned by the RLJob, until it is deleted)."""
    meta = body["metadata"]
    for entry in (body.get("status") or {}).get("sandboxes") or []:
        deployment = api.get_deployment(meta["namespace"], sandbox_name(meta["name"], entry["pool"]))
        if deployment is not None and controller_uid(deployment) == meta["uid"]:
            api.scale_deployment(meta["namespace"], deployment["metadata"]["name"], 0)


def on_sandbox_deployment(api: Api, deployment: dict[str, Any]) -> None:
    """A sandbox pool's Deployment changed: recompute its owner's status.sandboxes and SandboxReady."""
    meta = deployment.get("metadata") or {}
    owner = next(
        (r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") == "RLJob"), None
    )
    rljob = api.get_rljob(meta["namespace"], owner["name"]) if owner else None
    if owner is None or rljob is None or rljob["metadata"]["uid"] != owner["uid"]:
        return
    name, namespace = rljob["metadata"]["name"], meta["namespace"]
    spec = RLJobSpec.model_validate(rljob["spec"])
    deployments = {role: api.get_deployment(namespace, sandbox_name(name, role)) for role, _ in sandbox.pools(spec)}

    def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        return sandbox.pools_status(old, name, spec, deployments, timestamp()), []

    write_status(api, namespace, name, compute, uid=owner["uid"], rljob=rljob, rayjob=None)


def ensure_claim(api: Api, desired: dict[str, Any] | None) -> None:
    """The checkpoint claim `<name>-checkpoints`, created if missing. One left by an earlier RLJob of the same
    name (retention Retain) is reused: its checkpoints carry that job's uid, and the trainer refuses to resume
    from them unless trainer.resume names one."""
    if desired is None:
        return
    existing, created = create_or_read("PersistentVolumeClaim", desired, api.create_claim, api.get_claim)
    if created:
        return
    name = desired["metadata"]["name"]
    rljob = desired["metadata"]["labels"][RLJOB_LABEL]
    if (existing["metadata"].get("labels") or {}).get(RLJOB_LABEL) != rljob:
        raise kopf.PermanentError(
            f"PersistentVolumeClaim {name} already exists and was not created for RLJob {rljob}; name it in "
            "storage.claimName to keep checkpoints there, or delete it"
        )


def ensure_rayjob(api: Api, desired: dict[str, Any], uid: str) -> tuple[dict[str, Any], bool]:
    """The RayJob, created if missing; (object, created)."""
    existing, created = create_or_read("RayJob", desired, api.create_rayjob, api.get_rayjob)
    if not created:
        _adopt_or_refuse("RayJob", existing, uid)
    return existing, created


# --- status ------------------------------------------------------------------------


StatusFn = Callable[[dict[str, Any], dict[str, Any] | None], tuple[dict[str, Any], list[Event]]]


_UNSET: Any = object()


def write_status(
    api: Api,
    namespace: str,
    name: str,
    compute: StatusFn,
    *,
    uid: str | None = None,
    rljob: dict[str, Any] | None = None,
    rayjob: dict[str, Any] | None = _UNSET,
) -> dict[str, Any] | None:
    """Read the RLJob and its RayJob, compute the new status, merge-patch it under the read resourceVersion.

    `compute(old_status, rayjob_or_None) -> (new_status, events)`. `rljob`/`rayjob`, when given, are used for
    the first attempt instead of reading them (a caller that just read or wrote them); a conflict re-reads both.
    Returns the patched RLJob (None when it is gone or being deleted).
    """
    for attempt in range(STATUS_WRITE_ATTEMPTS):  # a conflict re-reads and recomputes at once; kopf retries after
        if attempt or rljob is None:
            rljob = api.get_rljob(namespace, name)
        if rljob is None or rljob["metadata"].get("deletionTimestamp"):
            return None
        if uid is not None and rljob["metadata"]["uid"] != uid:
            return None  # a newer RLJob of the same name: not ours to write
        if attempt or rayjob is _UNSET:
            rayjob = api.get_rayjob(namespace, name)
        if rayjob is not None and controller_uid(rayjob) != rljob["metadata"]["uid"]:
            rayjob = None
        old = rljob.get("status") or {}
        new, events = compute(old, rayjob)
        patch = status_patch(old, new)
        if not patch:
            if rayjob is not None and ended_by_operator(new):  # an earlier delete failed: redone by the resync
                api.delete_rayjob(namespace, name)
            return rljob
        body = {"metadata": {"resourceVersion": rljob["metadata"]["resourceVersion"]}, "status": patch}
        try:
            patched = api.patch_rljob_status(namespace, name, body)
        except ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                return None
            raise
        post_events(rljob, events)
        if rayjob is not None and ended_by_operator(new):  # written Failed first: the deletion cannot reopen it
            api.delete_rayjob(namespace, name)
        restarts = int(new.get("restarts") or 0) - int(old.get("restarts") or 0)
        if restarts > 0:
            metrics.RESTARTS.inc(restarts)
        return patched
    raise kopf.TemporaryError(f"status of {namespace}/{name} kept conflicting; retrying", delay=2)


def sync_status(
    api: Api,
    namespace: str,
    name: str,
    *,
    generation: int | None = None,
    valid: bool = False,
    uid: str | None = None,
    rljob: dict[str, Any] | None = None,
    rayjob: dict[str, Any] | None = _UNSET,
) -> dict[str, Any] | None:
    """Status from the RayJob (and, with `valid`, Valid=True for `generation`)."""

    def compute(old: dict[str, Any], rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        base = valid_condition(old, generation=generation) if valid else old
        return next_status(base, rayjob, generation=generation)

    return write_status(api, namespace, name, compute, uid=uid, rljob=rljob, rayjob=rayjob)


def refuse(api: Api, body: kopf.Body | dict[str, Any], messages: list[str], reason: str = "InvalidSpec") -> NoReturn:
    """Mark the RLJob Failed with Valid=False and stop handling it (kopf.PermanentError)."""
    meta = body["metadata"]
    generation = meta.get("generation")

    def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        return invalid_status(old, messages, reason=reason, generation=generation)

    write_status(api, meta["namespace"], meta["name"], compute, uid=meta.get("uid"))
    raise kopf.PermanentError("; ".join(messages))


def mark_invalid_update(api: Api, body: kopf.Body | dict[str, Any], messages: list[str]) -> NoReturn:
    """A live job whose spec (an update, or the stored one after an operator upgrade) fails validation:
    Valid=False and a Warning Event; the job keeps running with what it has."""
    meta = body["metadata"]
    message = "; ".join(messages)

    def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        new = {k: v for k, v in old.items() if k != "kopf"}
        conditions = list(new.get("conditions") or [])
        set_condition(
            conditions,
            "Valid",
            False,
            "InvalidSpec",
            f"not applied to the running job: {message}",
            timestamp(),
            meta.get("generation"),
        )
        new["conditions"] = sort_conditions(conditions)
        return new, [Event("Warning", "InvalidSpec", f"spec not applied to the running job: {message}")]

    write_status(api, meta["namespace"], meta["name"], compute, uid=meta.get("uid"))
    raise kopf.PermanentError(message)


# --- the reconcile steps the handlers call -----------------------------------------


def spec_issues(body: kopf.Body | dict[str, Any]) -> list[str]:
    doc = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": body["metadata"]["name"]},
        "spec": dict(body.get("spec") or {}),
    }
    return [str(issue) for issue in validate_document(_plain(doc))]


def _plain(value: Any) -> Any:
    """kopf's Body/Spec views → plain dicts and lists (pydantic and CEL want real mappings)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


Refusal = Callable[[Api, "kopf.Body | dict[str, Any]", list[str]], NoReturn]


def desired_children(
    api: Api, body: kopf.Body | dict[str, Any], invalid: Refusal, unrenderable: Refusal
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Validate the RLJob, render its ConfigMap, RayJob, NetworkPolicy and checkpoint claim, and make all but the
    claim its children (the claim is owned only with storage.retention Delete); (configmap, rayjob, networkpolicy,
    claim or None).

    A spec that fails the rules, the operator's own checks (`operator_issues`: the chart's trust settings and the
    free-form pod fields) or takes another RLJob's checkpoint folder (`shared_folder_issue`) goes to `invalid`, one
    the renderer cannot turn into a RayJob to `unrenderable` (`refuse` or `mark_invalid_update`: neither returns).
    """
    meta = body["metadata"]
    issues = spec_issues(body)
    if issues:
        invalid(api, body, issues)
    spec = RLJobSpec.model_validate(_plain(body["spec"]))
    refused = [str(issue) for issue in operator_issues(spec, api.trust)]
    shared = shared_folder_issue(_plain(body), spec, lambda: api.list_rljobs(meta["namespace"]))
    if refused or shared:
        invalid(api, body, refused + ([shared] if shared else []))
    try:
        configmap = render_configmap(meta["name"], meta["namespace"], meta["uid"], spec)
        rayjob = render_rayjob(meta["name"], meta["namespace"], meta["uid"], spec, api.trust)
        networkpolicy = render_networkpolicy(meta["name"], meta["namespace"], meta["uid"], spec, api.trust)
    except RenderError as exc:
        unrenderable(api, body, [str(exc)])
    # also copies the RLJob's labels (e.g. a Kueue queue label)
    kopf.adopt([configmap, rayjob, networkpolicy], owner=_plain(body))
    claim = render_checkpoint_claim(meta["name"], meta["namespace"], meta["uid"], spec)
    return configmap, rayjob, networkpolicy, claim


def ensure(api: Api, body: kopf.Body | dict[str, Any], logger: kopf.Logger = log) -> None:
    """Create-or-adopt the ConfigMap and the RayJob of a valid RLJob and write its status (create/resume)."""
    meta = body["metadata"]
    name, namespace, uid, generation = meta["name"], meta["namespace"], meta["uid"], meta.get("generation")
    phase = (body.get("status") or {}).get("phase")
    if phase in TERMINAL_PHASES:
        logger.debug("RLJob is %s; nothing to do", phase)
        return
    # already running (e.g. admitted under an older rule set, seen again after an operator upgrade):
    # flag it, keep following its RayJob, do not fail a live job
    live = bool((body.get("status") or {}).get("rayJobName"))
    if live and rayjob_gone(api, body):
        return
    configmap, rayjob, networkpolicy, claim = desired_children(
        api, body, mark_invalid_update if live else refuse, refuse
    )
    try:
        ensure_networkpolicy(api, networkpolicy, uid)
        ensure_sandboxes(api, body, mark_invalid_update if live else refuse)
        ensure_claim(api, claim)
        ensure_configmap(api, configmap, uid, update=api.get_rayjob(namespace, name) is None)
        existing, created = ensure_rayjob(api, rayjob, uid)
    except ApiException as exc:
        if transient(exc):
            raise kopf.TemporaryError(f"API error while creating children: {api_error_text(exc)}", delay=2) from exc
        if exc.status == 404:  # the namespace is going away, or ray.io/v1 RayJob is not served (KubeRay missing)
            raise kopf.TemporaryError(
                f"cannot create children (404): is KubeRay's RayJob CRD (ray.io/v1) installed? {api_error_text(exc)}",
                delay=30,
            ) from exc
        if exc.status == 403:  # the operator's RBAC, not the user's spec: keep retrying, loudly
            raise kopf.TemporaryError(
                f"forbidden to create children; check the operator's RBAC (docs/operator.md): {api_error_text(exc)}",
                delay=60,
            ) from exc
        if exc.status in (400, 422):
            refuse(api, body, [f"the apiserver refused a child object: {api_error_text(exc)}"], reason="CreateFailed")
        raise
    if created:
        logger.info("created RayJob %s and ConfigMap %s", name, configmap_name(name))
    sync_status(api, namespace, name, generation=generation, valid=True, uid=uid, rljob=_plain(body), rayjob=existing)


def rayjob_gone(api: Api, body: kopf.Body | dict[str, Any]) -> bool:
    """Whether the RayJob of a live RLJob (one whose RayJob was created) is gone; if so, the job is ended Failed
    (`RayJobDeleted`), as the RayJob watch does when the operator sees the deletion. Never re-created: a RayJob
    deleted while the operator was down would otherwise come back as a new, silently restarted job."""
    meta = body["metadata"]
    rayjob = api.get_rayjob(meta["namespace"], meta["name"])
    if rayjob is not None and controller_uid(rayjob) == meta["uid"]:
        return False
    sync_status(api, meta["namespace"], meta["name"], uid=meta["uid"], rljob=_plain(body), rayjob=None)
    return True


def suspend_of(spec: Any) -> bool:
    """runPolicy.suspend of a spec (as kopf passes `old`/`new` to a `field="spec"` update handler)."""
    return bool(((spec or {}).get("runPolicy") or {}).get("suspend", False))


def apply_update(
    api: Api, body: kopf.Body | dict[str, Any], old_spec: Any, new_spec: Any, logger: kopf.Logger = log
) -> None:
    """Propagate a spec change: runPolicy.suspend always, the spec ConfigMap and the rest of the RayJob only while
    the RayJob has no Ray cluster (suspended or not started): a running cluster is never rebuilt under the trainer,
    and its pods (and KubeRay's retries of it) never read a spec other than the one it was started with."""
    meta = body["metadata"]
    name, namespace, uid, generation = meta["name"], meta["namespace"], meta["uid"], meta.get("generation")
    phase = (body.get("status") or {}).get("phase")
    if phase in TERMINAL_PHASES:
        logger.info("RLJob is %s; the spec change is not applied", phase)
        return
    if (body.get("status") or {}).get("rayJobName") and rayjob_gone(api, body):
        return
    configmap, desired, _, claim = desired_children(api, body, mark_invalid_update, mark_invalid_update)
    suspend_changed = suspend_of(old_spec) != suspend_of(new_spec)
    try:
        ensure_sandboxes(api, body, mark_invalid_update)
        ensure_claim(api, claim)
        ensure_configmap(api, configmap, uid, update=spec_follows(api.get_rayjob(namespace, name)))
        for attempt in range(4):
            existing = api.get_rayjob(namespace, name)
            if existing is None:
                existing, _ = ensure_rayjob(api, desired, uid)
            else:
                _adopt_or_refuse("RayJob", existing, uid)
            ops = rayjob_update_ops(existing, desired, suspend_changed=suspend_changed)
            if not ops:
                break
            try:
                api.json_patch_rayjob(namespace, name, ops)
            except ApiException as exc:  # the resourceVersion test failed: someone changed it; re-read
                if exc.status in (409, 422) and attempt < 3:
                    continue
                raise
            logger.info("patched RayJob %s: %s", name, ", ".join(op["path"] for op in ops if op["op"] != "test"))
            break
    except ApiException as exc:
        if transient(exc):
            raise kopf.TemporaryError(f"API error while updating children: {api_error_text(exc)}", delay=2) from exc
        raise
    synced = sync_status(api, namespace, name, generation=generation, valid=True, uid=uid)
    if synced is not None:
        follow_rollout_pool(api, synced)


def on_rayjob(api: Api, rayjob: dict[str, Any], *, deleted: bool = False) -> None:
    """A watched RayJob changed: recompute its owner's status.

    The RayJob from the watch event is used as is for the first attempt (deleted: None); the RLJob is read. Until
    the create handler has written the first status, an event changes nothing: written here too, the first status
    took two writes (this one racing the handler's, which adds Valid) instead of one.
    kopf does not retry event handlers: a write that fails here is redone by the next resync (`ownership.resync_all`).
    """
    meta = rayjob.get("metadata") or {}
    owner = next(
        (r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") == "RLJob"), None
    )
    if owner is None:
        return

    def compute(old: dict[str, Any], rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        if not old.get("rayJobName"):  # the create handler writes the first status (with Valid) itself: one write
            return old, []
        return next_status(old, rayjob)

    rljob = write_status(
        api, meta["namespace"], owner["name"], compute, uid=owner["uid"], rayjob=None if deleted else rayjob
    )
    if rljob is not None:
        follow_rollout_pool(api, rljob)


# --- the elastic rollout pool (rollout_pool.py) -------------------------------------------------------------------


def rollout_status_stale(body: kopf.Body | dict[str, Any]) -> bool:
    """status.rollout or RolloutPoolEmpty disagrees with the phase and the Ray cluster (the RLJob watch's filter): a
    phase written after the pool's last look (by the resync, say) gets one more look."""
    status = body.get("status") or {}
    if not status.get("rayClusterName"):
        return "rollout" in status
    if ((body.get("spec") or {}).get("rollout") or {}).get("placement") != "separate":
        return False
    if status.get("phase") in TERMINAL_PHASES:
        return False
    flagged = get_condition(_plain(status), ConditionType.ROLLOUT_POOL_EMPTY) is not None
    return "rollout" not in status or flagged != (status.get("phase") == Phase.RUNNING)


def on_rollout_pod(api: Api, pod: dict[str, Any]) -> None:
    """A pod of a rollout group changed (created, ready, deleted): the owning RLJob's pool follows."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    rljob = api.get_rljob(meta["namespace"], labels[RLJOB_LABEL])
    if rljob is not None and (rljob.get("status") or {}).get("rayClusterName") == labels.get(RAY_CLUSTER_LABEL):
        follow_rollout_pool(api, rljob)


def follow_rollout_pool(api: Api, body: kopf.Body | dict[str, Any]) -> None:
    """Resize the running Ray cluster's rollout group to cluster.rollout.nodes and write status.rollout and the
    condition RolloutPoolEmpty (with the resize's Event); a job without a separate pool is left alone."""
    rljob = _plain(body)
    meta, status = rljob["metadata"], rljob.get("status") or {}
    try:
        spec = RLJobSpec.model_validate(rljob["spec"])
    except ValidationError:  # refused (status Valid=False): nothing to resize
        return
    if spec.rollout.placement != "separate" and "rollout" not in status:
        return
    cluster_name = status.get("rayClusterName")
    raycluster: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = []
    if spec.cluster.rollout is not None and cluster_name and status.get("phase") not in TERMINAL_PHASES:
        raycluster, pods = _resize_rollout_group(api, rljob, cluster_name, spec.cluster.rollout.nodes)
    pool = rollout_pool.pool_status(raycluster, pods)
    timeout = spec.run_policy.empty_rollout_pool_timeout_seconds

    def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
        return rollout_pool.rollout_status(old, pool, timeout, timestamp())

    write_status(api, meta["namespace"], meta["name"], compute, uid=meta["uid"], rljob=rljob, rayjob=None)


def _resize_rollout_group(
    api: Api, rljob: dict[str, Any], cluster_name: str, replicas: int
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Patch the RayCluster's rollout group to `replicas` pods (rollout_pool.resize_ops) unless it is there already,
    with an Event on the RLJob when its size changed: (the RayCluster, None when it is not the RLJob's; the group's
    pods as read before the patch)."""
    namespace, name = rljob["metadata"]["namespace"], rljob["metadata"]["name"]
    selector = f"{RAY_CLUSTER_LABEL}={cluster_name},{RAY_GROUP_LABEL}={ROLLOUT_POOL}"
    for attempt in range(4):
        raycluster = api.get_raycluster(namespace, cluster_name)
        if raycluster is None or (raycluster["metadata"].get("labels") or {}).get(RLJOB_LABEL) != name:
            return None, []
        pods = api.list_pods(namespace, selector)
        ops = rollout_pool.resize_ops(raycluster, replicas, pods)
        if not ops:
            return raycluster, pods
        before = rollout_pool.group_replicas(raycluster) or 0
        try:
            raycluster = api.json_patch_raycluster(namespace, cluster_name, guarded(raycluster, ops))
        except ApiException as exc:  # the resourceVersion test failed: KubeRay or another writer changed it
            if exc.status in (409, 422) and attempt < 3:
                continue
            raise
        if before != replicas:  # posted here: the status write that follows may find the pool written already
            metrics.ROLLOUT_RESIZES.labels("up" if replicas > before else "down").inc()
            post_events(rljob, [rollout_pool.resize_event(raycluster, before)])
        return raycluster, pods
    raise kopf.TemporaryError(f"RayCluster {namespace}/{cluster_name} kept changing; retrying the resize", delay=2)


def permanent_failure_unhandled(body: kopf.Body | dict[str, Any]) -> bool:
    """The trainer reported a permanent failure and the job has not ended yet (the RLJob watch's filter)."""
    status = body.get("status") or {}
    failure = reported_failure(_plain(status))
    return (
        failure is not None
        and failure.get("kind") == FailureClass.PERMANENT
        and status.get("phase") not in TERMINAL_PHASES
        and bool(status.get("rayJobName"))
    )


def on_failure_reported(api: Api, body: kopf.Body | dict[str, Any]) -> None:
    """End the job at once on the trainer's permanent failure (next_status), before KubeRay starts a retry."""
    meta = body["metadata"]
    sync_status(api, meta["namespace"], meta["name"], uid=meta["uid"], rljob=_plain(body))


__all__ = [
    "SPEC_HASH_ANNOTATION",
    "Api",
    "apply_update",
    "ensure",
    "ensure_configmap",
    "ensure_rayjob",
    "on_rayjob",
    "refuse",
    "sync_status",
    "write_status",
]
