"""The operator's own admission as `kuberl validate` applies it: the chart's trust policy (defaults, a values file,
the operator's flags) and the checks on free-form pod fields, each naming its field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.documents import check
from kuberl.api.policy import (
    MAX_FREE_FORM_BYTES,
    Policy,
    operator_issues,
    policy_from_values,
    policy_of_operator_args,
)
from kuberl.api.spec import RLJobSpec
from kuberl.cli import main
from tests.api.cases import BASE

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = {  # what the 2026-12-05 audit fed to `kuberl validate` ("valid") and to the cluster (refused)
    "serviceAccountName": "namespace-admin",
    "volumes": [
        {"name": "root", "hostPath": {"path": "/"}},
        {"name": "containerd", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}},
    ],
    "volumeMounts": [{"name": "root", "mountPath": "/host"}, {"name": "containerd", "mountPath": "/run/c.sock"}],
}


def rljob(**cluster: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].setdefault("cluster", {}).update(cluster)
    return doc


def rules_of(doc: dict[str, Any], policy: Policy | None = None) -> list[tuple[str, str]]:
    return [(i.field, i.rule) for i in check("test.yaml", doc, policy).issues]


def test_the_default_policy_is_the_charts_defaults() -> None:
    values = yaml.safe_load((ROOT / "charts/kuberl/values.yaml").read_text())
    assert policy_from_values(values) == Policy()


def test_a_hostile_rljob_is_refused_offline_naming_each_field_and_the_chart_value() -> None:
    issues = check("test.yaml", rljob(**HOSTILE)).issues
    assert [(i.field, i.rule) for i in issues] == [
        ("spec.cluster.serviceAccountName", "service-account-allowed"),
        ("spec.cluster.volumes[0]", "volume-type-allowed"),
        ("spec.cluster.volumes[1]", "volume-type-allowed"),
    ]
    assert "security.allowedServiceAccounts: [namespace-admin]" in issues[0].message
    assert "security.allowedVolumeTypes: [hostPath]" in issues[1].message


def test_a_values_file_that_allows_them_admits_the_same_rljob() -> None:
    values = {"security": {"allowedVolumeTypes": ["hostPath"], "allowedServiceAccounts": ["namespace-admin"]}}
    assert rules_of(rljob(**HOSTILE), policy_from_values(values)) == []


def test_the_operators_flags_give_the_same_policy_as_the_values_they_come_from() -> None:
    args = ["-A", "--allow-volume-type=hostPath", "--allow-service-account=ci", "--pod-run-as-user=platform"]
    assert policy_of_operator_args([*args, "--metrics-port=8080"]) == policy_from_values(
        {"security": {"allowedVolumeTypes": ["hostPath"], "allowedServiceAccounts": ["ci"], "podRunAsUser": "platform"}}
    )


def test_host_network_needs_the_chart_value() -> None:
    doc = rljob(trainer={"nodes": 1, "gpusPerNode": 8, "pod": {"hostNetwork": True}})
    assert rules_of(doc) == [("spec.cluster.trainer.pod.hostNetwork", "host-network-allowed")]
    assert rules_of(doc, policy_from_values({"security": {"allowHostNetwork": True}})) == []


def test_checkpoints_on_an_empty_dir_are_refused_offline() -> None:
    doc = rljob(volumes=[{"name": "scratch", "emptyDir": {}}], volumeMounts=[{"name": "scratch", "mountPath": "/s"}])
    doc["spec"]["storage"] = {}
    doc["spec"]["trainer"] = {"checkpointDir": "/s/ckpt"}
    doc["spec"]["runPolicy"] = {"backoffLimit": 0}
    doc["spec"]["cluster"]["trainer"] = {"nodes": 1, "gpusPerNode": 1}
    doc["spec"]["batch"] = {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 2}
    assert rules_of(doc) == [("spec.trainer.checkpointDir", "checkpoints-not-on-emptydir")]


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        ({"volumes": [{"name": "kuberl-spec", "emptyDir": {}}]}, "spec.cluster.volumes[0].name"),
        (
            {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/dev/shm/"}]},
            "spec.cluster.volumeMounts[0].mountPath",
        ),
        (
            {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc/kuberl"}]},
            "spec.cluster.volumeMounts[0].mountPath",
        ),
        (
            {
                "volumes": [{"name": "x", "persistentVolumeClaim": {"claimName": "x"}}],
                "volumeMounts": [{"name": "x", "mountPath": "/var/lib/kuberl/checkpoints"}],
            },
            "spec.cluster.volumeMounts[0].mountPath",
        ),
    ],
)
def test_user_volumes_cannot_take_the_operators_names_or_paths(cluster: dict[str, Any], field: str) -> None:
    assert [i.field for i in check("test.yaml", rljob(**cluster)).issues] == [field]


@pytest.mark.parametrize("version", ["2.51.1", "2.9.3", "nightly", ""])
def test_a_ray_version_without_token_authentication_is_refused_naming_the_field(version: str) -> None:
    (issue,) = check("test.yaml", rljob(rayVersion=version)).issues
    assert issue.field == "spec.cluster.rayVersion" and "needs Ray >= 2.52.0" in issue.message


def test_free_form_fields_are_bounded_together_naming_the_largest() -> None:
    terms = [{"matchExpressions": [{"key": "h", "operator": "In", "values": [f"n{i}"]}]} for i in range(3000)]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    spec = RLJobSpec.model_validate(rljob(trainer={"nodes": 2, "gpusPerNode": 8, "affinity": affinity})["spec"])
    (issue,) = operator_issues(spec, Policy())
    assert issue.rule == "free-form-bounded" and f"more than {MAX_FREE_FORM_BYTES}" in issue.message
    assert "spec.cluster.trainer.affinity" in issue.message


def test_kuberl_run_on_one_machine_skips_the_operators_checks(tmp_path: Path) -> None:
    from kuberl.api.documents import load_rljob

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(rljob(serviceAccountName="whoever")))
    with pytest.raises(ValueError, match="serviceAccountName"):
        load_rljob(path)
    assert load_rljob(path, one_machine=True)[0] == BASE["metadata"]["name"]


def test_validate_takes_the_policy_from_a_values_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job, values = tmp_path / "job.yaml", tmp_path / "values.yaml"
    job.write_text(yaml.safe_dump(rljob(**HOSTILE)))
    assert main(["validate", str(job)]) == 1
    out = capsys.readouterr().out
    assert "spec.cluster.volumes[1]: (containerd) volume type hostPath is not allowed" in out
    assert "[volume-type-allowed]" in out
    values.write_text("security:\n  allowedVolumeTypes: [hostPath]\n  allowedServiceAccounts: [namespace-admin]\n")
    assert main(["validate", "--policy", str(values), str(job)]) == 0
