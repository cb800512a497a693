"""The sandbox pools an RLJob renders: locked-down pods whose server gets the spec's limits, a Service, and a
NetworkPolicy that admits only the job's Ray pods and allows no egress; their readiness in the status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kuberl.api.contract import POOL_LABEL, RLJOB_LABEL, SANDBOX_LABEL, SANDBOX_PORT
from kuberl.api.policy import Policy
from kuberl.api.spec import RLJobSpec, SandboxExecution
from kuberl.api.status import RLJobStatus
from kuberl.operator.rayjob import RenderError, render_networkpolicy, render_rayjob
from kuberl.operator.sandbox import pools_status, render_pools
from kuberl.sandbox.__main__ import build_parser
from kuberl.sandbox.protocol import Limits
from kuberl.sandbox.settings import limits_of
from tests.chart.rendering import schema_errors

UID = "6d4f0a1e-0000-4000-8000-000000000040"
SPEC: dict[str, Any] = {
    "model": {"path": "/models/policy"},
    "data": {"trainFiles": ["/data/train.parquet"]},
    "batch": {"trainBatchSize": 8, "rolloutN": 2, "ppoMiniBatchSize": 8, "ppoMicroBatchSizePerGPU": 2},
    "cluster": {"image": "registry.example/kuberl/trainer:1", "trainer": {"nodes": 1, "gpusPerNode": 2}},
    "reward": {
        "function": "code_tests",
        "sandbox": {
            "replicas": 3,
            "executionsPerPod": 4,
            "cpuPerExecution": "500m",
            "runtimeClassName": "gvisor",
            "execution": {"wallSeconds": 7.5, "memoryMb": 256, "diskMb": 8, "processes": 4},
        },
    },
}


def spec_with(**changes: Any) -> RLJobSpec:
    doc = copy.deepcopy(SPEC)
    doc.update(changes)
    return RLJobSpec.model_validate(doc)


def objects(spec: RLJobSpec | None = None, **kwargs: bool) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in render_pools("job", "team", UID, spec or spec_with(), **kwargs)}


def test_a_pool_is_a_deployment_a_service_and_a_networkpolicy_owned_by_the_rljob() -> None:
    rendered = render_pools("job", "team", UID, spec_with())
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered] == [
        ("Deployment", "job-sandbox-reward"),
        ("Service", "job-sandbox-reward"),
        ("NetworkPolicy", "job-sandbox-reward"),
    ]
    for obj in rendered:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
        assert obj["metadata"]["labels"][SANDBOX_LABEL] == "job"
        assert schema_errors(obj) == []


def test_the_pods_have_no_token_no_privilege_and_a_read_only_root() -> None:
    pod = objects()["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["runtimeClassName"] == "gvisor"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert [v["emptyDir"]["medium"] for v in pod["volumes"]] == ["Memory"]  # the executions' tmpfs, sized
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == f"{4 * 8 + 64}Mi"


def test_pod_resources_are_the_executions_and_the_server() -> None:
    container = objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": f"{4 * 500 + 250}m", "memory": f"{4 * (256 + 8) + 256}Mi"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["image"] == "registry.example/kuberl/trainer:1"


def test_the_server_gets_exactly_the_specs_limits_and_concurrency() -> None:
    command = objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:4] == ["python", "-m", "kuberl.sandbox", "serve"]
    args = build_parser().parse_args(command[3:])
    assert args.executions == 4
    assert args.listen == f"0.0.0.0:{SANDBOX_PORT}"
    limits = limits_of(SandboxExecution.model_validate_json(args.limits))
    assert limits == Limits(wall_seconds=7.5, cpu_seconds=5, memory_mb=256, processes=4, disk_mb=8)


def test_the_policy_admits_only_the_jobs_ray_pods_to_the_server_and_allows_no_egress() -> None:
    policy = objects()["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["egress"] == []
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": SANDBOX_PORT}]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"] == {RLJOB_LABEL: "job"}
    assert source["podSelector"]["matchExpressions"][0]["values"] == ["head", "trainer", "rollout"]


def test_the_ray_policy_neither_selects_the_sandbox_pods_nor_admits_them() -> None:
    """Sandbox pods carry no kuberl.io/rljob label: the Ray cluster's policy, which admits every pod labelled with
    it, does not count them among the job's pods; and the Ray pods do carry it, with their pool."""
    template = objects()["Deployment"]["spec"]["template"]
    ray_policy = render_networkpolicy("job", "team", UID, spec_with(), Policy())
    assert RLJOB_LABEL not in template["metadata"]["labels"]
    assert ray_policy["spec"]["podSelector"]["matchLabels"] == {RLJOB_LABEL: "job"}
    rayjob = render_rayjob("job", "team", UID, spec_with())
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert (head[RLJOB_LABEL], head[POOL_LABEL]) == ("job", "head")


def test_a_suspended_or_finished_job_renders_its_pools_without_pods() -> None:
    assert objects(stopped=True)["Deployment"]["spec"]["replicas"] == 0
    assert objects()["Deployment"]["spec"]["replicas"] == 3


def test_the_tools_pool_is_rendered_beside_the_reward_pool() -> None:
    agent = {"tools": [{"name": "calculator"}], "sandbox": {"replicas": 1}}
    spec = spec_with(rollout={"engine": "hf", "agent": agent})
    names = [o["metadata"]["name"] for o in render_pools("job", "team", UID, spec) if o["kind"] == "Deployment"]
    assert names == ["job-sandbox-reward", "job-sandbox-tools"]


def test_cpu_per_execution_in_another_unit_is_refused_naming_the_field() -> None:
    spec = spec_with(reward={"sandbox": {"cpuPerExecution": "1Gi"}})
    with pytest.raises(RenderError, match=r"spec.reward.sandbox.cpuPerExecution '1Gi': write cores"):
        render_pools("job", "team", UID, spec)


def test_without_a_sandbox_nothing_is_rendered_and_the_status_is_untouched() -> None:
    spec = spec_with(reward={"function": "gsm8k"})
    assert render_pools("job", "team", UID, spec) == []
    assert pools_status({"phase": "Running"}, "job", spec, {}, "now") == {"phase": "Running"}


@pytest.mark.parametrize(
    ("deployment", "ready", "reason"),
    [
        (None, "False", "PodsNotReady"),
        ({"spec": {"replicas": 3}, "status": {"readyReplicas": 2}}, "False", "PodsNotReady"),
        ({"spec": {"replicas": 3}, "status": {"readyReplicas": 3}}, "True", "PodsReady"),
        ({"spec": {"replicas": 0}, "status": {}}, "False", "ScaledDown"),
    ],
)
def test_the_pools_readiness_shows_in_the_status(deployment: dict | None, ready: str, reason: str) -> None:
    status = pools_status({"phase": "Running"}, "job", spec_with(), {"reward": deployment}, "2026-01-01T00:00:00Z")
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("SandboxReady", ready, reason)
    assert status["sandboxes"][0]["pool"] == "reward"
    RLJobStatus.model_validate(status)  # what the CRD's status schema keeps
