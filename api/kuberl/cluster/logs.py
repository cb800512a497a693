"""`kuberl logs`: the driver's log file, read through the Kubernetes API by a short-lived pod.

The trainer appends all the driver prints to DRIVER_LOG under its checkpointDir, on the checkpoint claim: the file
outlives the head pod, its restarts and the Ray cluster. `kuberl logs NAME` starts a reader pod placed and mounted
as the RayJob's head pod is (its image, its volumes read-only, its node selector and tolerations, restricted),
which prints the file (`tail -F` with --follow); it streams that pod's log and deletes the pod.
"""

from __future__ import annotations

import json
import posixpath
import secrets
from typing import Any

from kuberl.api.contract import DRIVER_LOG, GROUP, KIND, RLJOB_LABEL, SPEC_DIR, VERSION

READER_COMPONENT = "log-reader"  # app.kubernetes.io/component of the reader pod
READER_CONTAINER = "log"
FOLLOW_DEADLINE_SECONDS = 86400  # a reader left behind (kuberl killed) ends within a day, or with its RLJob
READ_DEADLINE_SECONDS = 600


class LogUnavailable(RuntimeError):
    """Why there is no driver log to read yet (or any more), and where to look instead."""


def head_template(rayjob: dict[str, Any]) -> dict[str, Any]:
    return dict(rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])


def spec_configmap(template: dict[str, Any]) -> str:
    """The ConfigMap the head mounts at SPEC_DIR: the spec as the pods read it (checkpointDir resolved)."""
    container = template["spec"]["containers"][0]
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == SPEC_DIR), None)
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    if mount is None or "configMap" not in volumes.get(mount["name"], {}):
        raise LogUnavailable(f"the RayJob's head mounts no spec ConfigMap at {SPEC_DIR}")
    return str(volumes[mount["name"]]["configMap"]["name"])


def log_path(spec_json: str) -> str:
    """Where the driver's log is in the pods: DRIVER_LOG under the pods' trainer.checkpointDir."""
    checkpoint_dir = json.loads(spec_json)["trainer"]["checkpointDir"]
    return posixpath.join(checkpoint_dir, DRIVER_LOG)


def reader_pod(
    rljob: dict[str, Any], template: dict[str, Any], path: str, *, follow: bool, tail: int | None
) -> dict[str, Any]:
    """A pod that prints the log at `path` with the head pod's view of the volumes, read-only."""
    name = rljob["metadata"]["name"]
    head = template["spec"]
    container = head["containers"][0]
    mounts = [{**m, "readOnly": True} for m in container.get("volumeMounts", []) if m["mountPath"] != "/dev/shm"]
    if not any(path.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts):
        raise LogUnavailable(
            f"the driver's log {path} is on no volume the head pod mounts (trainer.checkpointDir is pod-local): "
            f"it is gone with the pod"
        )
    names = {m["name"] for m in mounts}
    start = "+1" if tail is None else str(tail)
    command = ["tail", "-n", start, "-F", path] if follow else ["tail", "-n", start, path]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "activeDeadlineSeconds": FOLLOW_DEADLINE_SECONDS if follow else READ_DEADLINE_SECONDS,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": READER_CONTAINER,
                "image": container["image"],
                "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                "command": command,
                "volumeMounts": mounts,
                "resources": {
                    "requests": {"cpu": "10m", "memory": "32Mi"},
                    "limits": {"cpu": "200m", "memory": "64Mi"},
                },
                **({"securityContext": container["securityContext"]} if "securityContext" in container else {}),
            }
        ],
        "volumes": [v for v in head.get("volumes", []) if v["name"] in names],
    }
    for key in ("securityContext", "nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        if key in head:
            spec[key] = head[key]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-logs-{secrets.token_hex(3)[:5]}",
            "namespace": rljob["metadata"]["namespace"],
            "labels": {RLJOB_LABEL: name, "app.kubernetes.io/component": READER_COMPONENT},
            "ownerReferences": [
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name, "uid": rljob["metadata"]["uid"]}
            ],
        },
        "spec": spec,
    }
