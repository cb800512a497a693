"""rayjob_update_ops: what an RLJob spec change does to the live RayJob."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from kuberl.api.spec import RLJobSpec
from kuberl.operator.rayjob import rayjob_update_ops, render_rayjob

UID = "u-1"


def spec(**changes) -> RLJobSpec:
    doc = {
        "model": {"path": "/m"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["/d.parquet"]},
        "batch": {"trainBatchSize": 16, "rolloutN": 4, "ppoMiniBatchSize": 8, "ppoMicroBatchSizePerGPU": 4},
        "cluster": {"trainer": {"nodes": 1, "gpusPerNode": 8}},
    }
    for path, value in changes.items():
        target = doc
        *parents, leaf = path.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    return RLJobSpec.model_validate(doc)


def live(rendered: dict, jds: str, rv: str = "7") -> dict:
    obj = copy.deepcopy(rendered)
    obj["metadata"]["resourceVersion"] = rv
    obj["status"] = {"jobDeploymentStatus": jds}
    return obj


def apply(obj: dict, ops: list[dict]) -> dict:
    return jsonpatch.apply_patch(obj, ops)


def test_suspend_toggle_is_propagated_while_running_and_nothing_else() -> None:
    running = live(render_rayjob("j", "ns", UID, spec()), "Running")
    desired = render_rayjob("j", "ns", UID, spec(**{"runPolicy.suspend": True, "cluster.image": "new:1"}))
    ops = rayjob_update_ops(running, desired, suspend_changed=True)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1:] == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_unchanged_suspend_is_left_to_kueue() -> None:
    suspended_by_kueue = live(render_rayjob("j", "ns", UID, spec()), "Suspended")
    suspended_by_kueue["spec"]["suspend"] = True
    desired = render_rayjob("j", "ns", UID, spec())
    assert rayjob_update_ops(suspended_by_kueue, desired, suspend_changed=False) == []


def test_template_changes_apply_while_the_rayjob_has_no_cluster() -> None:
    old = render_rayjob("j", "ns", UID, spec(**{"runPolicy.suspend": True}))
    suspended = live(old, "Suspended")
    desired = render_rayjob("j", "ns", UID, spec(**{"cluster.image": "new:1", "runPolicy.activeDeadlineSeconds": 60}))
    ops = rayjob_update_ops(suspended, desired, suspend_changed=True)
    patched = apply(suspended, ops)
    assert patched["spec"] == desired["spec"]
    assert patched["metadata"]["annotations"] == desired["metadata"]["annotations"]


def test_removing_an_optional_field_removes_it_from_the_rayjob() -> None:
    old = render_rayjob("j", "ns", UID, spec(**{"runPolicy.activeDeadlineSeconds": 60}))
    desired = render_rayjob("j", "ns", UID, spec())
    patched = apply(live(old, ""), rayjob_update_ops(live(old, ""), desired, suspend_changed=False))
    assert "activeDeadlineSeconds" not in patched["spec"]


@pytest.mark.parametrize("jds", ["Initializing", "Running", "Retrying", "Suspending"])
def test_template_changes_wait_while_a_cluster_exists(jds: str) -> None:
    current = live(render_rayjob("j", "ns", UID, spec()), jds)
    desired = render_rayjob("j", "ns", UID, spec(**{"cluster.image": "new:1"}))
    assert rayjob_update_ops(current, desired, suspend_changed=False) == []


def test_queue_label_follows_while_suspended() -> None:
    old = render_rayjob("j", "ns", UID, spec(**{"runPolicy.suspend": True}))
    desired = render_rayjob("j", "ns", UID, spec(**{"runPolicy.suspend": True, "cluster.queueName": "q"}))
    patched = apply(live(old, "Suspended"), rayjob_update_ops(live(old, "Suspended"), desired, suspend_changed=False))
    assert patched["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
