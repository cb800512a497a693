"""What an RLJob may ask of the cluster beyond what its creator could do with a Job: the trust model as data.

The CRD's rules cannot know the chart's settings, so the checks that depend on them live here and the operator
refuses an RLJob that fails them (Valid=False, reason Untrusted, naming the field) before it creates anything.
docs/security.md explains the model; the chart passes its `security.*` values as the operator's flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.spec import RLJobSpec

# Volume sources that read only what the namespace already holds or the pod itself creates.
DEFAULT_VOLUME_TYPES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "projected", "ephemeral")
TRAINER_SERVICE_ACCOUNT = "kuberl-trainer"
RAY_UID = 1000  # the trainer image's user (images/trainer.Dockerfile: `USER 1000`), Ray's convention


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


def trust_issues(spec: RLJobSpec, policy: Policy) -> list[str]:
    """Why the spec asks for more than `policy` allows; empty when it does not. Each message names its field."""
    issues = []
    account = spec.cluster.service_account_name
    if account is not None and account not in policy.service_accounts:
        issues.append(
            f"spec.cluster.serviceAccountName: {account!r} is not allowed; use {policy.trainer_service_account!r} "
            f"(or one of the chart's security.allowedServiceAccounts: {', '.join(policy.allowed_service_accounts) or 'none'})"
        )
    for i, volume in enumerate(spec.cluster.volumes):
        sources = sorted(set(volume.model_extra or {}))
        refused = [s for s in sources if s not in policy.volume_types]
        if refused:
            issues.append(
                f"spec.cluster.volumes[{i}] ({volume.name}): volume type {', '.join(refused)} is not allowed; "
                f"allowed: {', '.join(policy.volume_types)} (more only through the chart's security.allowedVolumeTypes)"
            )
    if not policy.allow_host_network:
        pools = [("trainer", spec.cluster.trainer), ("rollout", spec.cluster.rollout)]
        for pool_name, pool in pools:
            if pool is not None and pool.pod.host_network:
                issues.append(
                    f"spec.cluster.{pool_name}.pod.hostNetwork: host networking is not allowed (its pods would bypass "
                    "the RLJob's NetworkPolicy); the chart's security.allowHostNetwork enables it"
                )
    return issues
