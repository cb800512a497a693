"""reconcile.ensure / write_status against an in-memory API: idempotent, ownership-checked, conflict-safe."""

from __future__ import annotations

import copy
import itertools
import re
import uuid
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from kuberl.api.contract import CHECKPOINT_MOUNT
from kuberl.api.policy import Policy
from kuberl.operator import reconcile

NS = "team-a"


def api_error(status: int) -> ApiException:
    return ApiException(status=status, reason={404: "Not Found", 409: "Conflict"}.get(status, "Error"))


class FakeApi:
    """Just enough of reconcile.Api: objects by (kind, name), resourceVersions, 409 on stale status patches."""

    def __init__(self, trust: Policy | None = None) -> None:
        self.trust = trust or Policy()
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = itertools.count(1)
        self.calls: list[str] = []
        self.status_conflicts = 0  # make the next N status patches fail with 409

    def _get(self, kind: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj else None

    def _create(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        key = (kind, body["metadata"]["name"])
        if key in self.objects:
            raise api_error(409)
        obj = copy.deepcopy(body)
        obj["metadata"].update(resourceVersion=str(next(self.rv)), uid=str(uuid.uuid4()))
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def get_rljob(self, namespace: str, name: str):
        self.calls.append("get rljob")
        return self._get("rljob", name)

    def patch_rljob_status(self, namespace: str, name: str, body: dict[str, Any]):
        self.calls.append("patch status")
        obj = self.objects[("rljob", name)]
        if self.status_conflicts:
            self.status_conflicts -= 1
            obj["metadata"]["resourceVersion"] = str(next(self.rv))  # someone else wrote
            raise api_error(409)
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise api_error(409)
        status = obj.setdefault("status", {})
        for key, value in body["status"].items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        return copy.deepcopy(obj)

    def list_rljobs(self, namespace: str | None):
        self.calls.append("list rljobs")
        return [copy.deepcopy(obj) for (kind, _), obj in self.objects.items() if kind == "rljob"]

    def get_rayjob(self, namespace: str, name: str):
        self.calls.append("get rayjob")
        return self._get("rayjob", name)

    def create_rayjob(self, namespace: str, body: dict[str, Any]):
        self.calls.append("create rayjob")
        return self._create("rayjob", body)

    def json_patch_rayjob(self, namespace: str, name: str, ops: list[dict[str, Any]]):
        raise NotImplementedError

    def delete_rayjob(self, namespace: str, name: str) -> None:
        self.calls.append("delete rayjob")
        self.objects.pop(("rayjob", name), None)

    def get_configmap(self, namespace: str, name: str):
        self.calls.append("get configmap")
        return self._get("configmap", name)

    def create_configmap(self, namespace: str, body: dict[str, Any]):
        self.calls.append("create configmap")
        return self._create("configmap", body)

    def patch_configmap(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.calls.append("patch configmap")
        self.objects[("configmap", name)]["data"] = body["data"]

    def create_networkpolicy(self, namespace: str, body: dict[str, Any]):
        self.calls.append("create networkpolicy")
        return self._create("networkpolicy", body)

    def get_networkpolicy(self, namespace: str, name: str):
        return self._get("networkpolicy", name)

    def get_claim(self, namespace: str, name: str):
        self.calls.append("get claim")
        return self._get("claim", name)

    def create_claim(self, namespace: str, body: dict[str, Any]):
        self.calls.append("create claim")
        return self._create("claim", body)


def rljob(api: FakeApi, name: str = "job", **spec_changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": "/m"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["/d.parquet"]},
        "batch": {"trainBatchSize": 16, "rolloutN": 4, "ppoMiniBatchSize": 8, "ppoMicroBatchSizePerGPU": 4},
        "cluster": {"trainer": {"nodes": 1, "gpusPerNode": 8}},
    }
    spec.update(spec_changes)
    body = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": NS, "generation": 1},
        "spec": spec,
    }
    return api._create("rljob", body)


def test_ensure_twice_creates_one_of_each_and_writes_status_once() -> None:
    api = FakeApi()
    body = rljob(api)
    reconcile.ensure(api, body)
    reconcile.ensure(api, api.objects[("rljob", "job")])
    assert sorted(k for k in api.objects) == [
        ("claim", "job-checkpoints"),
        ("configmap", "job-spec"),
        ("networkpolicy", "job-ray"),
        ("rayjob", "job"),
        ("rljob", "job"),
    ]
    assert api.calls.count("patch status") == 1
    status = api.objects[("rljob", "job")]["status"]
    assert status["phase"] == "Pending"
    assert status["rayJobName"] == "job"
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]}["Valid"] == "True"
    assert api.objects[("rayjob", "job")]["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]


def test_a_job_in_its_own_checkpoint_folder_is_created_without_reading_the_other_rljobs() -> None:
    api = FakeApi()
    for i in range(3):  # the default: a relative checkpointDir, in each job's own folder on its claim
        reconcile.ensure(api, rljob(api, f"job-{i}"))
    assert "list rljobs" not in api.calls and len([k for k in api.objects if k[0] == "rayjob"]) == 3
    absolute = rljob(api, "shared", storage={"claimName": "team"}, trainer={"checkpointDir": f"{CHECKPOINT_MOUNT}/x"})
    reconcile.ensure(api, absolute)
    assert api.calls.count("list rljobs") == 1


def test_every_child_is_owned_by_the_rljob_and_the_ray_token_is_left_to_kuberay() -> None:
    api = FakeApi()
    body = rljob(api)
    reconcile.ensure(api, body)
    for key in (("networkpolicy", "job-ray"), ("configmap", "job-spec"), ("rayjob", "job")):
        (owner,) = api.objects[key]["metadata"]["ownerReferences"]
        assert owner["uid"] == body["metadata"]["uid"] and owner["controller"] is True, key
    assert not [kind for kind, _ in api.objects if kind == "secret"], "KubeRay creates the token Secret"
    cluster = api.objects[("rayjob", "job")]["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}


def test_a_foreign_networkpolicy_of_the_same_name_is_refused() -> None:
    api = FakeApi()
    api._create("networkpolicy", {"metadata": {"name": "job-ray"}, "spec": {"podSelector": {}}})
    with pytest.raises(kopf.PermanentError, match="NetworkPolicy job-ray already exists and is not owned"):
        reconcile.ensure(api, rljob(api))
    assert ("rayjob", "job") not in api.objects


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "spec.cluster.volumes[0]: (root) volume type hostPath",
        ),
        ({"serviceAccountName": "admin-sa"}, "spec.cluster.serviceAccountName: 'admin-sa' is not allowed"),
    ],
)
def test_an_untrusted_spec_fails_naming_the_field_without_children(cluster: dict, field: str) -> None:
    api = FakeApi()
    body = rljob(api, cluster={"trainer": {"nodes": 1, "gpusPerNode": 8}, **cluster})
    with pytest.raises(kopf.PermanentError, match=re.escape(field)):
        reconcile.ensure(api, body)
    status = api.objects[("rljob", "job")]["status"]
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert status["phase"] == "Failed" and valid["status"] == "False" and field in valid["message"]
    assert {kind for kind, _ in api.objects} == {"rljob"}


def test_the_chart_can_allow_more_volume_types_and_service_accounts() -> None:
    api = FakeApi(Policy(allowed_volume_types=("hostPath",), allowed_service_accounts=("team-sa",)))
    cluster = {"trainer": {"nodes": 1, "gpusPerNode": 8}, "serviceAccountName": "team-sa"}
    reconcile.ensure(api, rljob(api, cluster={**cluster, "volumes": [{"name": "h", "hostPath": {"path": "/d"}}]}))
    head = api.objects[("rayjob", "job")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "team-sa"
    assert head["volumes"][-1] == {"name": "h", "hostPath": {"path": "/d"}}


def test_a_child_left_by_a_deleted_rljob_of_the_same_name_is_waited_for() -> None:
    api = FakeApi()
    old = rljob(api)
    reconcile.ensure(api, old)
    del api.objects[("rljob", "job")]
    new = rljob(api)
    with pytest.raises(kopf.TemporaryError, match="garbage collector"):
        reconcile.ensure(api, new)


def test_a_kept_checkpoint_claim_is_reused_by_a_new_rljob_of_the_same_name() -> None:
    api = FakeApi()
    reconcile.ensure(api, rljob(api))
    claim = api.objects[("claim", "job-checkpoints")]
    owned = [k for k in api.objects if k != ("claim", "job-checkpoints")]
    for key in owned:
        del api.objects[key]  # the RLJob deleted, its owned children collected; the claim (Retain) stays
    reconcile.ensure(api, rljob(api))
    assert api.objects[("claim", "job-checkpoints")] is claim
    assert ("rayjob", "job") in api.objects


def test_a_foreign_claim_with_the_checkpoint_claims_name_is_refused() -> None:
    api = FakeApi()
    api._create("claim", {"metadata": {"name": "job-checkpoints", "namespace": NS, "labels": {}}})
    with pytest.raises(kopf.PermanentError, match=r"storage\.claimName"):
        reconcile.ensure(api, rljob(api))


def test_a_child_owned_by_nobody_is_refused() -> None:
    api = FakeApi()
    api._create("configmap", {"metadata": {"name": "job-spec"}, "data": {}})
    with pytest.raises(kopf.PermanentError, match="not owned by this RLJob"):
        reconcile.ensure(api, rljob(api))
    assert ("rayjob", "job") not in api.objects


def test_status_write_retries_a_conflict_with_fresh_reads() -> None:
    api = FakeApi()
    body = rljob(api)
    api.status_conflicts = 2
    reconcile.ensure(api, body)
    assert api.calls.count("patch status") == 3
    assert api.objects[("rljob", "job")]["status"]["phase"] == "Pending"


def test_invalid_spec_fails_the_rljob_without_children() -> None:
    api = FakeApi()
    body = rljob(api, batch={"trainBatchSize": 9, "rolloutN": 4, "ppoMiniBatchSize": 3, "ppoMicroBatchSizePerGPU": 1})
    with pytest.raises(kopf.PermanentError, match="not divisible by 8 trainer GPUs"):
        reconcile.ensure(api, body)
    status = api.objects[("rljob", "job")]["status"]
    assert status["phase"] == "Failed"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Valid": "False", "Failed": "True"}
    assert ("rayjob", "job") not in api.objects and ("configmap", "job-spec") not in api.objects


def test_finished_rljobs_are_left_alone() -> None:
    api = FakeApi()
    body = rljob(api)
    body["status"] = {"phase": "Succeeded"}
    reconcile.ensure(api, body)
    assert api.calls == []


def test_a_running_job_that_fails_newer_rules_is_flagged_not_failed() -> None:
    api = FakeApi()
    body = rljob(api)
    reconcile.ensure(api, body)
    stored = api.objects[("rljob", "job")]
    stored["spec"]["batch"]["trainBatchSize"] = 9  # as if admitted under an older rule set
    with pytest.raises(kopf.PermanentError):
        reconcile.ensure(api, copy.deepcopy(stored))
    status = api.objects[("rljob", "job")]["status"]
    assert status["phase"] == "Pending"
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and "not applied to the running job" in valid["message"]


def test_an_unrenderable_update_of_a_live_job_is_flagged_not_failed() -> None:
    api = FakeApi()
    body = rljob(api)
    reconcile.ensure(api, body)
    stored = copy.deepcopy(api.objects[("rljob", "job")])
    stored["spec"]["cluster"]["volumes"] = [{"name": "kuberl-spec", "emptyDir": {}}]  # a name the operator uses
    with pytest.raises(kopf.PermanentError, match="kuberl-spec"):
        reconcile.apply_update(api, stored, body["spec"], stored["spec"])
    status = api.objects[("rljob", "job")]["status"]
    assert status["phase"] == "Pending"
    assert next(c for c in status["conditions"] if c["type"] == "Valid")["status"] == "False"
