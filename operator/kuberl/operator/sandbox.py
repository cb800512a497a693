"""What an RLJob's sandbox pools look like: a Deployment, a Service and a NetworkPolicy per pool, and their status.

Pure functions of the RLJob (no kopf, no cluster); `reconcile` creates what these return, owned by the RLJob so
that the garbage collector deletes them with it. A pool (reward.sandbox → `reward`, rollout.agent.sandbox →
`tools`) runs `python -m kuberl.sandbox serve` as pid 1 of pods that pass Pod Security `restricted`, with no
service-account token, a read-only root filesystem and a memory-backed /tmp for the executions; its NetworkPolicy
admits the job's Ray pods to the server's port and allows no egress at all (docs/security.md, "Sandboxes").
"""

from __future__ import annotations

import math
import re
from typing import Any

from kuberl.api.contract import (
    HEAD_POOL,
    POOL_LABEL,
    RLJOB_LABEL,
    ROLLOUT_POOL,
    SANDBOX_LABEL,
    SANDBOX_PORT,
    SANDBOX_REWARD,
    SANDBOX_WORKROOT,
    TRAINER_POOL,
    sandbox_command,
    sandbox_name,
)
from kuberl.api.spec import RLJobSpec, Sandbox
from kuberl.api.status import ConditionType
from kuberl.operator.rayjob import RenderError, common_labels, owner_reference
from kuberl.operator.status import set_condition, sort_conditions

SANDBOX_UID = 65532
"""The uid of sandbox pods: not the Ray pods' (1000), so that RLIMIT_NPROC, which Linux counts per uid on a node,
is not shared with the trainer's processes."""

SERVER_CPU_MILLIS = 250  # the server itself, beyond executionsPerPod × cpuPerExecution
SERVER_MEMORY_MB = 256  # the server's interpreter and its executions' jails, beyond their memory and disk
PROBE_SECONDS = 5  # readiness probe period; a pool is Ready when every replica passed it
_CPU = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m?)$")


def pools(spec: RLJobSpec) -> list[tuple[str, Sandbox]]:
    """(role, sandbox) of every pool the spec asks for."""
    return list(spec.sandbox_pools.items())


def pool_label(role: str) -> str:
    return f"sandbox-{role}"


def field_of(role: str) -> str:
    return "spec.reward.sandbox" if role == SANDBOX_REWARD else "spec.rollout.agent.sandbox"


def render_pools(
    name: str, namespace: str, uid: str, spec: RLJobSpec, *, stopped: bool = False
) -> list[dict[str, Any]]:
    """Every pool's Deployment, Service and NetworkPolicy. `stopped` (suspended or finished): no replicas."""
    objects = []
    for role, sandbox in pools(spec):
        objects += [
            render_deployment(name, namespace, uid, spec, role, sandbox, replicas=0 if stopped else sandbox.replicas),
            render_service(name, namespace, uid, role),
            render_networkpolicy(name, namespace, uid, role),
        ]
    return objects


def _selector(name: str, role: str) -> dict[str, str]:
    return {SANDBOX_LABEL: name, POOL_LABEL: pool_label(role)}


def _metadata(name: str, namespace: str, uid: str, role: str) -> dict[str, Any]:
    return {
        "name": sandbox_name(name, role),
        "namespace": namespace,
        "labels": {**common_labels(name, pool_label(role)), SANDBOX_LABEL: name},
        "ownerReferences": [owner_reference(name, uid)],
    }


def pod_resources(role: str, sandbox: Sandbox) -> dict[str, str]:
    """CPU and memory of one pod: executionsPerPod × (cpuPerExecution; memoryMb + diskMb), plus the server's."""
    match = _CPU.match(sandbox.cpu_per_execution)
    if match is None:
        raise RenderError(
            f"{field_of(role)}.cpuPerExecution {sandbox.cpu_per_execution!r}: write cores (1, 0.5) or millicores (500m)"
        )
    millis = float(match.group(1)) * (1 if match.group(2) else 1000)
    executions = sandbox.executions_per_pod
    limits = sandbox.execution
    cpu = math.ceil(executions * millis) + SERVER_CPU_MILLIS
    memory = executions * (limits.memory_mb + limits.disk_mb) + SERVER_MEMORY_MB
    return {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}


def render_deployment(
    name: str, namespace: str, uid: str, spec: RLJobSpec, role: str, sandbox: Sandbox, *, replicas: int
) -> dict[str, Any]:
    resources = pod_resources(role, sandbox)
    limits_json = sandbox.execution.model_dump_json(by_alias=True)
    workroot_mb = sandbox.executions_per_pod * sandbox.execution.disk_mb + 64
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": PROBE_SECONDS}
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": sandbox.image or spec.cluster.image,
        "imagePullPolicy": spec.cluster.image_pull_policy,
        "command": sandbox_command(sandbox.executions_per_pod, limits_json),
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "HOME", "value": SANDBOX_WORKROOT}],
        "ports": [{"name": "http", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "resources": {"requests": resources, "limits": resources},
        "readinessProbe": probe,
        "livenessProbe": {**probe, "httpGet": {"path": "/healthz", "port": "http"}, "failureThreshold": 6},
        "volumeMounts": [{"name": "workroot", "mountPath": SANDBOX_WORKROOT}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # nothing in the pod may talk to the apiserver
        "enableServiceLinks": False,  # no environment naming the namespace's Services
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # a running execution may finish (its wall clock) before the server stops
        "terminationGracePeriodSeconds": math.ceil(sandbox.execution.wall_seconds) + 5,
        "containers": [container],
        "volumes": [{"name": "workroot", "emptyDir": {"medium": "Memory", "sizeLimit": f"{workroot_mb}Mi"}}],
    }
    if sandbox.runtime_class_name:
        pod["runtimeClassName"] = sandbox.runtime_class_name
    if sandbox.node_selector:
        pod["nodeSelector"] = dict(sandbox.node_selector)
    if sandbox.tolerations:
        pod["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in sandbox.tolerations]
    pull_secrets = spec.cluster.trainer.pod.image_pull_secrets
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": secret} for secret in pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, namespace, uid, role),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _selector(name, role)},
            "template": {
                "metadata": {"labels": {**_selector(name, role), "app.kubernetes.io/name": "kuberl-sandbox"}},
                "spec": pod,
            },
        },
    }


def render_service(name: str, namespace: str, uid: str, role: str) -> dict[str, Any]:
    """The pool's address for the trainer (kuberl.api.contract.sandbox_url)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, namespace, uid, role),
        "spec": {
            "selector": _selector(name, role),
            "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_networkpolicy(name: str, namespace: str, uid: str, role: str) -> dict[str, Any]:
    """Ingress to the server's port from the job's Ray pods (head and workers) only; no egress at all, DNS
    included: a program in the pool reaches neither the apiserver, nor the Ray cluster, nor anything outside."""
    ray_pods = {
        "matchLabels": {RLJOB_LABEL: name},
        "matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [HEAD_POOL, TRAINER_POOL, ROLLOUT_POOL]}],
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(name, namespace, uid, role),
        "spec": {
            "podSelector": {"matchLabels": _selector(name, role)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": ray_pods}], "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]}],
            "egress": [],
        },
    }


# --- status --------------------------------------------------------------------------------------------------------


def pools_status(
    old: dict[str, Any], name: str, spec: RLJobSpec, deployments: dict[str, dict[str, Any] | None], now: str
) -> dict[str, Any]:
    """`status.sandboxes` (each pool's replicas and ready replicas) and the condition SandboxReady from the pools'
    Deployments (`deployments[role]`, None while not created); `old` unchanged without pools."""
    if not pools(spec):
        return old
    entries, waiting = [], []
    for role, sandbox in pools(spec):
        deployment = deployments.get(role) or {}
        wanted = int((deployment.get("spec") or {}).get("replicas", sandbox.replicas))
        ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        entries.append({"pool": role, "replicas": wanted, "readyReplicas": ready})
        if not deployment or ready < wanted:
            waiting.append(f"{sandbox_name(name, role)} {ready}/{wanted}")
    conditions = list(old.get("conditions") or [])
    if waiting:
        message = f"sandbox pods ready: {', '.join(waiting)} (kubectl describe pods -l {SANDBOX_LABEL}={name})"
        set_condition(conditions, ConditionType.SANDBOX_READY, False, "PodsNotReady", message, now)
    elif all(entry["replicas"] == 0 for entry in entries):
        message = "the sandbox pools have no replicas while the job is suspended or finished"
        set_condition(conditions, ConditionType.SANDBOX_READY, False, "ScaledDown", message, now)
    else:
        set_condition(conditions, ConditionType.SANDBOX_READY, True, "PodsReady", "every sandbox pod is ready", now)
    return {**old, "sandboxes": entries, "conditions": sort_conditions(conditions)}
