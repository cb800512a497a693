"""kuberay_support: the supported-KubeRay check on the RayJob schema, and the condition it writes."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import yaml

from e2e.operator.kuberay_rules import kuberay_crd_dir
from kuberl.operator.kuberay_support import RAYJOB_SCHEMA, schema_problem, unsupported_status


@cache
def _rayjob_schema() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((kuberay_crd_dir() / "ray.io_rayjobs.yaml").read_text(), Loader=loader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """The shape of `/openapi/v3/apis/ray.io/v1` for a CRD: the structural schema inline under its GVK name."""
    return {"openapi": "3.0.0", "components": {"schemas": {RAYJOB_SCHEMA: schema}}}


def worker_group(schema: dict[str, Any]) -> dict[str, Any]:
    spec = schema["properties"]["spec"]["properties"]["rayClusterSpec"]
    group: dict[str, Any] = spec["properties"]["workerGroupSpecs"]["items"]
    return group


def test_the_supported_kuberay_schema_passes() -> None:
    assert schema_problem(openapi(_rayjob_schema())) is None


def test_a_rayjob_crd_without_worker_group_labels_is_refused_with_what_to_do() -> None:
    schema = copy.deepcopy(_rayjob_schema())
    del worker_group(schema)["properties"]["labels"]  # what KubeRay 1.4's CRD looks like
    problem = schema_problem(openapi(schema))
    assert problem is not None
    assert "workerGroupSpecs[].labels" in problem and "KubeRay >= 1.5.1" in problem
    assert "helm install kuberay-operator kuberay/kuberay-operator --version 1.6.2" in problem


def test_a_rayjob_crd_without_auth_options_is_refused_with_what_to_do() -> None:
    schema = copy.deepcopy(_rayjob_schema())
    cluster = schema["properties"]["spec"]["properties"]["rayClusterSpec"]
    del cluster["properties"]["authOptions"]  # what KubeRay 1.5.0's CRD looks like
    problem = schema_problem(openapi(schema))
    assert problem is not None
    assert "rayClusterSpec.authOptions" in problem and "accept any caller" in problem
    assert "KubeRay >= 1.5.1" in problem and "--version 1.6.2" in problem


def test_missing_kuberay_is_refused() -> None:
    assert "not installed" in (schema_problem(None) or "")
    assert "serves no RayJob" in (schema_problem({"components": {"schemas": {}}}) or "")


def kuberay_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "KubeRaySupported")


def test_unsupported_condition_one_warning_then_healed() -> None:
    status, events = unsupported_status({}, "too old", now="t1")
    assert kuberay_condition(status) == {
        "type": "KubeRaySupported",
        "status": "False",
        "reason": "KubeRayUnsupported",
        "message": "too old",
        "lastTransitionTime": "t1",
    }
    assert status["phase"] == "Pending" and status["message"] == "too old"
    assert [(e.type, e.reason) for e in events] == [("Warning", "KubeRayUnsupported")]
    again, events = unsupported_status(status, "too old", now="t2")
    assert events == [] and kuberay_condition(again)["lastTransitionTime"] == "t1"
    healed, events = unsupported_status(again, None, now="t3")
    assert kuberay_condition(healed)["status"] == "True" and events == []
    assert unsupported_status({"phase": "Running"}, None) == ({"phase": "Running"}, [])
