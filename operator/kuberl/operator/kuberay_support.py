"""Is the installed KubeRay one kuberl supports (>= 1.5.1)? Checked on the RayJob schema the apiserver publishes.

KubeRay 1.4's RayJob CRD has no `workerGroupSpecs[].labels`: the apiserver prunes the pool label the operator
writes there, and the run fails much later on a cluster without its pools. KubeRay 1.5.0's has no
`rayClusterSpec.authOptions`: the apiserver would prune the token mode and the Ray cluster would accept any caller
(and a 1.5.0 controller cannot send a token to a cluster that requires one). The operator therefore reads the
RayJob schema from OpenAPI v3 discovery (`/openapi/v3/apis/ray.io/v1`, readable by every authenticated user, so no
extra RBAC), and refuses to reconcile while the field is missing: a `KubeRaySupported=False` condition on each
RLJob it would have handled, and `kuberl_operator_kuberay_supported 0`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kuberl.api.contract import timestamp
from kuberl.api.status import ConditionType
from kuberl.operator import metrics
from kuberl.operator.reconcile import Api, write_status
from kuberl.operator.status import Event, get_condition, set_condition, sort_conditions

SUPPORTED = "KubeRay >= 1.5.1"
OPENAPI_PATH = "/openapi/v3/apis/ray.io/v1"
RAYJOB_SCHEMA = "io.ray.v1.RayJob"
INSTALL_HINT = (
    "install or upgrade KubeRay first: helm install kuberay-operator kuberay/kuberay-operator --version 1.6.2 "
    "(https://ray-project.github.io/kuberay-helm/)"
)
UNSUPPORTED_REASON = "KubeRayUnsupported"
RETRY_SECONDS = 60.0


def _child(schema: dict[str, Any] | None, *path: str) -> dict[str, Any] | None:
    for key in path:
        if not isinstance(schema, dict):
            return None
        schema = (schema.get("properties") or {}).get(key) if key != "[]" else schema.get("items")
    return schema if isinstance(schema, dict) else None


def schema_problem(openapi: dict[str, Any] | None) -> str | None:
    """Why the published ray.io/v1 OpenAPI document (None: the group is not served) is not a supported KubeRay."""
    if openapi is None:
        return f"KubeRay's CRDs are not installed (no ray.io/v1 API); kuberl needs {SUPPORTED}: {INSTALL_HINT}"
    rayjob = ((openapi.get("components") or {}).get("schemas") or {}).get(RAYJOB_SCHEMA)
    if rayjob is None:
        return f"the ray.io/v1 API serves no RayJob; kuberl needs {SUPPORTED}: {INSTALL_HINT}"
    group = _child(rayjob, "spec", "rayClusterSpec", "workerGroupSpecs", "[]")
    if group is None or _child(group, "labels") is None:
        return (
            "the installed RayJob CRD has no spec.rayClusterSpec.workerGroupSpecs[].labels, so the apiserver would "
            f"drop the node-pool label kuberl writes there (KubeRay < 1.5); kuberl needs {SUPPORTED}: {INSTALL_HINT}"
        )
    auth = _child(rayjob, "spec", "rayClusterSpec", "authOptions")
    if auth is None or _child(auth, "mode") is None:
        return (
            "the installed RayJob CRD has no spec.rayClusterSpec.authOptions.mode, so the apiserver would drop the "
            f"Ray token kuberl requires and the Ray cluster would accept any caller (KubeRay < 1.5.1); kuberl needs "
            f"{SUPPORTED}: {INSTALL_HINT}"
        )
    return None


def fetch_openapi(api_client: client.ApiClient) -> dict[str, Any] | None:
    """The ray.io/v1 OpenAPI v3 document, or None when the group is not served (404)."""
    method, url, headers, body, post = api_client.param_serialize(
        "GET", OPENAPI_PATH, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
    )
    response = api_client.call_api(method, url, headers, body, post)
    data = response.read()
    if response.status == 404:
        return None
    if response.status != 200:
        raise ApiException(status=response.status, reason=f"GET {OPENAPI_PATH}: {response.reason}")
    document: dict[str, Any] = json.loads(data)
    return document


def check(api_client: client.ApiClient) -> str | None:
    """None when the installed KubeRay is supported, else the message that says what to do."""
    return schema_problem(fetch_openapi(api_client))


def unsupported_status(
    old: dict[str, Any] | None, message: str | None, *, now: str | None = None
) -> tuple[dict[str, Any], list[Event]]:
    """`old` with `KubeRaySupported=False` (message given) or, once it was False, True; a Warning when it turns False."""
    now = now or timestamp()
    new = copy.deepcopy(old or {})
    new.pop("kopf", None)
    previous = get_condition(old, ConditionType.KUBERAY_SUPPORTED)
    if message is None and previous is None:
        return new, []
    conditions: list[dict[str, Any]] = list(new.get("conditions") or [])
    events: list[Event] = []
    if message is not None:
        set_condition(conditions, ConditionType.KUBERAY_SUPPORTED, False, UNSUPPORTED_REASON, message, now)
        new.setdefault("phase", "Pending")
        new["message"] = message
        if previous is None or previous.get("status") != "False":
            events.append(Event("Warning", UNSUPPORTED_REASON, message))
    else:
        set_condition(conditions, ConditionType.KUBERAY_SUPPORTED, True, "KubeRaySupported", SUPPORTED, now)
    new["conditions"] = sort_conditions(conditions)
    return new, events


class Gate:
    """The operator's view of KubeRay support: checked at start, re-checked while unsupported (an upgrade heals)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.problem = self.refresh()

    def refresh(self) -> str | None:
        self.problem = check(self.api.client)
        metrics.KUBERAY_SUPPORTED.set(0 if self.problem else 1)
        return self.problem

    def require(self, body: kopf.Body | dict[str, Any]) -> None:
        """Return when KubeRay is supported (clearing an old False condition); else mark the RLJob and retry later."""
        problem = self.refresh() if self.problem else None
        meta = body["metadata"]
        if problem is None and get_condition(body.get("status"), ConditionType.KUBERAY_SUPPORTED) is None:
            return

        def compute(old: dict[str, Any], _rayjob: dict[str, Any] | None) -> tuple[dict[str, Any], list[Event]]:
            return unsupported_status(old, problem)

        write_status(self.api, meta["namespace"], meta["name"], compute, uid=meta.get("uid"), rayjob=None)
        if problem is not None:
            raise kopf.TemporaryError(problem, delay=RETRY_SECONDS)
