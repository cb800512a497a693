"""Report training progress into ``RLJob.status.progress`` from inside the RayJob.

On when ``KUBERL_REPORT_STATUS=1`` (``kuberl.api.contract.ENV_REPORT_STATUS``) and the pod has in-cluster credentials (the operator sets both), or
``KUBECONFIG`` names a kubeconfig. Patches go to
the ``status`` subresource as a JSON merge patch, at most one per ``min_interval`` seconds (the final report is
forced), and an API error is logged, never raised: a status update must not fail a training run.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from kuberl.api.contract import (
    API_VERSION,
    ENV_REPORT_STATUS,
    ENV_RLJOB_UID,
    GROUP,
    KIND,
    PLURAL,
    PROGRESS_FIELD,
    VERSION,
    timestamp,
)
from kuberl.api.status import Failure, Progress, duration_summary

log = logging.getLogger(__name__)

TOKEN_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and TOKEN_FILE.is_file()


def progress_estimate(step: int, total: int | None, start: tuple[float, int], now: float) -> dict[str, Any]:
    """Progress's percent_complete, and the time to `total` at the mean step time since `start` (clock, step) of this attempt
    (a resumed run counts from its resume step; until one step is done there is no estimate)."""
    if not total:
        return {}
    estimate: dict[str, Any] = {"percent_complete": min(100, step * 100 // total)}
    started_at, first_step = start
    if step > first_step:
        remaining = round(max(0, total - step) * (now - started_at) / (step - first_step))
        estimate |= {
            "estimated_remaining_seconds": remaining,
            "estimated_remaining_time_summary": duration_summary(remaining),
        }
    return estimate


class StatusReporter:
    def __init__(
        self,
        name: str,
        namespace: str,
        *,
        api: Any = None,
        core: Any = None,
        min_interval: float = 10.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.name = name
        self.core = core
        self.namespace = namespace
        self.api = api
        self.min_interval = min_interval
        self.clock = clock
        self.last_sent: float | None = None
        self.failures = 0
        self.start: tuple[float, int] | None = None  # (clock, step) of the first report of this attempt

    @classmethod
    def from_env(cls, name: str, namespace: str | None) -> StatusReporter | None:
        """A reporter when enabled and possible, else None (local runs)."""
        if os.environ.get(ENV_REPORT_STATUS) != "1":
            return None
        kubeconfig = os.environ.get("KUBECONFIG")
        if not namespace or not (in_cluster() or kubeconfig):
            log.warning(
                "%s=1 but no in-cluster credentials, KUBECONFIG or namespace: RLJob status will not be updated",
                ENV_REPORT_STATUS,
            )
            return None
        try:
            from kubernetes import client, config

            if in_cluster():
                config.load_incluster_config()
            else:  # a Ray cluster outside Kubernetes reporting to one (`ray start` on workstations, tests)
                config.load_kube_config(config_file=kubeconfig)
            return cls(name, namespace, api=client.CustomObjectsApi(), core=client.CoreV1Api())
        except Exception as exc:
            log.warning("cannot create the Kubernetes client, RLJob status will not be updated: %s", exc)
            return None

    @staticmethod
    def body(progress: Progress, *, clear_failure: bool = False) -> dict[str, Any]:
        """The merge patch: ``progress`` stamped with the time, on the wire (camelCase), unset fields left out;
        with `clear_failure`, the failure an earlier attempt reported is removed (null in a merge patch)."""
        stamped = progress.model_copy(update={"updated_at": timestamp()})
        wire = stamped.model_dump(mode="json", by_alias=True, exclude_none=True)
        if clear_failure:
            wire["failure"] = None
        return {"status": {PROGRESS_FIELD: wire}}

    def report(self, progress: Progress, *, force: bool = False) -> bool:
        """Patch ``status.progress`` unless one was sent less than ``min_interval`` ago."""
        now = self.clock()
        step = progress.step
        first = self.start is None
        if self.start is None:
            self.start = (now, step)
        if not force and self.last_sent is not None and now - self.last_sent < self.min_interval:
            return False
        self.last_sent = now
        progress = progress.model_copy(update=progress_estimate(step, progress.total_steps, self.start, now))
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, self.body(progress, clear_failure=first)
            )
            return True
        except Exception as exc:
            self.failures += 1
            log.warning(
                "RLJob %s/%s status patch failed (%d so far): %s", self.namespace, self.name, self.failures, exc
            )
            return False

    def report_engines(self, count: int) -> bool:
        """Patch ``status.progress.rolloutEngines`` alone: no ``updatedAt``, so a trainer waiting for engines still
        counts as silent for stall detection; logged, never raised."""
        return self.patch_progress({"rolloutEngines": count}, "rollout engines")

    def report_failure(self, failure: Failure) -> bool:
        """Patch ``status.progress.failure`` (the operator ends the job on a permanent one); logged, never raised."""
        return self.patch_progress({"failure": failure.model_dump(mode="json", by_alias=True)}, "failure")

    def patch_progress(self, fields: dict[str, Any], what: str) -> bool:
        """Merge ``fields`` (wire names) into ``status.progress``, nothing else; logged, never raised."""
        body = {"status": {PROGRESS_FIELD: fields}}
        try:
            self.api.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.name, body)
            return True
        except Exception as exc:
            log.warning("RLJob %s/%s %s report failed: %s", self.namespace, self.name, what, exc)
            return False

    def event(self, reason: str, message: str) -> bool:
        """Post a Warning Event on the RLJob (``kubectl describe rljob`` shows it); logged, never raised."""
        uid = os.environ.get(ENV_RLJOB_UID)
        if self.core is None or not uid:
            return False
        now = timestamp()
        body = {
            "metadata": {"generateName": f"{self.name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": self.name,
                "namespace": self.namespace,
                "uid": uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "kuberl-trainer"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(self.namespace, body)
            return True
        except Exception as exc:
            log.warning("RLJob %s/%s event %s failed: %s", self.namespace, self.name, reason, exc)
            return False
