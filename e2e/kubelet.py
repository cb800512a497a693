"""A stand-in scheduler and kubelet for the harness, which has neither: pods get nodes, states and deletion.

    with StandInKubelet(api_client, "team-a", nodes=[FakeNode("gpu-1", gpus=8, labels={"pool": "a100"})]):
        ...   # pods in team-a are bound, Running and Ready; or Unschedulable / ImagePullBackOff / CrashLoopBackOff

What it does, as kube-scheduler and a kubelet would (one thread, polling every `period` seconds):
- registers the fake Nodes (capacity cpu, memory, pods, `nvidia.com/gpu`; labels; Ready);
- schedules a pending pod onto the first node whose labels match its `nodeSelector` and whose free capacity
  covers its requests (limits when no requests), through the `pods/binding` subresource; when none fits, writes
  `PodScheduled=False/Unschedulable` with the scheduler's message (`0/3 nodes are available: 3 Insufficient
  nvidia.com/gpu.`) and a `FailedScheduling` Event;
- runs a bound pod: Running and Ready, a pod IP, started containers; a container whose image is in
  `pull_failures` waits in `ImagePullBackOff` (with a `Failed` Event), one in `crash_images` in `CrashLoopBackOff`;
- completes a pod of a Job (`batch.kubernetes.io/job-name`) with `Succeeded`, exit code 0; or, given
  `containers` (`e2e/raypods.py`), really runs the Ray pods' containers: a pod is ContainerCreating until its
  container runs, and ends Succeeded or Failed with the container's exit code;
- honours deletion: a pod with a deletionTimestamp is deleted with grace period 0 (its processes killed); one whose
  containers declare a preStop exec hook and run here (`containers`) is stopped as a kubelet stops it: the hook runs
  (`Containers.exec`, a `FailedPreStopHook` Event when it fails), then SIGTERM to the container's main process, SIGKILL
  once the pod's grace period (`deletionGracePeriodSeconds`) is over, counted from the start of the hook.
The image sets may change while it runs (a pull that starts to work, as after a fixed registry secret).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

GPU = "nvidia.com/gpu"
HOOK_OVERRUN_SECONDS = 2  # the kubelet's extra grace for the main process when a preStop hook used up the period
JOB_LABEL = "batch.kubernetes.io/job-name"


class Containers(Protocol):
    """What runs a pod's containers: "creating", "running", or the exit code; `forget` when the pod is deleted
    (its processes killed). A graceful stop: `exec` a hook in the container (None: it does not run here),
    `terminate` (SIGTERM) its main process, `exited` once it is gone."""

    def state(self, pod: dict[str, Any]) -> str | int: ...

    def forget(self, name: str) -> None: ...

    def exec(self, pod: dict[str, Any], command: list[str]) -> subprocess.Popen[bytes] | None: ...

    def terminate(self, name: str) -> None: ...

    def exited(self, name: str) -> bool: ...


@dataclass(frozen=True)
class FakeNode:
    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        if self.gpus:
            cap[GPU] = str(self.gpus)
        return cap


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pre_stop_hooks(pod: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(container, command) of each container's `lifecycle.preStop.exec` hook, in the pod's order."""
    hooks = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        command = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        if command:
            hooks.append((container["name"], list(command)))
    return hooks


def pod_requests(pod: dict[str, Any]) -> dict[str, float]:
    """What the scheduler counts: per resource, the sum over containers of requests (limits when unset)."""
    total: dict[str, float] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, qty in wanted.items():
            total[name] = total.get(name, 0.0) + float(parse_quantity(qty))
    return total


class StandInKubelet:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        nodes: Iterable[FakeNode],
        *,
        period: float = 0.3,
        containers: Containers | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.sanitize = api_client.sanitize_for_serialization
        self.namespace = namespace
        self.nodes = list(nodes)
        self.period = period
        self.containers = containers
        self.pull_failures: set[str] = set()
        self.crash_images: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stand-in-kubelet", daemon=True)
        self._reported: set[tuple[str, str]] = set()
        self._stopping: dict[str, threading.Thread] = {}
        self.errors: list[str] = []

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> StandInKubelet:
        for node in self.nodes:
            self.add_node(node)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for thread in list(self._stopping.values()):
            thread.join(timeout=10)
        for node in self.nodes:
            try:
                self.core.delete_node(node.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def __enter__(self) -> StandInKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_node(self, node: FakeNode) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name, **node.labels}},
        }
        self.core.create_node(body)
        if node not in self.nodes:
            self.nodes.append(node)
        status = {
            "capacity": node.capacity(),
            "allocatable": node.capacity(),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "stand-in"}],
        }
        self.core.patch_node_status(node.name, {"status": status})

    # ---- the loop -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.tick()
            except ApiException as exc:  # a conflict or a pod deleted under us: the next tick sees the new state
                self.errors.append(f"{exc.status} {exc.reason}")

    def tick(self) -> None:
        pods = self.sanitize(self.core.list_namespaced_pod(self.namespace))["items"]
        used: dict[str, dict[str, float]] = {n.name: {} for n in self.nodes}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node in used and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                for name, qty in pod_requests(pod).items():
                    used[node][name] = used[node].get(name, 0.0) + qty
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                if self.containers is not None and pre_stop_hooks(pod) and pod["spec"].get("nodeName"):
                    self._stop_gracefully(pod)
                else:
                    self._delete(meta["name"])
            elif not pod["spec"].get("nodeName"):
                self._schedule(pod, used)
            else:
                self._run(pod)

    def _delete(self, name: str) -> None:
        if self.containers is not None:
            self.containers.forget(name)
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _stop_gracefully(self, pod: dict[str, Any]) -> None:
        """Once per pod, in a thread of its own (other pods go on meanwhile): preStop hooks, SIGTERM, SIGKILL at the
        end of the grace period, then the pod object goes."""
        uid = pod["metadata"]["uid"]
        if uid in self._stopping:
            return
        thread = threading.Thread(target=self._terminate, args=(pod,), name=f"stop-{pod['metadata']['name']}")
        self._stopping[uid] = thread
        thread.start()

    def _terminate(self, pod: dict[str, Any]) -> None:
        assert self.containers is not None, "only pods whose containers run here stop gracefully"
        name = pod["metadata"]["name"]
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        deadline = time.monotonic() + grace
        try:
            for container, command in pre_stop_hooks(pod):
                hook = self.containers.exec(pod, command)
                if hook is None:
                    continue
                try:
                    code = hook.wait(timeout=max(deadline - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    hook.kill()
                    code = hook.wait()
                if code != 0:
                    message = f"PreStopHook {command} of container {container} failed: exit code {code}"
                    self._event(pod, "FailedPreStopHook", message, "kubelet")
            self.containers.terminate(name)
            # as a kubelet: a hook that used up the grace period leaves the main process 2 s after SIGTERM
            deadline = max(deadline, time.monotonic() + HOOK_OVERRUN_SECONDS)
            while not self.containers.exited(name) and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.2)
            self._delete(name)
        except ApiException as exc:
            self.errors.append(f"{exc.status} {exc.reason}")

    def _schedule(self, pod: dict[str, Any], used: dict[str, dict[str, float]]) -> None:
        name, wanted = pod["metadata"]["name"], pod_requests(pod)
        selector = pod["spec"].get("nodeSelector") or {}
        mismatched, short = 0, {}
        for node in self.nodes:
            labels = {"kubernetes.io/hostname": node.name, **node.labels}
            if any(labels.get(k) != v for k, v in selector.items()):
                mismatched += 1
                continue
            capacity = {k: float(parse_quantity(v)) for k, v in node.capacity().items()}
            lacking = [r for r, q in wanted.items() if q > capacity.get(r, 0.0) - used[node.name].get(r, 0.0)]
            if lacking:
                for r in lacking:
                    short[r] = short.get(r, 0) + 1
                continue
            for r, q in wanted.items():
                used[node.name][r] = used[node.name].get(r, 0.0) + q
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node.name},
            }
            self.core.create_namespaced_binding(self.namespace, binding, _preload_content=False)
            return
        reasons = [f"{count} Insufficient {r}" for r, count in sorted(short.items())]
        if mismatched:
            reasons.append(f"{mismatched} node(s) didn't match Pod's node affinity/selector")
        message = f"0/{len(self.nodes)} nodes are available: {', '.join(reasons) or 'no nodes'}."
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": _now(),
        }
        if self._first(name, message):
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": {"conditions": [condition]}})
            self._event(pod, "FailedScheduling", message, "default-scheduler")

    def _run(self, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        name = meta["name"]
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        images = {c.get("image", "") for c in spec["containers"]}
        blocked = bool(images & (self.pull_failures | self.crash_images))
        ran: str | int = 0 if job else "running"
        if self.containers is not None and not blocked:
            ran = self.containers.state(pod)
        states, ready, exited = [], ran == "running" and not blocked, isinstance(ran, int) and not blocked
        for container in spec["containers"]:
            image = container.get("image", "")
            if image in self.pull_failures:
                message = f'Back-off pulling image "{image}"'
                state = {"waiting": {"reason": "ImagePullBackOff", "message": message}}
                if self._first(name, message):
                    self._event(pod, "Failed", f'Failed to pull image "{image}": not found', "kubelet")
            elif image in self.crash_images:
                message = f"back-off 10s restarting failed container={container['name']} pod={name}"
                state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            elif exited:
                reason = "Completed" if ran == 0 else "Error"
                state = {"terminated": {"exitCode": ran, "reason": reason, "finishedAt": _now()}}
            elif ran == "creating":
                state = {"waiting": {"reason": "ContainerCreating"}}
            else:
                state = {"running": {"startedAt": _now()}}
            last = {"terminated": {"exitCode": 1, "reason": "Error"}} if image in self.crash_images else {}
            states.append(
                {
                    "name": container["name"],
                    "image": image,
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "started": ready,
                    "state": state,
                    "lastState": last,
                }
            )
        phase = ("Succeeded" if ran == 0 else "Failed") if exited else ("Running" if ready else "Pending")
        key = f"{phase}/{ready}/{[sorted(s['state']) for s in states]}"
        if not self._first(name, key) and status.get("phase") == phase:
            return
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
            {"type": "Initialized", "status": "True", "lastTransitionTime": _now()},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": _now()},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": _now()},
        ]
        body = {
            "status": {
                "phase": phase,
                "conditions": conditions,
                "containerStatuses": states,
                "podIP": "10.1.0.1",
                "podIPs": [{"ip": "10.1.0.1"}],
                "hostIP": "10.0.0.2",
                "startTime": status.get("startTime") or _now(),
            }
        }
        self.core.patch_namespaced_pod_status(name, self.namespace, body)

    def _first(self, pod: str, what: str) -> bool:
        """True the first time `what` happens to `pod` (one Event per cause, as the real components do)."""
        if (pod, what) in self._reported:
            return False
        self._reported.add((pod, what))
        return True

    def _event(self, pod: dict[str, Any], reason: str, message: str, component: str) -> None:
        meta = pod["metadata"]
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": self.namespace},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": self.namespace, "uid": meta["uid"]},
            "type": "Warning",
            "reason": reason,
            "message": message,
            "source": {"component": component},
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
        }
        self.core.create_namespaced_event(self.namespace, body)
