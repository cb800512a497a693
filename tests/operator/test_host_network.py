"""hostNetwork per worker pool: refused naming the field unless the chart's security.allowHostNetwork is on."""

from __future__ import annotations

import pytest

from e2e.operator.kuberay_rules import kuberay_checks, rayjob_schema_errors
from kuberl.api.policy import Policy, trust_issues
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import validate_document
from kuberl.operator.__main__ import parse_args
from kuberl.operator.rayjob import render_rayjob
from tests.operator.test_rayjob_render import UID, base_spec

SEPARATE = {"rollout": {"placement": "separate"}}


def spec(pool: str = "trainer") -> RLJobSpec:
    cluster = {
        "trainer": {"nodes": 1, "gpusPerNode": 8, "pod": {"hostNetwork": pool == "trainer"}},
        "rollout": {"nodes": 1, "gpusPerNode": 8, "pod": {"hostNetwork": pool == "rollout"}},
    }
    return RLJobSpec.model_validate({**base_spec(**cluster), **SEPARATE})


@pytest.mark.parametrize("pool", ["trainer", "rollout"])
def test_host_network_is_refused_by_default_naming_the_pool_s_field(pool: str) -> None:
    (issue,) = map(str, trust_issues(spec(pool), Policy()))
    assert issue.startswith(f"spec.cluster.{pool}.pod.hostNetwork: host networking is not allowed")
    assert "security.allowHostNetwork" in issue


def test_allowed_host_network_puts_only_that_pool_on_the_node_s_network() -> None:
    policy = Policy(allow_host_network=True)
    assert trust_issues(spec("rollout"), policy) == []
    rayjob = render_rayjob("j", "ns", UID, spec("rollout"), policy)
    assert rayjob_schema_errors(rayjob) == [] and kuberay_checks(rayjob) == []  # KubeRay's CRD takes the fields
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = {g["groupName"]: g["template"]["spec"] for g in cluster["workerGroupSpecs"]}
    assert pods["rollout"]["hostNetwork"] is True
    assert pods["rollout"]["dnsPolicy"] == "ClusterFirstWithHostNet"  # cluster names still resolve
    for pod in (pods["trainer"], cluster["headGroupSpec"]["template"]["spec"]):
        assert "hostNetwork" not in pod and "dnsPolicy" not in pod


def test_the_head_has_no_host_network_field() -> None:
    doc = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "j"},
        "spec": base_spec(head={"pod": {"hostNetwork": True}}),
    }
    assert any(
        "spec.cluster.head.pod" in str(issue) and "hostNetwork" in str(issue) for issue in validate_document(doc)
    )


def test_the_operator_flag_allows_host_network() -> None:
    assert parse_args(["-A"]).trust.allow_host_network is False
    assert parse_args(["-A", "--allow-host-network"]).trust.allow_host_network is True
    assert parse_args(["-A", "--progress-timeout-seconds", "60"]).progress_timeout_seconds == 60
