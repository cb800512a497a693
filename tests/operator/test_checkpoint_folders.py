"""One checkpoint folder, one RLJob: locations as two RLJobs compare them, and which of two keeps a shared folder."""

from __future__ import annotations

from typing import Any

from kuberl.api.contract import CHECKPOINT_MOUNT
from kuberl.api.spec import RLJobSpec
from kuberl.operator.checkpoint_folders import checkpoint_location, shared_folder_issue
from tests.operator.test_rayjob_render import base_spec

PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "team-data"}}


def spec(**changes: Any) -> RLJobSpec:
    doc = base_spec()
    doc.update(changes)
    return RLJobSpec.model_validate(doc)


def obj(name: str, uid: str, created: str, spec_doc: dict[str, Any], **status: Any) -> dict[str, Any]:
    meta = {"name": name, "uid": uid, "creationTimestamp": created}
    return {"metadata": meta, "spec": spec_doc, "status": status}


def test_a_relative_folder_is_the_rljobs_own_on_the_claim() -> None:
    job = spec(storage={"claimName": "shared"})
    assert checkpoint_location(job, "a", "u1") == ("claim shared", f"{CHECKPOINT_MOUNT}/a-u1/checkpoints")
    assert checkpoint_location(job, "a", "u1") != checkpoint_location(job, "a", "u2")  # recreated: a new folder


def test_a_folder_on_a_user_volume_is_compared_by_the_volume_and_the_path_within_it() -> None:
    def on(mount_path: str, sub_path: str | None, directory: str) -> RLJobSpec:
        mount = {"name": "data", "mountPath": mount_path, **({"subPath": sub_path} if sub_path else {})}
        cluster = {"trainer": {"nodes": 2, "gpusPerNode": 8}, "volumes": [PVC], "volumeMounts": [mount]}
        return spec(storage={}, cluster=cluster, trainer={"checkpointDir": directory})

    same = checkpoint_location(on("/data", None, "/data/runs/x"), "a", "u1")
    assert same == checkpoint_location(on("/mnt", None, "/mnt/runs/x"), "b", "u2")  # another mount path, one folder
    assert same == checkpoint_location(on("/mnt", "runs", "/mnt/x"), "b", "u2")  # a subPath of the same volume
    assert same != checkpoint_location(on("/data", None, "/data/runs/y"), "b", "u2")


def test_a_pod_local_volume_is_never_shared() -> None:
    cluster = {
        "trainer": {"nodes": 1, "gpusPerNode": 1},
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp/c"}],
    }
    assert checkpoint_location(spec(storage={}, cluster=cluster, trainer={"checkpointDir": "/tmp/c"}), "a", "u") is None


def test_of_two_rljobs_on_one_absolute_folder_the_running_one_keeps_it() -> None:
    doc = {**base_spec(), "storage": {"claimName": "shared"}, "trainer": {"checkpointDir": f"{CHECKPOINT_MOUNT}/run"}}
    running = obj("first", "zzz", "2026-12-05T10:00:00Z", doc, rayJobName="first")
    newer = obj("second", "aaa", "2026-12-05T10:00:00Z", doc)  # the same second, a smaller uid
    issue = shared_folder_issue(newer, RLJobSpec.model_validate(doc), lambda: [running, newer])
    assert issue is not None and "RLJob first (uid zzz)" in issue and f"{CHECKPOINT_MOUNT}/run" in issue
    assert shared_folder_issue(running, RLJobSpec.model_validate(doc), lambda: [running, newer]) is None


def test_an_rljob_the_operator_refused_holds_no_folder() -> None:
    doc = {**base_spec(), "storage": {"claimName": "shared"}, "trainer": {"checkpointDir": f"{CHECKPOINT_MOUNT}/run"}}
    refused = obj("old", "u0", "2026-12-05T09:00:00Z", doc, conditions=[{"type": "Valid", "status": "False"}])
    new = obj("new", "u1", "2026-12-05T10:00:00Z", doc)
    assert shared_folder_issue(new, RLJobSpec.model_validate(doc), lambda: [refused, new]) is None
