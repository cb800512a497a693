"""Spec model behaviour: defaults, unknown fields, transition rules, derived batch quantities."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kuberl.api import RLJobSpec, parse_spec, plan_batches, validate_document
from kuberl.api.spec import Rollout
from kuberl.api.validation import InvalidSpec
from tests.api.cases import BASE


def test_defaults_follow_verl() -> None:
    spec = RLJobSpec.model_validate(BASE["spec"])
    assert spec.algorithm.clip_ratio_low == 0.2 and spec.algorithm.clip_ratio_high == 0.2
    assert spec.algorithm.clip_ratio_c == 3.0
    assert spec.algorithm.kl.coef == 0.001 and spec.algorithm.kl.loss.type == "k3"
    assert spec.algorithm.loss_agg_mode == "token-mean"
    assert spec.actor.optim.lr == 1e-6
    assert spec.rollout.gpu_memory_utilization == 0.5
    assert spec.data.max_prompt_length == 512 and spec.data.max_response_length == 512


def test_critic_learning_rate_defaults_to_verls_critic_value() -> None:
    spec = parse_spec({**BASE["spec"], "algorithm": {"advantageEstimator": "gae"}, "critic": {}})
    assert spec.critic is not None and spec.critic.optim.lr == 1e-5


def test_all_issues_are_reported_at_once() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["batch"]["ppoMicroBatchSizePerGPU"] = 3
    doc["spec"]["rollout"] = {"tensorParallelSize": 3, "topK": 0}
    fields = {i.field for i in validate_document(doc)}
    assert {"spec.batch.ppoMicroBatchSizePerGPU", "spec.rollout.tensorParallelSize", "spec.rollout.topK"} <= fields


def test_parse_spec_raises_with_every_field_named() -> None:
    spec = copy.deepcopy(BASE["spec"])
    spec["batch"]["rolloutN"] = 1
    spec["rollout"] = {"temperature": 0}
    try:
        parse_spec(spec)
    except InvalidSpec as exc:
        assert "spec.batch.rolloutN" in str(exc)
    else:
        raise AssertionError("expected InvalidSpec")


def test_batch_fields_are_immutable_while_running() -> None:
    old = copy.deepcopy(BASE)
    old["status"] = {"phase": "Running"}
    new = copy.deepcopy(old)
    new["spec"]["batch"]["trainBatchSize"] = 128
    issues = validate_document(new, old=old)
    assert [i.rule for i in issues] == ["batch-algorithm-immutable-while-active"]
    assert "while the job is Running" in issues[0].message


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("model.path", "/models/other"),
        ("data.trainFiles", ["/data/other.parquet"]),
        ("reward.function", "gsm8k"),
        ("storage", {"claimName": "elsewhere"}),
        ("cluster.trainer.nodes", 2),
        ("cluster.rollout", {"nodes": 1}),
    ],
)
def test_run_fields_are_immutable_while_running(path: str, value: object) -> None:
    old = copy.deepcopy(BASE)
    old["status"] = {"phase": "Running"}
    new = copy.deepcopy(old)
    *parents, last = path.split(".")
    node = new["spec"]
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    issues = [i for i in validate_document(new, old=old) if i.rule == "run-fields-immutable-while-active"]
    assert len(issues) == 1 and "suspend it first" in issues[0].message


def _running_with_rollout_pool() -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["rollout"] = {"placement": "separate", "overlap": "async"}
    doc["spec"]["cluster"]["rollout"] = {"nodes": 2, "gpusPerNode": 8}
    doc["status"] = {"phase": "Running"}
    return doc


@pytest.mark.parametrize("nodes", [1, 3])
def test_rollout_pool_size_may_change_while_running(nodes: int) -> None:
    old = _running_with_rollout_pool()
    new = copy.deepcopy(old)
    new["spec"]["cluster"]["rollout"]["nodes"] = nodes
    assert validate_document(new, old=old) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpusPerNode", 4),
        ("memory", "64Gi"),
        ("nodeSelector", {"pool": "spot"}),
        ("affinity", {"nodeAffinity": {}}),
        ("pod", {"hostNetwork": True}),
    ],
)
def test_other_rollout_pool_fields_are_immutable_while_running(key: str, value: object) -> None:
    old = _running_with_rollout_pool()
    new = copy.deepcopy(old)
    new["spec"]["cluster"]["rollout"][key] = value
    new["spec"]["cluster"]["rollout"]["nodes"] = 3
    issues = [i for i in validate_document(new, old=old) if i.rule == "run-fields-immutable-while-active"]
    assert len(issues) == 1 and "all but its nodes" in issues[0].message


def test_rollout_pool_affinity_may_be_removed_only_while_suspended() -> None:
    old = _running_with_rollout_pool()
    old["spec"]["cluster"]["rollout"]["affinity"] = {"nodeAffinity": {}}
    new = copy.deepcopy(old)
    del new["spec"]["cluster"]["rollout"]["affinity"]
    assert [i.rule for i in validate_document(new, old=old)] == ["run-fields-immutable-while-active"]
    old["status"]["phase"] = "Suspended"
    assert validate_document(new, old=old) == []


@pytest.mark.parametrize(
    ("rollout", "limit"),
    [
        ({}, 0),
        ({"overlap": "oneStepOffPolicy"}, 1),
        ({"overlap": "async"}, 1),
        ({"overlap": "async", "maxStaleness": 3}, 3),
    ],
)
def test_staleness_limit_follows_the_overlap(rollout: dict[str, Any], limit: int) -> None:
    assert Rollout.model_validate(rollout).staleness_limit == limit


def test_run_fields_may_change_while_suspended() -> None:
    old = copy.deepcopy(BASE)
    old["status"] = {"phase": "Suspended"}
    new = copy.deepcopy(old)
    new["spec"]["model"]["path"] = "/models/other"
    assert validate_document(new, old=old) == []


def test_batch_fields_may_change_while_suspended() -> None:
    old = copy.deepcopy(BASE)
    old["status"] = {"phase": "Suspended"}
    new = copy.deepcopy(old)
    new["spec"]["batch"]["trainBatchSize"] = 128
    assert validate_document(new, old=old) == []


def test_plan_counts_gradient_accumulation_per_gpu() -> None:
    plan = plan_batches(RLJobSpec.model_validate(BASE["spec"]))
    # 16 prompts × 4 responses / 8 GPUs = 8 rows per GPU per mini-batch; micro 4 → 2 accumulation steps
    assert plan.rows_per_gpu_per_mini_batch == 8
    assert plan.gradient_accumulation_steps == 2
    assert plan.optimizer_steps_per_step == 4
    assert plan.responses_per_step == 256


def test_doubles_print_as_the_apiserver_prints_them() -> None:
    from kuberl.api.celfuncs import format_string

    # Observed from kube-apiserver v1.37.2 for '%s'.format([x]) on `number` fields.
    observed = {3.0: "3", 0.001: "0.001", 1e-06: "1e-06", 123456.0: "123456", 100000.0: "100000", 2.75: "2.75"}
    for value, text in observed.items():
        assert format_string("%s", [value]) == text
    assert format_string("%s%% of %s", [50, "x"]) == "50% of x"
