"""Admission reads what each rollout engine can do from kuberl.api.engines: an engine declared at run time (as the
trainer's registry declares one) is admitted where its capabilities allow and refused, on the field, where they do
not. Three of the rules no builtin engine can fail (every builtin returns log-probs, overlaps and continues a
partial rollout); they are tested here with declared engines."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest

from kuberl.api import validate_document
from kuberl.api.engines import ENGINES, EngineCapabilities, declare_engine
from tests.api.cases import BASE

DECLARED_ENGINE_RULES = {"engine-log-probs", "engine-overlap", "engine-partial-rollouts"}
"""Rules of kuberl.api.rules whose failing cases need a declared engine (tests/api/test_admission.py counts them)."""

PLAIN = EngineCapabilities(
    devices=frozenset({"cpu"}),
    separate_devices=frozenset(),
    colocated=True,
    transports=frozenset(),
    tensor_parallel=False,
    log_probs=False,
    overlap=False,
    partial_rollouts=False,
    max_lora_rank=8,
)
"""A CPU engine that can do little: colocated only, no log-probs, LoRA up to rank 8."""


@pytest.fixture
def plain_engine() -> Iterator[str]:
    declare_engine("plain", PLAIN)
    yield "plain"
    del ENGINES["plain"]


def cpu_job(**rollout: object) -> dict:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["device"] = "cpu"
    doc["spec"].setdefault("rollout", {}).update(rollout)
    return doc


def issues_by_rule(doc: dict) -> dict[str, str]:
    return {i.rule: f"{i.field}: {i.message}" for i in validate_document(doc)}


def test_a_declared_engine_is_admitted_where_its_capabilities_allow(plain_engine: str) -> None:
    assert validate_document(cpu_job(engine=plain_engine)) == []


def test_an_undeclared_engine_is_a_schema_error_naming_the_known_ones() -> None:
    (issue,) = validate_document(cpu_job(engine="plain"))
    assert issue.field == "spec.rollout.engine" and issue.rule == "schema"
    assert "unknown rollout engine 'plain'; known: vllm, hf" in issue.message


def test_an_engine_without_log_probs_refuses_calculate_log_probs(plain_engine: str) -> None:
    issues = issues_by_rule(cpu_job(engine=plain_engine, calculateLogProbs=True))
    assert issues["engine-log-probs"] == (
        "spec.rollout.calculateLogProbs: rollout.calculateLogProbs is true but rollout.engine plain does not return "
        "the log-probs of the tokens it samples; engines that do: vllm, hf"
    )


def test_an_engine_that_cannot_overlap_or_run_separate_refuses_both(plain_engine: str) -> None:
    doc = cpu_job(engine=plain_engine, placement="separate", overlap="oneStepOffPolicy")
    doc["spec"]["cluster"]["rollout"] = {"nodes": 1, "gpusPerNode": 1}
    issues = issues_by_rule(doc)
    assert "engines that can: vllm, hf" in issues["engine-overlap"]
    assert issues["engine-placement"].endswith("cannot run separate on cluster.device cpu; engines that can: hf")


def test_an_engine_that_cannot_continue_a_generation_refuses_partial_rollouts() -> None:
    declare_engine("overlapping", dataclasses.replace(PLAIN, separate_devices=frozenset({"cpu"}), overlap=True))
    try:
        doc = cpu_job(engine="overlapping", placement="separate", overlap="async", partialRollouts=True)
        doc["spec"]["cluster"]["rollout"] = {"nodes": 1, "gpusPerNode": 1}
        issues = issues_by_rule(doc)
    finally:
        del ENGINES["overlapping"]
    assert issues == {
        "engine-partial-rollouts": "spec.rollout.partialRollouts: rollout.partialRollouts continues a generation "
        "interrupted by a weight update with the new weights, which rollout.engine overlapping cannot; engines that "
        "can: vllm, hf"
    }


def test_the_lora_rank_limit_is_the_engines_own(plain_engine: str) -> None:
    doc = cpu_job(engine=plain_engine)
    doc["spec"]["model"]["lora"] = {"rank": 16}
    assert issues_by_rule(doc)["lora-rank-fits-engine"].endswith("the largest LoRA rank rollout.engine plain takes, 8")
    doc["spec"]["model"]["lora"] = {"rank": 8}
    assert validate_document(doc) == []


def test_declaring_an_engine_twice_is_an_error(plain_engine: str) -> None:
    with pytest.raises(ValueError, match="rollout engine 'plain' is declared already"):
        declare_engine(plain_engine, PLAIN)
