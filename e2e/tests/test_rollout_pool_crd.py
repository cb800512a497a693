"""The elastic rollout pool on a real apiserver: while an RLJob is Running, `spec.cluster.rollout.nodes` (the size of
its separate rollout pool) may change and every other field of the pool may not (the transition rule
`run-fields-immutable-while-active`, compiled into the CRD)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from e2e.harness import Cluster, rljob_crd_file


def _running_rljob(cluster: Cluster, namespace: str) -> tuple[str, dict[str, Any]]:
    """An RLJob with a separate rollout pool of 2 pods, stored with the status phase Running: its path and body."""
    from kuberl.api import API_VERSION, PLURAL
    from tests.api.cases import BASE

    if rljob_crd_file() in cluster.crd_errors:
        pytest.skip("the apiserver refused crds/rljob.yaml (see test_rljob_crd_is_accepted_and_established)")
    doc = copy.deepcopy(BASE)
    doc["metadata"] = {"name": "elastic"}
    doc["spec"]["rollout"] = {"placement": "separate", "overlap": "async", "maxStaleness": 2}
    doc["spec"]["cluster"]["rollout"] = {"nodes": 2, "gpusPerNode": 8}
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    status, body = cluster.request("POST", path, doc)
    assert status == 201, body
    stored = json.loads(body)
    stored["status"] = {"phase": "Running"}
    item = f"{path}/elastic"
    status, body = cluster.request("PUT", f"{item}/status", stored)
    assert status == 200, body
    return item, json.loads(body)


def test_the_rollout_pool_is_resized_while_running(cluster: Cluster, namespace: str) -> None:
    item, running = _running_rljob(cluster, namespace)
    for nodes in (1, 3):
        running["spec"]["cluster"]["rollout"]["nodes"] = nodes
        status, body = cluster.request("PUT", item, running)
        assert status == 200, body
        running = json.loads(body)
        assert running["spec"]["cluster"]["rollout"]["nodes"] == nodes


@pytest.mark.parametrize(("key", "value"), [("gpusPerNode", 4), ("nodeSelector", {"pool": "spot"})])
def test_other_rollout_pool_fields_are_refused_while_running(
    cluster: Cluster, namespace: str, key: str, value: object
) -> None:
    item, running = _running_rljob(cluster, namespace)
    running["spec"]["cluster"]["rollout"][key] = value
    running["spec"]["cluster"]["rollout"]["nodes"] = 3
    status, body = cluster.request("PUT", item, running)
    assert status == 422, body
    message = json.loads(body)["message"]
    assert "cluster.rollout (all but its nodes" in message and "cannot change while the job is Running" in message
