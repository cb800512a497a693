"""The RLJob status: written by the operator (phase, conditions) and the trainer (progress)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from kuberl.api.spec import wire_name


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})
ACTIVE_PHASES = frozenset({Phase.PENDING, Phase.RUNNING, Phase.RESTARTING})
"""Phases in which batch and algorithm fields are immutable (a running trainer reads them)."""


def duration_summary(seconds: int) -> str:
    """2h05m, 4m10s, 35s: Progress.estimatedRemainingTimeSummary, and every duration `kuberl status` shows."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ConditionType(StrEnum):
    VALID = "Valid"
    CREATED = "Created"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CLUSTER_READY = "ClusterReady"  # False with the first cause that blocks the Ray cluster's pods (diagnosis.py)
    KUBERAY_SUPPORTED = "KubeRaySupported"  # False while the installed KubeRay is older than kuberl supports
    PROGRESS_REPORTED = "ProgressReported"  # False while a Running job's trainer is silent (operator/ownership.py)
    STALLED = "Stalled"  # True while a Running job's progress is older than runPolicy.stallTimeoutSeconds
    SANDBOX_READY = "SandboxReady"  # True while every pod of the job's sandbox pools is ready (operator/sandbox.py)
    # True while a Running job's separate rollout pool has no ready pod: the trainer waits for one up to
    # runPolicy.emptyRolloutPoolTimeoutSeconds
    ROLLOUT_POOL_EMPTY = "RolloutPoolEmpty"


class StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=wire_name, populate_by_name=True, extra="forbid")


Text = Annotated[str, Field(max_length=32768)]
Name = Annotated[str, Field(max_length=253)]


class Condition(StatusModel):
    """metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316)] = Field(
        description="Condition type, e.g. Valid, Running."
    )
    status: Annotated[str, Field(pattern=r"^(True|False|Unknown)$", max_length=7)] = Field(
        description="True, False or Unknown."
    )
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation the condition was set for.")
    last_transition_time: Annotated[str, Field(max_length=64)] = Field(
        description="When status last changed (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    reason: Annotated[
        str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ] = Field(description="CamelCase reason.")
    message: Text = Field("", description="Human-readable detail.")


class FailureClass(StrEnum):
    PERMANENT = "Permanent"  # a retry cannot fix it: the operator ends the job Failed, no retry
    TRANSIENT = "Transient"  # retried up to runPolicy.backoffLimit


class Failure(StatusModel):
    """Why the trainer's attempt failed, as it reported it before exiting (kuberl.trainer.driver.failures)."""

    kind: FailureClass = Field(description="Permanent (not retried) or Transient (retried up to backoffLimit).")
    error: Annotated[str, Field(max_length=256)] = Field(description="The error's class, e.g. DataError.")
    message: Text = Field("", description="The error's message.")
    at: Annotated[str, Field(max_length=64)] = Field(
        description="When the trainer reported it (RFC 3339).", json_schema_extra={"format": "date-time"}
    )


class Progress(StatusModel):
    step: int = Field(0, ge=0, description="Training steps completed.")
    total_steps: int | None = Field(None, ge=0, description="Steps the run will make.")
    epoch: int = Field(0, ge=0, description="Current epoch.")
    reward_mean: float | None = Field(None, description="Mean score of the last step's responses.")
    last_checkpoint: Annotated[str, Field(max_length=1024)] | None = Field(
        None, description="Path of the newest checkpoint."
    )
    tokens_per_second: float | None = Field(
        None, ge=0, description="Tokens (prompt + response) per second in the last step."
    )
    updated_at: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="When the trainer last reported (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    # progress as Kubeflow's TrainJob reports it (issue 20)
    percent_complete: int | None = Field(None, ge=0, le=100, description="step / totalSteps, in percent.")
    estimated_remaining_seconds: int | None = Field(
        None, ge=0, description="Seconds to totalSteps at the mean step time since this attempt started."
    )
    estimated_remaining_time_summary: Annotated[str, Field(max_length=32)] | None = Field(
        None, description="estimatedRemainingSeconds for people: 2h05m, 4m10s, 35s."
    )
    failure: Failure | None = Field(
        None, description="The failure that ended the trainer's last attempt; cleared by the next attempt's report."
    )
    rollout_engines: int | None = Field(
        None,
        ge=0,
        description="With rollout.placement separate: the rollout engines the trainer generates with now (each has "
        "the current weights); it changes as rollout pods join and leave (metric kuberl_rollout_engines).",
    )


class SandboxPoolStatus(StatusModel):
    pool: Annotated[str, Field(max_length=16)] = Field(description="reward (reward.sandbox) or tools.")
    replicas: int = Field(ge=0, description="Pods the pool's Deployment asks for (0 while suspended or finished).")
    ready_replicas: int = Field(0, ge=0, description="Pods whose server passed its readiness probe.")


class RolloutPoolStatus(StatusModel):
    """The separate rollout pool of the running Ray cluster, as the operator sees it."""

    replicas: int = Field(ge=0, description="Rollout pods the Ray cluster's rollout worker group asks for.")
    ready_replicas: int = Field(0, ge=0, description="Rollout pods running and ready.")


class RLJobStatus(StatusModel):
    phase: Phase | None = Field(None, description="Pending, Running, Restarting, Suspended, Succeeded or Failed.")
    message: Text | None = Field(None, description="Why the job is in this phase.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, description="Latest observations (metav1.Condition)."
    )
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation the operator last reconciled.")
    ray_job_name: Name | None = Field(None, description="The RayJob running this RLJob.")
    ray_cluster_name: Name | None = Field(None, description="The RayCluster of the current attempt.")
    dashboard_url: Annotated[str, Field(max_length=2048)] | None = Field(
        None, description="Ray dashboard of the current attempt."
    )
    restarts: int = Field(0, ge=0, description="Failed attempts that KubeRay retried.")
    start_time: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="When the job started running.", json_schema_extra={"format": "date-time"}
    )
    completion_time: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="When the job finished.", json_schema_extra={"format": "date-time"}
    )
    progress: Progress | None = Field(None, description="Reported by the trainer while it runs.")
    sandboxes: Annotated[list[SandboxPoolStatus], Field(max_length=2)] | None = Field(
        None, description="The sandbox pools: replicas and ready replicas."
    )
    rollout: RolloutPoolStatus | None = Field(
        None, description="The separate rollout pool while a Ray cluster runs: pods asked for and ready."
    )
    kopf: dict[str, Any] | None = Field(None, description="Handler bookkeeping of the operator framework.")
