"""What the children of an RLJob look like: a ConfigMap with the spec and a KubeRay RayJob running the trainer.

Pure functions of (name, namespace, uid, spec): no kopf, no cluster. The handlers create what these return.
The RayJob is named exactly like the RLJob (the API's `name-fits-kuberay` rule keeps names within KubeRay's
47-character limit); the ConfigMap is `<name>-spec`.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from kuberl.api.contract import (
    API_VERSION,
    CHECKPOINT_MOUNT,
    DASHBOARD_PORT,
    ENV_REPORT_STATUS,
    ENV_RLJOB_NAMESPACE,
    ENV_RLJOB_UID,
    HEAD_POOL,
    KIND,
    POOL_LABEL,
    QUEUE_LABEL,
    RAY_AUTH_ENV,
    RAY_AUTH_MODE_TOKEN,
    RAY_JOB_STOP_WAIT_ENV,
    RAYJOB_API_VERSION,
    RAYJOB_KIND,
    RLJOB_LABEL,
    ROLLOUT_POOL,
    SPEC_DIR,
    SPEC_FILE,
    SPEC_HASH_ANNOTATION,
    TRAINER_POOL,
    entrypoint,
    prestop_command,
)
from kuberl.api.policy import CHECKPOINT_VOLUME, SHM_PATH, SHM_VOLUME, SPEC_VOLUME, Policy
from kuberl.api.spec import HeadNode, NodePool, PodSettings, PoolPodSettings, RLJobSpec, Toleration, backoff_limit
from kuberl.api.validation import spec_to_wire
from kuberl.operator.rollout_pool import group_index, size_ops

# Ports KubeRay would add by default (constant.go), declared so that Services and PodMonitors can name them.
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", DASHBOARD_PORT), ("client", 10001), ("metrics", 8080))
WORKER_PORTS = (("metrics", 8080),)

# Environment of every Ray pod that makes NCCL jobs fail fast and loud rather than hang:
NCCL_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_DEBUG", "WARN"),  # errors and warnings from NCCL in the pod log, not the INFO flood
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),  # a failed collective aborts the process instead of hanging
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),  # flight-recorder dump when a collective times out
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),  # keep compute/communication kernels in issue order (FSDP overlap)
    ("NCCL_CUMEM_ENABLE", "0"),  # cuMem allocations break vLLM sleep/wake and IPC weight sharing
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),  # less fragmentation between rollout and training
    ("RAY_DEDUP_LOGS", "0"),  # every rank's log line, so a failing rank is visible
)


class RenderError(ValueError):
    """The spec cannot be turned into a RayJob (checks the operator makes first: kuberl.api.policy)."""


def spec_json(spec: RLJobSpec, name: str, uid: str) -> str:
    """The spec as the trainer of RLJob `name` (uid `uid`) reads it from /etc/kuberl/spec.json: camelCase,
    defaults filled in, a relative checkpointDir resolved in the job's folder on the checkpoint claim."""
    return json.dumps(spec_to_wire(pod_view(spec, name, uid)), indent=2, sort_keys=True)


def job_folder(name: str, uid: str) -> str:
    """The RLJob's own folder on the checkpoint claim, `<mount>/<name>-<uid>`: a relative trainer.checkpointDir
    lies under it, so two RLJobs on one claim, or an RLJob deleted and created again under its name, never share a
    checkpoint folder unless an absolute checkpointDir says so."""
    return posixpath.join(CHECKPOINT_MOUNT, f"{name}-{uid}")


def pod_view(spec: RLJobSpec, name: str, uid: str) -> RLJobSpec:
    """The spec as seen inside the pods: with a storage claim, a relative trainer.checkpointDir lies in
    `job_folder` (the API's `checkpoint-dir-on-claim` rule keeps absolute ones on the claim already)."""
    directory = spec.trainer.checkpoint_dir
    if claim_name_of(spec) is None or posixpath.isabs(directory):
        return spec
    trainer = spec.trainer.model_copy(update={"checkpoint_dir": posixpath.join(job_folder(name, uid), directory)})
    return spec.model_copy(update={"trainer": trainer})


def checkpoint_claim_name(name: str) -> str:
    return f"{name}-checkpoints"


def claim_name_of(spec: RLJobSpec, name: str = "") -> str | None:
    """The claim the checkpoints live on: storage.claimName, the created `<name>-checkpoints`, or None."""
    if spec.storage.claim_name:
        return spec.storage.claim_name
    return checkpoint_claim_name(name) if spec.storage.claim is not None else None


def render_checkpoint_claim(name: str, namespace: str, uid: str, spec: RLJobSpec) -> dict[str, Any] | None:
    """The PersistentVolumeClaim `<name>-checkpoints` of storage.claim (None without one). Owned by the RLJob only
    with retention Delete: with Retain (the default) it outlives the job, so a trained model is never collected."""
    template = spec.storage.claim
    if template is None:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": [template.access_mode],
        "resources": {"requests": {"storage": template.size}},
    }
    if template.storage_class_name:
        claim_spec["storageClassName"] = template.storage_class_name
    metadata: dict[str, Any] = {
        "name": checkpoint_claim_name(name),
        "namespace": namespace,
        "labels": common_labels(name, "checkpoints"),
    }
    if spec.storage.retention == "Delete":
        metadata["ownerReferences"] = [owner_reference(name, uid)]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": claim_spec}


def spec_hash(spec: RLJobSpec, name: str, uid: str) -> str:
    return hashlib.sha256(spec_json(spec, name, uid).encode()).hexdigest()[:16]


def configmap_name(name: str) -> str:
    return f"{name}-spec"


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def common_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kuberl",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "kuberl",
        "app.kubernetes.io/managed-by": "kuberl-operator",
        RLJOB_LABEL: name,
    }


def render_configmap(name: str, namespace: str, uid: str, spec: RLJobSpec) -> dict[str, Any]:
    """The ConfigMap `<name>-spec` holding the spec as JSON; mounted read-only at /etc/kuberl in every Ray pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(name),
            "namespace": namespace,
            "labels": common_labels(name, "spec"),
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec, name, uid)},
            "ownerReferences": [owner_reference(name, uid)],
        },
        "data": {SPEC_FILE: spec_json(spec, name, uid)},
    }


def render_rayjob(name: str, namespace: str, uid: str, spec: RLJobSpec, trust: Policy | None = None) -> dict[str, Any]:
    """The RayJob that runs the trainer for RLJob `namespace/name` (uid: the RLJob's, for the owner reference).

    Every pod template (head, workers, submitter) passes Pod Security `restricted` (`secure_pod`); the Ray cluster
    requires a token (KubeRay's `authOptions`, which gives every Ray container and the submitter the token of a
    Secret it creates per Ray cluster); `trust` is the chart's security settings.
    """
    trust = trust or Policy()
    cluster = spec.cluster
    policy = spec.run_policy
    labels = common_labels(name, "rayjob")
    if cluster.queue_name:
        labels[QUEUE_LABEL] = cluster.queue_name
    workers = [_worker_group(TRAINER_POOL, cluster.trainer, name, spec)]
    try:
        rollout_pool = spec.rollout_pool
    except ValueError as exc:  # the API's placement rule refuses this; keep the error readable anyway
        raise RenderError(str(exc)) from None
    if rollout_pool is not None:
        workers.append(_worker_group(ROLLOUT_POOL, rollout_pool, name, spec))
    rayjob_spec: dict[str, Any] = {
        "entrypoint": entrypoint(name, namespace),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": policy.ttl_seconds_after_finished,
        "backoffLimit": backoff_limit(spec),
        "suspend": policy.suspend,
        "rayClusterSpec": {
            "rayVersion": cluster.ray_version,
            "authOptions": {"mode": RAY_AUTH_MODE_TOKEN},
            "headGroupSpec": _head_group(name, namespace, uid, spec),
            "workerGroupSpecs": workers,
        },
    }
    if policy.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = policy.active_deadline_seconds
    if cluster.managed_by is not None:
        rayjob_spec["managedBy"] = cluster.managed_by
    rayjob_spec["submitterPodTemplate"] = _submitter(name, spec)
    for template in pod_templates(rayjob_spec):
        secure_pod(template["spec"], spec, trust)
    return {
        "apiVersion": RAYJOB_API_VERSION,
        "kind": RAYJOB_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec, name, uid)},
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": rayjob_spec,
    }


# --- pieces ------------------------------------------------------------------------


def _tolerations(tolerations: list[Toleration]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tolerations]


def _env(spec: RLJobSpec, extra: tuple[tuple[str, str], ...] = ()) -> list[dict[str, Any]]:
    """NCCL_ENV, then `extra` (the contract's variables for this pod), cluster.network's variables, then the user's
    cluster.env."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in (*NCCL_ENV, *extra, *_network_env(spec))]
    # The user's variables win: a user may override any of ours (e.g. NCCL_DEBUG=INFO when debugging).
    user = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in spec.cluster.env]
    overridden = {u["name"] for u in user}
    return [e for e in env if e["name"] not in overridden] + user


def _network_env(spec: RLJobSpec) -> list[tuple[str, str]]:
    """cluster.network as NCCL's and Gloo's variables (docs/api.md says what each prevents)."""
    network = spec.cluster.network
    env: list[tuple[str, str]] = []
    if network.socket_interface:
        env += [("NCCL_SOCKET_IFNAME", network.socket_interface), ("GLOO_SOCKET_IFNAME", network.socket_interface)]
    if network.ib_hca:
        env.append(("NCCL_IB_HCA", network.ib_hca))
    if network.disable_ib:
        env.append(("NCCL_IB_DISABLE", "1"))
    return env


def _volumes(name: str, shm_size: str, spec: RLJobSpec) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": SPEC_VOLUME, "configMap": {"name": configmap_name(name)}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
    ]
    claim = claim_name_of(spec, name)
    if claim is not None:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    return volumes


def _user_volumes(spec: RLJobSpec) -> list[dict[str, Any]]:
    return [v.model_dump(mode="json", by_alias=True, exclude_none=True) for v in spec.cluster.volumes]


def _mounts(spec: RLJobSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": SPEC_VOLUME, "mountPath": SPEC_DIR, "readOnly": True},
        {"name": SHM_VOLUME, "mountPath": SHM_PATH},
    ]
    if claim_name_of(spec) is not None:  # one path on the head and every worker: the driver and all ranks agree
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT})
    for m in spec.cluster.volume_mounts:
        mount: dict[str, Any] = {"name": m.name, "mountPath": m.mount_path}
        if m.read_only:
            mount["readOnly"] = True
        if m.sub_path:
            mount["subPath"] = m.sub_path
        mounts.append(mount)
    return mounts


def _pod_metadata(labels: dict[str, str], settings: PodSettings) -> dict[str, Any]:
    """The user's labels and annotations, then ours (the rules table refuses kuberl.io/ and ray.io/ keys)."""
    metadata: dict[str, Any] = {"labels": {**settings.labels, **labels}}
    if settings.annotations:
        metadata["annotations"] = dict(settings.annotations)
    return metadata


def _resources(cpu: str, memory: str, settings: PodSettings, limits_only: dict[str, Any]) -> dict[str, Any]:
    """Requests = limits for cpu, memory and extended resources (Kubernetes requires it for the latter)."""
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory, **settings.extra_resources}
    return {"requests": requests, "limits": {**requests, **limits_only}}


def _pod_spec(
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    spec: RLJobSpec,
    node_selector: dict[str, str],
    tolerations: list[Toleration],
    affinity: dict[str, Any] | None,
    settings: PodSettings,
) -> dict[str, Any]:
    if settings.env_from:
        for container in containers:
            container["envFrom"] = [dict(source) for source in settings.env_from]
    # the rest of a step plus a checkpoint save: the preStop hooks (`_lifecycle`) and the trainer's SIGTERM use it
    pod: dict[str, Any] = {
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
    }
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    priority_class = settings.priority_class_name or spec.cluster.priority_class_name
    if priority_class:
        pod["priorityClassName"] = priority_class
    if settings.scheduler_name:
        pod["schedulerName"] = settings.scheduler_name
    if settings.runtime_class_name:
        pod["runtimeClassName"] = settings.runtime_class_name
    if isinstance(settings, PoolPodSettings) and settings.host_network:
        # the node's resolver would not know cluster names; the operator's trust check allowed it (trust.py)
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod["tolerations"] = _tolerations(tolerations)
    if affinity:
        pod["affinity"] = affinity
    return pod


def _ports(ports: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": p} for n, p in ports]


def _lifecycle(role: str, spec: RLJobSpec) -> dict[str, Any]:
    """The preStop hook of a Ray container. KubeRay suspends (and Kueue preempts) a RayJob by deleting its Ray
    cluster and stops no Ray job itself: the head's hook stops the job through the head's dashboard (the trainer's
    driver gets SIGTERM, finishes its step and saves) and waits until it is over; a worker's keeps its raylet, and
    the ranks' actors on it, up meanwhile. Both end within the pod's grace period."""
    grace = spec.run_policy.termination_grace_period_seconds
    return {"preStop": {"exec": {"command": prestop_command(role, grace)}}}


def _head_group(name: str, namespace: str, uid: str, spec: RLJobSpec) -> dict[str, Any]:
    head: HeadNode = spec.cluster.head
    ports: tuple[tuple[str, int], ...] = HEAD_PORTS
    if spec.trainer.metrics_port:
        ports = (*HEAD_PORTS, ("trainer-metrics", spec.trainer.metrics_port))
    env = (
        (ENV_REPORT_STATUS, "1"),
        (ENV_RLJOB_NAMESPACE, namespace),
        (ENV_RLJOB_UID, uid),
        # Ray's job supervisor gives a stopped driver this long before SIGKILL (3 s by default): time for a save
        (RAY_JOB_STOP_WAIT_ENV, str(spec.run_policy.termination_grace_period_seconds)),
    )
    container = {
        "name": "ray-head",
        "image": spec.cluster.image,
        "imagePullPolicy": spec.cluster.image_pull_policy,
        # the trainer's driver runs here and patches rljobs/status.progress (service account RBAC: docs/operator.md)
        "env": _env(spec, extra=env),
        "resources": _resources(head.cpu, head.memory, head.pod, {}),
        "ports": _ports(ports),
        "volumeMounts": _mounts(spec),
        "lifecycle": _lifecycle("head", spec),
    }
    return {
        # num-cpus 0: Ray schedules no actors on the head; it runs the single controller (the job driver) only
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
        "template": {
            "metadata": _pod_metadata({**common_labels(name, "ray-head"), POOL_LABEL: HEAD_POOL}, head.pod),
            "spec": _pod_spec(
                [container],
                _volumes(name, head.memory, spec) + _user_volumes(spec),
                spec,
                head.node_selector,
                head.tolerations,
                head.affinity,
                head.pod,
            ),
        },
    }


def _worker_group(group: str, pool: NodePool, name: str, spec: RLJobSpec) -> dict[str, Any]:
    gpus: dict[str, Any] = {"nvidia.com/gpu": pool.gpus_per_node} if spec.cluster.device == "cuda" else {}
    container = {
        "name": "ray-worker",
        "image": spec.cluster.image,
        "imagePullPolicy": spec.cluster.image_pull_policy,
        "env": _env(spec),
        "resources": _resources(pool.cpu, pool.memory, pool.pod, gpus),
        "ports": _ports(WORKER_PORTS),
        "volumeMounts": _mounts(spec),
        "lifecycle": _lifecycle("worker", spec),
    }
    return {
        "groupName": group,
        "replicas": pool.nodes,
        "minReplicas": pool.nodes,
        "maxReplicas": pool.nodes,
        "numOfHosts": 1,
        "rayStartParams": {},
        # Ray node labels: the trainer selects its pools by them (kuberl.trainer.plan.layout)
        "labels": {POOL_LABEL: group},
        "template": {
            "metadata": _pod_metadata({**common_labels(name, f"ray-{group}"), POOL_LABEL: group}, pool.pod),
            "spec": _pod_spec(
                [container],
                _volumes(name, pool.shared_memory, spec) + _user_volumes(spec),
                spec,
                pool.node_selector,
                pool.tolerations,
                pool.affinity,
                pool.pod,
            ),
        },
    }


# --- security: restricted pods, Ray token variables, NetworkPolicy -----------------


def pod_templates(rayjob_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of a rendered RayJob spec: head, worker groups, submitter."""
    cluster = rayjob_spec["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    if "submitterPodTemplate" in rayjob_spec:
        templates.append(rayjob_spec["submitterPodTemplate"])
    return templates


def secure_pod(pod: dict[str, Any], spec: RLJobSpec, trust: Policy) -> None:
    """Make `pod` pass Pod Security `restricted` and leave its Ray token variables to KubeRay (in place).

    The trainer account runs the pods unless the spec names an allowed one (the operator checks `trust` before
    rendering). fsGroup makes a checkpoint claim writable by the image's user. KubeRay sets the token variables only
    where a container has none, so the user's own are dropped: cluster.env cannot switch authentication off.
    """
    pod["serviceAccountName"] = spec.cluster.service_account_name or trust.trainer_service_account
    context: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if trust.run_as_user is not None:
        context["runAsUser"] = trust.run_as_user
        context["runAsGroup"] = trust.run_as_user
    if trust.fs_group is not None:
        context["fsGroup"] = trust.fs_group
        context["fsGroupChangePolicy"] = "OnRootMismatch"  # a large checkpoint claim is not re-chowned per start
    pod["securityContext"] = context
    for container in pod["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        if "env" in container:
            container["env"] = [e for e in container["env"] if e["name"] not in RAY_AUTH_ENV]


def _submitter(name: str, spec: RLJobSpec) -> dict[str, Any]:
    """KubeRay's submitter pod (`ray job submit` against the head's dashboard), rendered so that it is restricted
    (KubeRay fills in the command when the container has none, and the token variables)."""
    return {
        "metadata": {"labels": common_labels(name, "ray-submitter")},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": spec.cluster.image,
                    "imagePullPolicy": spec.cluster.image_pull_policy,
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
        },
    }


def networkpolicy_name(name: str) -> str:
    return f"{name}-ray"


def render_networkpolicy(name: str, namespace: str, uid: str, spec: RLJobSpec, trust: Policy) -> dict[str, Any]:
    """Ingress to the RLJob's Ray pods: any port from the job's own pods, the dashboard from KubeRay's operator
    (it submits and polls the job), the metrics ports from the monitoring namespace when the chart names one."""
    own = {"podSelector": {"matchLabels": {RLJOB_LABEL: name}}}
    ingress: list[dict[str, Any]] = [
        {"from": [own]},
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": trust.kuberay_namespace}}}],
            "ports": [{"protocol": "TCP", "port": port} for n, port in HEAD_PORTS if n == "dashboard"],
        },
    ]
    if trust.monitoring_namespace:
        metrics = [port for n, port in HEAD_PORTS if n == "metrics"]
        if spec.trainer.metrics_port:
            metrics.append(spec.trainer.metrics_port)
        ingress.append(
            {
                "from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": trust.monitoring_namespace}}}
                ],
                "ports": [{"protocol": "TCP", "port": port} for port in metrics],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": networkpolicy_name(name),
            "namespace": namespace,
            "labels": common_labels(name, "network-policy"),
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": {"podSelector": {"matchLabels": {RLJOB_LABEL: name}}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


# --- updates -----------------------------------------------------------------------

# RayJob spec fields the operator renders, other than `suspend`: rebuilt only while no Ray cluster exists.
TEMPLATE_FIELDS = (
    "entrypoint",
    "rayClusterSpec",
    "backoffLimit",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "shutdownAfterJobFinishes",
    "submitterPodTemplate",
)
NO_CLUSTER_STATES = ("", "New", "Suspended")


def rayjob_update_ops(
    existing: dict[str, Any], desired: dict[str, Any], *, suspend_changed: bool
) -> list[dict[str, Any]]:
    """JSON-patch ops that bring the live RayJob towards `desired` after an RLJob spec update.

    - `spec.suspend` follows runPolicy.suspend only when the user changed it: otherwise Kueue may own the flag.
    - The cluster template and the other rendered fields change only while the RayJob has no Ray cluster
      (suspended, or not started): KubeRay builds the next cluster from them; a running one is left alone, but for
      the size of the rollout group (cluster.rollout.nodes), which the next cluster (a retry) takes too: the running
      one is resized through its RayCluster (`rollout_pool.py`).
    - The Kueue queue label follows cluster.queueName under the same condition (Kueue refuses it otherwise).
    The ops start with a `test` of the resourceVersion read, so a concurrent change makes the patch fail (409/422)
    instead of acting on stale state.
    """
    ops: list[dict[str, Any]] = []
    live = existing.get("spec") or {}
    want = desired["spec"]
    suspend_after = want["suspend"] if suspend_changed else bool(live.get("suspend"))
    if suspend_changed and bool(live.get("suspend")) != want["suspend"]:
        ops.append({"op": "add", "path": "/spec/suspend", "value": want["suspend"]})
    jds = (existing.get("status") or {}).get("jobDeploymentStatus") or ""
    if jds not in NO_CLUSTER_STATES:
        wanted = want["rayClusterSpec"]["workerGroupSpecs"]
        index = group_index(wanted)
        if index is not None:
            groups = (live.get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
            ops += size_ops(groups, "/spec/rayClusterSpec/workerGroupSpecs", wanted[index]["replicas"])
        return guarded(existing, ops)
    for key in TEMPLATE_FIELDS:
        if key in want and live.get(key) != want[key]:
            ops.append({"op": "add", "path": f"/spec/{key}", "value": want[key]})
        elif key not in want and key in live:
            ops.append({"op": "remove", "path": f"/spec/{key}"})
    labels = (existing.get("metadata") or {}).get("labels") or {}
    queue = desired["metadata"]["labels"].get(QUEUE_LABEL)
    if labels.get(QUEUE_LABEL) != queue and (suspend_after or jds in NO_CLUSTER_STATES):
        path = "/metadata/labels/" + QUEUE_LABEL.replace("~", "~0").replace("/", "~1")
        if queue is None:
            ops.append({"op": "remove", "path": path})
        else:
            if not labels:
                ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
            ops.append({"op": "add", "path": path, "value": queue})
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    want_hash = desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    if (
        any(op["path"].startswith("/spec/") and op["path"] != "/spec/suspend" for op in ops)
        and annotations.get(SPEC_HASH_ANNOTATION) != want_hash
    ):
        if not annotations:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        ops.append(
            {
                "op": "add",
                "path": "/metadata/annotations/" + SPEC_HASH_ANNOTATION.replace("/", "~1"),
                "value": want_hash,
            }
        )
    return guarded(existing, ops)


def guarded(existing: dict[str, Any], ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ops` led by a test of `existing`'s resourceVersion: the patch fails (409/422) when the object changed since
    it was read."""
    version = (existing.get("metadata") or {}).get("resourceVersion")
    if not ops or version is None:
        return ops
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]
