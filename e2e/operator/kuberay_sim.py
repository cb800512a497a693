"""A small stand-in for KubeRay in tests: it writes RayJob `.status` the way KubeRay's controller would.

No controller loop: a test drives the states explicitly (`sim.running(ns, name)`), which keeps every
transition deterministic. `follow_suspend` plays KubeRay's reaction to `spec.suspend` (delete the cluster →
Suspending → Suspended; resume → a new cluster, Initializing). State names and fields follow KubeRay's
`ray-operator/apis/ray/v1/rayjob_types.go`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class KubeRaySim:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)

    # --- raw access -------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def patch_status(self, namespace: str, name: str, **status: Any) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _content_type="application/merge-patch+json"
        )

    def wait_for(self, namespace: str, name: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get(namespace, name)
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    # --- KubeRay's states -------------------------------------------------------------

    def _cluster(self, name: str) -> dict[str, Any]:
        cluster = f"{name}-{uuid.uuid4().hex[:5]}"
        return {"rayClusterName": cluster, "dashboardURL": f"{cluster}-head-svc.ns.svc.cluster.local:8265"}

    def initializing(self, namespace: str, name: str) -> dict[str, Any]:
        current = self.get(namespace, name).get("status") or {}
        extra = (
            {}
            if current.get("rayClusterName") and current.get("jobDeploymentStatus") == "Initializing"
            else self._cluster(name)
        )
        return self.patch_status(
            namespace, name, jobDeploymentStatus="Initializing", jobStatus="", startTime=_now(), **extra
        )

    def running(self, namespace: str, name: str, job_status: str = "RUNNING") -> dict[str, Any]:
        return self.patch_status(
            namespace, name, jobDeploymentStatus="Running", jobStatus=job_status, jobId=f"{name}-{uuid.uuid4().hex[:6]}"
        )

    def complete(self, namespace: str, name: str) -> dict[str, Any]:
        succeeded = int((self.get(namespace, name).get("status") or {}).get("succeeded") or 0)
        return self.patch_status(
            namespace,
            name,
            jobDeploymentStatus="Complete",
            jobStatus="SUCCEEDED",
            succeeded=succeeded + 1,
            endTime=_now(),
            message="",
        )

    def fail(
        self,
        namespace: str,
        name: str,
        reason: str = "AppFailed",
        message: str = "Job entrypoint command failed with exit code 1",
    ) -> dict[str, Any]:
        """A final failure (no retries left)."""
        failed = int((self.get(namespace, name).get("status") or {}).get("failed") or 0)
        return self.patch_status(
            namespace,
            name,
            jobDeploymentStatus="Failed",
            jobStatus="FAILED",
            reason=reason,
            message=message,
            failed=failed + 1,
            endTime=_now(),
        )

    def retry(self, namespace: str, name: str, reason: str = "AppFailed") -> dict[str, Any]:
        """A failed attempt with backoffLimit left: Retrying, then a new cluster (Initializing)."""
        failed = int((self.get(namespace, name).get("status") or {}).get("failed") or 0)
        self.patch_status(
            namespace, name, jobDeploymentStatus="Retrying", jobStatus="FAILED", reason=reason, failed=failed + 1
        )
        return self.patch_status(
            namespace,
            name,
            jobDeploymentStatus="Initializing",
            jobStatus="",
            reason=None,
            message=None,
            **self._cluster(name),
        )

    def validation_failed(self, namespace: str, name: str, message: str) -> dict[str, Any]:
        return self.patch_status(
            namespace, name, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed", message=message
        )

    def follow_suspend(self, namespace: str, name: str) -> dict[str, Any]:
        """Do what KubeRay does with the current `spec.suspend`."""
        rayjob = self.get(namespace, name)
        status = rayjob.get("status") or {}
        if rayjob["spec"].get("suspend"):
            if status.get("jobDeploymentStatus") not in ("Suspending", "Suspended"):
                self.patch_status(namespace, name, jobDeploymentStatus="Suspending")
            return self.patch_status(
                namespace, name, jobDeploymentStatus="Suspended", jobStatus="", rayClusterName="", dashboardURL=""
            )
        if status.get("jobDeploymentStatus") == "Suspended":
            return self.initializing(namespace, name)
        return rayjob
