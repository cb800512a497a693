"""What KubeRay would accept: its RayJob CRD schema with unknown fields as errors, and its controller-side checks.

- `rayjob_schema_errors(rayjob)`: jsonschema against `ray.io_rayjobs.yaml` (v1) with `additionalProperties: false`
  added to every object that declares properties and does not preserve unknown fields. The apiserver would prune
  an unknown field silently; here it is an error, so that a typo in the renderer cannot hide.
- `kuberay_checks(rayjob)`: KubeRay's `ValidateRayJobMetadata` / `ValidateRayJobSpec` / `ValidateRayClusterSpec`
  (ray-operator/controllers/ray/utils/validation.go), which turn a RayJob into
  `ValidationFailed` after the apiserver accepted it.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from e2e.harness import INSTALL_HINT, ToolMissing, Tools

MAX_RAYJOB_NAME = 47
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+][0-9A-Za-z.+-]*)?")  # Masterminds semver, lenient
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")


def kuberay_crd_dir() -> Path:
    """KubeRay's CRDs of the supported version, from the ray-operator Go module (`bash e2e/tools.sh install`)."""
    return Tools.from_env().kuberay_crd_dir()


def strictify(schema: Any) -> Any:
    """A copy of an OpenAPI v3 structural schema in which unknown object fields are errors."""
    if isinstance(schema, list):
        return [strictify(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strictify(v) for k, v in schema.items()}
    if (
        "properties" in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


@cache
def rayjob_validator() -> jsonschema.Draft7Validator:
    path = kuberay_crd_dir() / "ray.io_rayjobs.yaml"
    if not path.is_file():
        raise ToolMissing(f"KubeRay's RayJob CRD {path} is missing: run `{INSTALL_HINT}`")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strictify(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    return jsonschema.Draft7Validator(schema)


def rayjob_schema_errors(rayjob: dict[str, Any]) -> list[str]:
    errors = sorted(rayjob_validator().iter_errors(rayjob), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return ((template or {}).get("spec") or {}).get("containers") or []


def _group_checks(group: str, spec: dict[str, Any]) -> list[str]:
    errors = []
    params = spec.get("rayStartParams") or {}
    if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and spec.get("resources"):
        errors.append(f"resource fields should not be set in both rayStartParams and Resources for {group} group")
    if "labels" in params:
        errors.append(f"rayStartParams['labels'] is not supported for {group} group")
    for key, value in (spec.get("labels") or {}).items():
        if not QUALIFIED_NAME.match(key) or len(key.split("/")[-1]) > 63:
            errors.append(f"invalid label key for {group} group: {key!r}")
        if not LABEL_VALUE.match(value) or len(value) > 63:
            errors.append(f"invalid label value for key {key!r} in {group} group: {value!r}")
    if not _containers(spec.get("template")):
        errors.append(f"{group}: the pod template should have at least one container")
    return errors


def kuberay_checks(rayjob: dict[str, Any]) -> list[str]:
    """KubeRay's controller-side validation of a RayJob; an empty list means KubeRay would run it."""
    errors: list[str] = []
    name = (rayjob.get("metadata") or {}).get("name") or ""
    if len(name) > MAX_RAYJOB_NAME:
        errors.append(f"RayJob name should be no more than {MAX_RAYJOB_NAME} characters (got {len(name)})")
    if not DNS1035.match(name) or len(name) > 63:
        errors.append(f"RayJob name {name!r} should be a valid DNS-1035 label")
    spec = rayjob.get("spec") or {}
    mode = spec.get("submissionMode") or "K8sJobMode"
    if mode not in SUBMISSION_MODES:
        errors.append(f"submissionMode {mode!r} is not one of {', '.join(SUBMISSION_MODES)}")
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if spec.get("suspend") and not shutdown:
        errors.append("a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended")
    ttl = spec.get("ttlSecondsAfterFinished") or 0
    if ttl < 0:
        errors.append("TTLSecondsAfterFinished must be a non-negative integer")
    if not shutdown and ttl > 0:
        errors.append("a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished")
    if spec.get("deletionStrategy") and shutdown and (spec["deletionStrategy"].get("deletionRules")):
        errors.append("spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive")
    selector = spec.get("clusterSelector") or {}
    cluster = spec.get("rayClusterSpec")
    if bool(selector) == bool(cluster):
        errors.append("exactly one of rayClusterSpec or clusterSelector must be set")
    if selector and spec.get("suspend"):
        errors.append("the ClusterSelector mode doesn't support the suspend operation")
    backoff = spec.get("backoffLimit")
    if backoff is not None and backoff < 0:
        errors.append("backoffLimit must be a non-negative integer")
    if backoff and (mode == "InteractiveMode" or selector):
        errors.append("backoffLimit is incompatible with InteractiveMode and clusterSelector")
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate") or spec.get("submitterConfig"):
            errors.append("SidecarMode doesn't support submitterPodTemplate / submitterConfig")
        head_policy = (
            (((cluster or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec", {}).get("restartPolicy")
        )
        if head_policy not in (None, "", "Never"):
            errors.append("restartPolicy for head Pod should be Never or unset when using SidecarMode")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        errors.append("activeDeadlineSeconds must be a positive integer")
    if spec.get("runtimeEnvYAML"):
        try:
            yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError as exc:
            errors.append(f"runtimeEnvYAML is not valid YAML: {exc}")
    if cluster:
        errors += _cluster_checks(cluster)
    return errors


def _cluster_checks(cluster: dict[str, Any]) -> list[str]:
    errors = _group_checks("Head", cluster.get("headGroupSpec") or {})
    auth = cluster.get("authOptions") or {}
    if auth.get("mode", "token" if auth else None) == "token":
        version = SEMVER.fullmatch(cluster.get("rayVersion") or "")
        if version is None:
            errors.append("authOptions.mode is 'token' but rayVersion is not a version; Ray >= 2.52.0 is required")
        elif tuple(int(part or 0) for part in version.groups()) < (2, 52, 0):
            errors.append(f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {cluster['rayVersion']}")
    autoscaling = bool(cluster.get("enableInTreeAutoscaling"))
    names = set()
    for worker in cluster.get("workerGroupSpecs") or []:
        group = worker.get("groupName") or "<unnamed>"
        if group in names:
            errors.append(f"worker group name {group!r} is not unique")
        names.add(group)
        errors += _group_checks(group, worker)
        lo, hi, replicas = worker.get("minReplicas"), worker.get("maxReplicas"), worker.get("replicas")
        if not autoscaling and (lo is None or hi is None):
            errors.append(f"worker group {group}: minReplicas and maxReplicas must be set without the autoscaler")
        if lo is not None and hi is not None:
            if lo > hi:
                errors.append(f"worker group {group}: minReplicas {lo} > maxReplicas {hi}")
            if replicas is not None and not (lo <= replicas <= hi):
                errors.append(f"worker group {group}: replicas {replicas} outside [{lo}, {hi}]")
        if worker.get("suspend") and autoscaling:
            errors.append(f"worker group {group} cannot be suspended with Autoscaler enabled")
    head = _containers((cluster.get("headGroupSpec") or {}).get("template"))
    if head and not autoscaling:
        for env in head[0].get("env") or []:
            if env.get("name") == "RAY_enable_autoscaler_v2" and env.get("value") in ("1", "true"):
                errors.append("RAY_enable_autoscaler_v2 cannot be set when enableInTreeAutoscaling is false")
    if (
        head
        and not cluster.get("gcsFaultToleranceOptions")
        and any(e.get("name") == "RAY_REDIS_ADDRESS" for e in head[0].get("env") or [])
    ):
        errors.append("RAY_REDIS_ADDRESS implicitly enables GCS fault tolerance without gcsFaultToleranceOptions")
    return errors
