"""kopf's last-handled-configuration annotation stays small however large the spec's strings are."""

from __future__ import annotations

import json

import kopf

from kuberl.operator.settings import BoundedDiffBaseStorage


def test_long_strings_are_stored_as_hashes_and_changes_still_show() -> None:
    storage = BoundedDiffBaseStorage(prefix="kuberl.io", key="last-handled-configuration")
    spec = {"cluster": {"env": [{"name": f"V{i}", "value": "x" * 4096} for i in range(4)]}, "runPolicy": {}}
    body = kopf.Body({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "a"}, "spec": spec})
    essence = storage.build(body=body)
    assert len(json.dumps(essence)) < 2000
    assert essence["spec"]["runPolicy"] == {}
    changed = json.loads(json.dumps(spec))
    changed["cluster"]["env"][0]["value"] = "y" * 4096
    other = storage.build(body=kopf.Body({**body, "spec": changed}))
    assert other["spec"]["cluster"]["env"][0] != essence["spec"]["cluster"]["env"][0]
    assert other["spec"]["cluster"]["env"][1] == essence["spec"]["cluster"]["env"][1]


def test_a_large_free_form_affinity_is_stored_as_a_hash_and_runpolicy_stays_plain() -> None:
    storage = BoundedDiffBaseStorage(prefix="kuberl.io", key="last-handled-configuration")
    expression = {"key": "kubernetes.io/hostname", "operator": "In"}
    terms = [{"matchExpressions": [{**expression, "values": [f"node-{i}"]}]} for i in range(4000)]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    spec = {"cluster": {"trainer": {"nodes": 1, "affinity": affinity}}, "runPolicy": {"suspend": True}}
    assert len(json.dumps(spec)) > 290 * 1024
    body = kopf.Body({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "a"}, "spec": spec})
    essence = storage.build(body=body)
    assert len(json.dumps(essence)) < 4096
    assert essence["spec"]["runPolicy"] == {"suspend": True}  # what the update handler reads
    assert essence["spec"]["cluster"]["trainer"]["nodes"] == 1  # the innermost large value went, not its parents
    changed = json.loads(json.dumps(spec))
    changed["cluster"]["trainer"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][-1]["matchExpressions"][0]["values"] = ["other"]
    other = storage.build(body=kopf.Body({**body, "spec": changed}))
    assert other["spec"]["cluster"] != essence["spec"]["cluster"]
    assert other["spec"]["runPolicy"] == essence["spec"]["runPolicy"]
