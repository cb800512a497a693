"""The operator's own admission, beyond the CRD's rules: the chart's trust policy, the free-form pod fields and
the memory plan.

The CRD cannot know the chart's settings, and its schema cannot type free-form Kubernetes objects (volume sources,
affinity, env sources), so these checks run in the operator before it creates anything (Valid=False naming the
field) and in `kuberl validate` with the same code, so that both give one verdict:

- **trust** (docs/security.md): volume types, the Ray pods' service account and host networking, against `Policy`,
  the chart's `security.*` values. Each message names the chart value that would allow it.
- **pods**: volume names and mount paths the operator uses itself, a checkpoint folder on a pod-local emptyDir, a
  Ray version without token authentication, and the size of the free-form fields.
- **memory**: a job whose plan does not fit the GPU its trainer pool's node selector names (memory_admission.py).

`Policy()` is the chart's defaults (tests/chart pins the two together); `policy_from_values` reads a values file
(`kuberl validate --policy`), `policy_from_arguments` the operator's flags, which is also how
`kuberl validate --cluster` reads the installed operator's policy from its Deployment.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any

from kuberl.api.contract import CHECKPOINT_MOUNT, SPEC_DIR
from kuberl.api.memory_admission import PLAN_FITS_RULE, memory_issues
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import Issue

# Volume sources that read only what the namespace already holds or the pod itself creates.
DEFAULT_VOLUME_TYPES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "projected", "ephemeral")
TRAINER_SERVICE_ACCOUNT = "kuberl-trainer"
RAY_UID = 1000  # the trainer image's user (images/trainer.Dockerfile: `USER 1000`), Ray's convention

# Volumes and mount paths of every Ray pod that the operator adds itself (operator/rayjob.py renders them).
SPEC_VOLUME = "kuberl-spec"
SHM_VOLUME = "kuberl-dshm"
SHM_PATH = "/dev/shm"
CHECKPOINT_VOLUME = "kuberl-checkpoints"
RESERVED_VOLUMES = (SPEC_VOLUME, SHM_VOLUME, CHECKPOINT_VOLUME)
RESERVED_MOUNT_PURPOSE = {SPEC_DIR: "the spec", SHM_PATH: "shared memory", CHECKPOINT_MOUNT: "the checkpoint claim"}

# Ray's token authentication exists from Ray 2.52; KubeRay parses rayVersion as a semantic version and refuses older.
TOKEN_AUTH_MIN_RAY = (2, 52, 0)
SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+][0-9A-Za-z.+-]*)?")

# The free-form fields of one RLJob together (affinities, volume sources, env sources), as JSON. Every typed field
# is bounded by the schema; these are copied into up to three pod templates of the RayJob and kept in the spec
# ConfigMap, so a bound keeps both, and the operator's memory per RLJob, small. Real affinities are a few KiB.
MAX_FREE_FORM_BYTES = 65536

OPERATOR_RULES = {
    "service-account-allowed": "cluster.serviceAccountName other than the trainer account, unless listed in the "
    "chart's security.allowedServiceAccounts",
    "volume-type-allowed": "a volume source other than persistentVolumeClaim, configMap, secret, emptyDir, projected "
    "and ephemeral, unless listed in security.allowedVolumeTypes",
    "host-network-allowed": "pod.hostNetwork of a worker pool, unless security.allowHostNetwork is true",
    "volume-names-not-reserved": f"a volume named {', '.join(RESERVED_VOLUMES)} (the operator's)",
    "mount-paths-not-reserved": f"a mount at {', '.join(RESERVED_MOUNT_PURPOSE)} (the operator's)",
    "checkpoints-not-on-emptydir": "trainer.checkpointDir on an emptyDir volume without a storage claim",
    "ray-version-has-token-auth": "a cluster.rayVersion older than "
    + ".".join(map(str, TOKEN_AUTH_MIN_RAY))
    + " (no token authentication)",
    "free-form-bounded": f"free-form fields (affinities, volume sources, env sources) above {MAX_FREE_FORM_BYTES} "
    "bytes of JSON together",
    "checkpoint-folder-unshared": "an absolute trainer.checkpointDir that another RLJob of the namespace already "
    "uses (checked by the operator only: it needs the other RLJobs)",
    PLAN_FITS_RULE: "a job whose memory plan (kuberl plan) does not fit the GPU the trainer pool's nodeSelector names, "
    "where model.shape gives the model's shape",
}
"""The operator's checks by id, with what each refuses (a trainer on one machine, `kuberl run`, skips them)."""


@dataclass(frozen=True)
class Policy:
    """The chart's security settings as the operator applies them to every RLJob it serves."""

    trainer_service_account: str = TRAINER_SERVICE_ACCOUNT
    allowed_service_accounts: tuple[str, ...] = ()  # besides the trainer account
    allowed_volume_types: tuple[str, ...] = ()  # besides DEFAULT_VOLUME_TYPES (e.g. hostPath, nfs)
    # Pod identity: None leaves the field to the platform (OpenShift's restricted SCC assigns both from a range).
    run_as_user: int | None = RAY_UID
    fs_group: int | None = RAY_UID
    # Who may reach the Ray ports besides the job's own pods: KubeRay's operator (it polls the dashboard) ...
    kuberay_namespace: str = "kuberay-system"
    # ... and who may scrape the metrics ports (None: no one outside the job).
    monitoring_namespace: str | None = None
    # Pools on the node's network (pod.hostNetwork): outside every NetworkPolicy, so off unless the chart allows it.
    allow_host_network: bool = False

    @property
    def volume_types(self) -> tuple[str, ...]:
        return (*DEFAULT_VOLUME_TYPES, *self.allowed_volume_types)

    @property
    def service_accounts(self) -> tuple[str, ...]:
        return (self.trainer_service_account, *self.allowed_service_accounts)


# --- where a Policy comes from: the chart's values, or the operator's flags ------------------------------------


def _platform_or_int(value: Any) -> int | None:
    """A uid/gid value of the chart or a flag: a number, or "platform" to leave it to the platform."""
    return None if value == "platform" else int(value)


def policy_from_values(values: dict[str, Any]) -> Policy:
    """The Policy a chart installed with `values` (a values file, as `helm install -f`) applies; keys it does not
    set keep the chart's defaults."""
    security = values.get("security") or {}
    account = ((values.get("trainer") or {}).get("serviceAccount") or {}).get("name")
    defaults = Policy()
    return Policy(
        trainer_service_account=account or defaults.trainer_service_account,
        allowed_service_accounts=tuple(security.get("allowedServiceAccounts") or ()),
        allowed_volume_types=tuple(security.get("allowedVolumeTypes") or ()),
        run_as_user=_platform_or_int(security.get("podRunAsUser", defaults.run_as_user)),
        fs_group=_platform_or_int(security.get("podFSGroup", defaults.fs_group)),
        kuberay_namespace=security.get("kuberayNamespace") or defaults.kuberay_namespace,
        monitoring_namespace=security.get("monitoringNamespace") or None,
        allow_host_network=bool(security.get("allowHostNetwork", defaults.allow_host_network)),
    )


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's security flags (the chart passes its `security.*` values as these)."""
    security = parser.add_argument_group("security (docs/security.md; the chart's security.* values)")
    security.add_argument(
        "--trainer-service-account", default=TRAINER_SERVICE_ACCOUNT, help="service account of the Ray pods"
    )
    security.add_argument(
        "--allow-service-account",
        action="append",
        default=[],
        metavar="NAME",
        help="another service account spec.cluster.serviceAccountName may name (repeatable)",
    )
    security.add_argument(
        "--allow-volume-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="a volume source beyond claims, configMaps, secrets, emptyDir, projected, ephemeral (repeatable)",
    )
    security.add_argument(
        "--pod-run-as-user", type=_platform_or_int, default=RAY_UID, help='uid/gid of the Ray pods, or "platform"'
    )
    security.add_argument(
        "--pod-fs-group", type=_platform_or_int, default=RAY_UID, help='fsGroup of the Ray pods, or "platform"'
    )
    security.add_argument(
        "--kuberay-namespace", default="kuberay-system", help="namespace of KubeRay's operator (NetworkPolicy)"
    )
    security.add_argument(
        "--monitoring-namespace", default=None, help="namespace allowed to scrape the Ray pods' metrics ports"
    )
    security.add_argument(
        "--allow-host-network",
        action="store_true",
        help="let RLJobs run worker pools on the node's network (cluster.{trainer,rollout}.pod.hostNetwork)",
    )


def policy_from_arguments(args: argparse.Namespace) -> Policy:
    """The Policy of parsed `add_policy_arguments` flags."""
    return Policy(
        trainer_service_account=args.trainer_service_account,
        allowed_service_accounts=tuple(args.allow_service_account),
        allowed_volume_types=tuple(args.allow_volume_type),
        run_as_user=args.pod_run_as_user,
        fs_group=args.pod_fs_group,
        kuberay_namespace=args.kuberay_namespace,
        monitoring_namespace=args.monitoring_namespace,
        allow_host_network=args.allow_host_network,
    )


def policy_of_operator_args(argv: list[str]) -> Policy:
    """The Policy an operator started with `argv` applies (its other flags are ignored)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_policy_arguments(parser)
    args, _ = parser.parse_known_args(argv)
    return policy_from_arguments(args)


# --- the checks ---------------------------------------------------------------------------------------------------


def operator_issues(spec: RLJobSpec, policy: Policy) -> list[Issue]:
    """Everything the operator refuses in a spec that passed the CRD's rules; empty when it refuses nothing."""
    return trust_issues(spec, policy) + pod_issues(spec) + memory_issues(spec)


def trust_issues(spec: RLJobSpec, policy: Policy) -> list[Issue]:
    """Why the spec asks for more than `policy` allows; each message names the field and the chart value."""
    issues = []
    account = spec.cluster.service_account_name
    if account is not None and account not in policy.service_accounts:
        issues.append(
            Issue(
                "spec.cluster.serviceAccountName",
                f"{account!r} is not allowed; use {policy.trainer_service_account!r} (the chart's "
                "trainer.serviceAccount.name), or allow it with the chart value "
                f"security.allowedServiceAccounts: [{account}] (now: "
                f"{', '.join(policy.allowed_service_accounts) or 'none'})",
                "service-account-allowed",
            )
        )
    for i, volume in enumerate(spec.cluster.volumes):
        refused = [s for s in sorted(set(volume.model_extra or {})) if s not in policy.volume_types]
        if refused:
            issues.append(
                Issue(
                    f"spec.cluster.volumes[{i}]",
                    f"({volume.name}) volume type {', '.join(refused)} is not allowed; allowed: "
                    f"{', '.join(policy.volume_types)}; the chart value security.allowedVolumeTypes: "
                    f"[{', '.join(refused)}] would allow it",
                    "volume-type-allowed",
                )
            )
    if not policy.allow_host_network:
        for pool_name, pool in (("trainer", spec.cluster.trainer), ("rollout", spec.cluster.rollout)):
            if pool is not None and pool.pod.host_network:
                issues.append(
                    Issue(
                        f"spec.cluster.{pool_name}.pod.hostNetwork",
                        "host networking is not allowed (its pods would bypass the RLJob's NetworkPolicy); the "
                        "chart value security.allowHostNetwork: true would allow it",
                        "host-network-allowed",
                    )
                )
    return issues


def pod_issues(spec: RLJobSpec) -> list[Issue]:
    """What the operator cannot render into Ray pods: reserved volume names and mount paths, a checkpoint folder
    that dies with its pod, a Ray without token authentication, oversized free-form fields."""
    issues = [
        Issue(
            f"spec.cluster.volumes[{i}].name",
            f"{volume.name!r} is used by the operator; rename the volume (reserved: {', '.join(RESERVED_VOLUMES)})",
            "volume-names-not-reserved",
        )
        for i, volume in enumerate(spec.cluster.volumes)
        if volume.name in RESERVED_VOLUMES
    ]
    for i, mount in enumerate(spec.cluster.volume_mounts):
        path = mount.mount_path.rstrip("/") or "/"
        if path in RESERVED_MOUNT_PURPOSE:
            issues.append(
                Issue(
                    f"spec.cluster.volumeMounts[{i}].mountPath",
                    f"{mount.name} is mounted at {mount.mount_path}, where the operator mounts "
                    f"{RESERVED_MOUNT_PURPOSE[path]}; choose another mountPath",
                    "mount-paths-not-reserved",
                )
            )
    issues += _checkpoint_volume_issues(spec)
    match = SEMVER.fullmatch(spec.cluster.ray_version)
    if match is None or tuple(int(part or 0) for part in match.groups()) < TOKEN_AUTH_MIN_RAY:
        minimum = ".".join(map(str, TOKEN_AUTH_MIN_RAY))
        issues.append(
            Issue(
                "spec.cluster.rayVersion",
                f"{spec.cluster.ray_version!r}: the Ray cluster requires a token (KubeRay's authOptions), which "
                f"needs Ray >= {minimum}; set the version of Ray in cluster.image",
                "ray-version-has-token-auth",
            )
        )
    sizes = free_form_sizes(spec)
    total = sum(sizes.values())
    if total > MAX_FREE_FORM_BYTES:
        largest = ", ".join(f"{field} {size}" for field, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        issues.append(
            Issue(
                "spec.cluster",
                f"the free-form fields (affinity, volume sources, env sources) take {total} bytes as JSON, more than "
                f"{MAX_FREE_FORM_BYTES} (largest: {largest}); they are copied into every Ray pod template: shorten "
                "them (e.g. one nodeSelectorTerm with an `In` list instead of one term per node)",
                "free-form-bounded",
            )
        )
    return issues


def _checkpoint_volume_issues(spec: RLJobSpec) -> list[Issue]:
    """Without a storage claim, checkpointDir lies on a user volume (the CRD's `checkpoints-survive-pods` rule);
    refuse one that is pod-local. Here and not in the rule: volume sources are free-form, typeless to CEL."""
    if spec.storage.claim_name is not None or spec.storage.claim is not None:
        return []
    directory = spec.trainer.checkpoint_dir
    local = {v.name for v in spec.cluster.volumes if (v.model_extra or {}).get("emptyDir") is not None}
    for mount in spec.cluster.volume_mounts:
        root = mount.mount_path.rstrip("/")
        if mount.name in local and (directory == root or directory.startswith(root + "/")):
            return [
                Issue(
                    "spec.trainer.checkpointDir",
                    f"{directory} is on the emptyDir volume {mount.name}, which dies with its pod: set storage.claim "
                    "or storage.claimName, or mount a persistent volume there",
                    "checkpoints-not-on-emptydir",
                )
            ]
    return []


def free_form_sizes(spec: RLJobSpec) -> dict[str, int]:
    """Bytes of JSON of each free-form field of the spec that is set, by its path."""
    cluster = spec.cluster
    fields: dict[str, Any] = {"spec.cluster.head.affinity": cluster.head.affinity}
    pools = [("trainer", cluster.trainer), ("rollout", cluster.rollout)]
    for name, pool in pools:
        if pool is not None:
            fields[f"spec.cluster.{name}.affinity"] = pool.affinity
            fields[f"spec.cluster.{name}.pod.envFrom"] = pool.pod.env_from or None
    fields["spec.cluster.head.pod.envFrom"] = cluster.head.pod.env_from or None
    for i, volume in enumerate(cluster.volumes):
        fields[f"spec.cluster.volumes[{i}]"] = volume.model_extra or None
    for i, env in enumerate(cluster.env):
        fields[f"spec.cluster.env[{i}].valueFrom"] = env.value_from
    return {path: len(json.dumps(value, separators=(",", ":"))) for path, value in fields.items() if value is not None}


# --- the installed operator's policy ---------------------------------------------------------------------------

OPERATOR_SELECTOR = "app.kubernetes.io/part-of=kuberl,app.kubernetes.io/component=operator"  # the chart's labels
OPERATOR_CONTAINER = "operator"


class PolicyNotFound(LookupError):
    """The cluster's policy could not be read (no operator Deployment, several that disagree, no access)."""


def policy_from_cluster(namespace: str | None = None) -> tuple[Policy, str]:
    """The Policy of the kuberl operator installed in the kubeconfig's cluster, read from its Deployment's flags
    (the chart writes its security values there), and the Deployment's `namespace/name`. Needs `list deployments`
    where the operator runs (all namespaces unless `namespace` is given)."""
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
    except ImportError as exc:
        raise PolicyNotFound(
            f"reading the cluster's policy needs the kubernetes client: pip install 'kuberl[operator]' ({exc})"
        ) from exc
    try:
        config.load_kube_config()
        apps = client.AppsV1Api()
        if namespace:
            deployments = apps.list_namespaced_deployment(namespace, label_selector=OPERATOR_SELECTOR).items
        else:
            deployments = apps.list_deployment_for_all_namespaces(label_selector=OPERATOR_SELECTOR).items
    except (config.ConfigException, ApiException, OSError) as exc:
        raise PolicyNotFound(f"cannot list the operator's Deployment ({OPERATOR_SELECTOR}): {exc}") from exc
    found: dict[str, Policy] = {}
    for deployment in apps.api_client.sanitize_for_serialization(deployments):
        containers = deployment["spec"]["template"]["spec"].get("containers") or []
        operator = next((c for c in containers if c.get("name") == OPERATOR_CONTAINER), None)
        if operator is not None:
            name = f"{deployment['metadata']['namespace']}/{deployment['metadata']['name']}"
            found[name] = policy_of_operator_args([*operator.get("command", []), *operator.get("args", [])])
    if not found:
        where = f"namespace {namespace}" if namespace else "any namespace"
        raise PolicyNotFound(
            f"no kuberl operator Deployment (labels {OPERATOR_SELECTOR}) in {where}; give the chart's values "
            "with --policy FILE instead"
        )
    if len(set(found.values())) > 1:
        raise PolicyNotFound(
            f"the operators {', '.join(sorted(found))} apply different policies; name one with --operator-namespace"
        )
    name = sorted(found)[0]
    return found[name], name
