"""The Kubernetes permissions of the operator and of the Ray pods, as data (docs/operator.md prints them).

The operator needs exactly these rules in every namespace it serves (a Role per namespace with `--namespace`,
a ClusterRole bound cluster-wide with `--all-namespaces`). Discovery (`/api`, `/apis`) is open to every
authenticated user by default. With `settings.scanning.disabled` kopf lists no Namespaces and no CRDs.
"""

from __future__ import annotations

from typing import Any

OPERATOR_RULES: list[dict[str, Any]] = [
    # watch RLJobs; patch = kopf's annotations (progress, last-handled-configuration)
    {"apiGroups": ["kuberl.io"], "resources": ["rljobs"], "verbs": ["get", "list", "watch", "patch"]},
    # phase, conditions, restarts, ...
    {"apiGroups": ["kuberl.io"], "resources": ["rljobs/status"], "verbs": ["get", "patch"]},
    # ownerReferences with blockOwnerDeletion: true need this where OwnerReferencesPermissionEnforcement is on
    {"apiGroups": ["kuberl.io"], "resources": ["rljobs/finalizers"], "verbs": ["update"]},
    # create the RayJob, watch all labelled ones, toggle suspend / update the template (JSON patch); delete it when
    # the operator ends the job (a permanent failure, a stall deadline): KubeRay would otherwise retry it
    {
        "apiGroups": ["ray.io"],
        "resources": ["rayjobs"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    # the RayCluster KubeRay builds from the RayJob: its rollout worker group is resized while the job runs
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
    # the spec ConfigMap `<name>-spec`
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    # the NetworkPolicy `<name>-ray` that admits only the job's pods, KubeRay and the monitoring namespace
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create"]},
    # the sandbox pools `<name>-sandbox-<pool>`: a Deployment (scaled to 0 while suspended or finished; its readiness
    # is watched into status.sandboxes) and a Service each (their NetworkPolicies: the rule above)
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create"]},
    # the checkpoint claim `<name>-checkpoints` of storage.claim
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]},
    # Events on RLJobs (kopf posts core/v1 Events); read: the Warning Events on Ray clusters and pods (diagnosis)
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "list", "watch"]},
    # why a Ray cluster is not running: its pods' scheduling and container states (diagnosis), read only
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
]

RAY_POD_RULES: list[dict[str, Any]] = [
    # the trainer (driver on the Ray head) writes status.progress of its own RLJob
    {"apiGroups": ["kuberl.io"], "resources": ["rljobs/status"], "verbs": ["get", "patch"]},
    # and posts Warning Events on it (a damaged checkpoint skipped on resume)
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def role(name: str, namespace: str | None, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """A Role (namespace given) or ClusterRole (namespace None) with `rules`."""
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "kuberl"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": metadata,
        "rules": rules,
    }


def binding(name: str, namespace: str | None, role_name: str, subject: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": metadata,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role" if namespace else "ClusterRole",
            "name": role_name,
        },
        "subjects": [subject],
    }
