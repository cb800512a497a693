"""KubeRay for the end-to-end test: runs each RayJob's entrypoint on a real local Ray head.

KubeRay's controller creates a RayCluster and its submitter runs `ray job submit` with the
RayJob's entrypoint and runtime env; it then mirrors the Ray job's state into the RayJob's
status and, with `backoffLimit` left, retries failed attempts on a new cluster. This runner
does the same on one machine: a `ray start --head` per attempt, the head pod's environment
and ConfigMap volumes materialised in a per-job folder (the "pod filesystem"), the job
submitted through Ray's job API, and the status written through `KubeRaySim`. Tests only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.harness import free_port
from e2e.operator.kuberay_sim import GROUP, PLURAL, VERSION, KubeRaySim

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


@dataclass
class Attempt:
    """One Ray cluster (a head process group) running one submission of a RayJob."""

    cluster: str
    head: subprocess.Popen
    dashboard: str
    log: Path
    ray_dir: Path
    submission_id: str = ""
    head_pod: str = ""

    def kill(self) -> None:
        if self.head.poll() is None:
            os.killpg(self.head.pid, signal.SIGKILL)
            self.head.wait()
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def driver_log(self) -> str:
        logs = sorted(self.ray_dir.glob("session_*/logs/job-driver-*.log"))
        return logs[-1].read_text()[-6000:] if logs else ""


@dataclass
class KubeRayRunner:
    api_client: client.ApiClient
    namespace: str
    pod_root: Path
    """Where each job's working directory and volumes live; the job runs with this as cwd."""
    pod_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the Ray pods."""
    head_credentials: Callable[[str], dict[str, str]] | None = None
    """The head pod's name → the environment standing in for its in-cluster credentials (e.g. KUBECONFIG with a
    token bound to that pod). With it each attempt gets a head Pod object (never scheduled: the head runs here)."""
    num_cpus: int = 2
    attempts: dict[str, Attempt] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.sim = KubeRaySim(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> KubeRayRunner:
        self._thread = threading.Thread(target=self._loop, name="kuberay-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=120)  # a reconcile under way finishes first (slow on a loaded machine)
        while self.attempts:  # popped one at a time: a loop that is still finishing may add one meanwhile
            _, attempt = self.attempts.popitem()
            attempt.kill()

    # --- the controller loop ----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
                for rayjob in listing["items"]:
                    self._reconcile(rayjob)
            except Exception as exc:  # keep playing KubeRay; the test reads `errors` when it fails
                self.errors.append(repr(exc))
            self._stop.wait(0.5)

    def _reconcile(self, rayjob: dict[str, Any]) -> None:
        name = rayjob["metadata"]["name"]
        status = rayjob.get("status") or {}
        deployment = status.get("jobDeploymentStatus") or ""
        if rayjob["spec"].get("suspend"):
            self._finish(name)
            self.sim.follow_suspend(self.namespace, name)
            return
        if deployment in ("", "Suspended") or (deployment == "Initializing" and name not in self.attempts):
            self._launch(rayjob)
        elif deployment == "Running" and name in self.attempts:
            self._follow(rayjob)

    def _launch(self, rayjob: dict[str, Any]) -> None:
        name = rayjob["metadata"]["name"]
        status = self.sim.initializing(self.namespace, name)["status"]
        try:
            attempt = self._start_head(name, status["rayClusterName"], rayjob)
            self.attempts[name] = attempt
            attempt.submission_id = self._submit(attempt, rayjob)
        except Exception as exc:
            self._finish(name)
            self.errors.append(repr(exc))
            self.sim.fail(self.namespace, name, reason="SubmissionFailed", message=str(exc)[-1000:])
            return
        self.sim.running(self.namespace, name)

    def _follow(self, rayjob: dict[str, Any]) -> None:
        name = rayjob["metadata"]["name"]
        attempt = self.attempts[name]
        state = self._job_state(attempt)
        if state == "SUCCEEDED":
            self._finish(name)
            self.sim.complete(self.namespace, name)
        elif state in ("FAILED", "STOPPED", "LOST"):
            self._finish(name)
            failed = int((rayjob.get("status") or {}).get("failed") or 0)
            if failed < int(rayjob["spec"].get("backoffLimit") or 0):
                self.sim.retry(self.namespace, name)
            else:
                self.sim.fail(self.namespace, name)

    def _finish(self, name: str) -> None:
        attempt = self.attempts.pop(name, None)
        if attempt:
            attempt.kill()
            if attempt.head_pod:  # its bound token stops working with it, as on a cluster
                try:
                    self.core.delete_namespaced_pod(attempt.head_pod, self.namespace, grace_period_seconds=0)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise

    def _head_pod(self, attempt: Attempt, head: dict[str, Any]) -> str:
        """Create the attempt's head Pod object, named as KubeRay names it (`<cluster>-head-<suffix>`)."""
        attempt.head_pod = f"{attempt.cluster}-head-{uuid.uuid4().hex[:5]}"
        pod = {
            "metadata": {"name": attempt.head_pod},
            "spec": {
                "serviceAccountName": head.get("serviceAccountName", "default"),
                "containers": [{"name": "ray-head", "image": head["containers"][0].get("image", "ray")}],
            },
        }
        self.core.create_namespaced_pod(self.namespace, pod)
        return attempt.head_pod

    # --- Ray --------------------------------------------------------------------------

    def _start_head(self, name: str, cluster: str, rayjob: dict[str, Any]) -> Attempt:
        workdir = self.pod_root / name
        workdir.mkdir(parents=True, exist_ok=True)
        port, dashboard_port = free_port(), free_port()
        log = workdir / f"{cluster}.ray.log"
        # Ray's socket paths must fit in 107 bytes: a short folder of its own, not one under pytest's tmp_path.
        ray_dir = Path(tempfile.mkdtemp(prefix="krl-"))
        env = {**os.environ, **RAY_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--dashboard-port={dashboard_port}",
            "--dashboard-host=127.0.0.1",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--temp-dir={ray_dir}",
            "--include-dashboard=true",
        ]
        with open(log, "wb") as out:
            head = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
            )
        attempt = Attempt(cluster, head, f"http://127.0.0.1:{dashboard_port}", log, ray_dir)
        self._wait_for_dashboard(attempt)
        return attempt

    def _wait_for_dashboard(self, attempt: Attempt, timeout: float = 120) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if attempt.head.poll() is not None:
                raise RuntimeError(f"ray head exited:\n{attempt.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{attempt.dashboard}/api/version", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"ray dashboard not up after {timeout}s:\n{attempt.log.read_text()[-3000:]}")

    def _submit(self, attempt: Attempt, rayjob: dict[str, Any]) -> str:
        from ray.job_submission import JobSubmissionClient

        name = rayjob["metadata"]["name"]
        workdir = self.pod_root / name
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        container = head["containers"][0]
        entrypoint = self._mount_volumes(rayjob["spec"]["entrypoint"], head, container, workdir)
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        env.update(self.pod_env)
        if self.head_credentials is not None:
            env.update(self.head_credentials(self._head_pod(attempt, head)))
        os.environ.update(RAY_ENV)
        submission = JobSubmissionClient(attempt.dashboard)
        # The dashboard answers before the head's agent has registered; KubeRay's submitter retries the same way.
        # The agent took over 120 s on a 2-core host busy with other jobs.
        deadline = time.monotonic() + 300
        while True:
            try:
                return submission.submit_job(
                    entrypoint=f"cd {shlex.quote(str(workdir))} && {entrypoint}",
                    runtime_env={"env_vars": env},
                    submission_id=f"{attempt.cluster}-{int(time.time())}",
                )
            except RuntimeError as exc:
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def _job_state(self, attempt: Attempt) -> str:
        from ray.job_submission import JobSubmissionClient

        if attempt.head.poll() is not None:
            return "LOST"
        try:
            return str(JobSubmissionClient(attempt.dashboard).get_job_status(attempt.submission_id).value)
        except Exception:
            return "LOST" if attempt.head.poll() is not None else "RUNNING"

    def _mount_volumes(self, entrypoint: str, pod: dict[str, Any], container: dict[str, Any], workdir: Path) -> str:
        """Write ConfigMap volumes into the job's folder and point the entrypoint's paths at them. A claim is one
        folder per claim under the runner's root, shared by every attempt (as a PersistentVolume outlives pods);
        its mount path is rewritten in the ConfigMaps' contents (the spec's checkpointDir)."""
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims: dict[str, str] = {}
        for mount in container.get("volumeMounts", []):
            claim = volumes[mount["name"]].get("persistentVolumeClaim")
            if claim:
                local = self.pod_root / ".claims" / claim["claimName"]  # no RLJob name starts with "."
                local.mkdir(parents=True, exist_ok=True)
                claims[mount["mountPath"]] = str(local)
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]].get("configMap")
            if not source:
                continue
            local = workdir / "mounts" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            data = self.core.read_namespaced_config_map(source["name"], self.namespace).data or {}
            for key, value in data.items():
                for mount_path, claim_dir in claims.items():
                    value = value.replace(mount_path, claim_dir)
                (local / key).write_text(value)
            entrypoint = entrypoint.replace(mount["mountPath"], str(local))
        return entrypoint
