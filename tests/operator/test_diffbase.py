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
