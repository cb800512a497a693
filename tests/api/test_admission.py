"""The Python validator and the generated CRD refuse the same RLJobs on the same fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.api import load_documents, validate_document
from tests.api.cases import INVALID_CASES, InvalidCase
from tests.api.crd_eval import refused_fields

EXAMPLES = sorted(Path(__file__).resolve().parents[2].glob("examples/*.yaml"))


def _example_docs() -> list[tuple[str, dict]]:
    return [doc for path in EXAMPLES for doc in load_documents(path)]


def test_there_are_at_least_thirty_invalid_cases() -> None:
    assert len(INVALID_CASES) >= 30
    assert len({c.name for c in INVALID_CASES}) == len(INVALID_CASES)


@pytest.mark.parametrize(("source", "doc"), _example_docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_example_is_valid_for_python_validator(source: str, doc: dict) -> None:
    assert validate_document(doc) == []


@pytest.mark.parametrize(("source", "doc"), _example_docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_example_is_admitted_by_generated_crd(source: str, doc: dict) -> None:
    assert refused_fields(doc) == {}


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c.name)
def test_python_validator_refuses_on_the_field(case: InvalidCase) -> None:
    issues = validate_document(case.document)
    assert case.field in [i.field for i in issues], issues
    issue = next(i for i in issues if i.field == case.field)
    assert issue.rule == case.rule
    assert case.message in issue.message


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c.name)
def test_generated_crd_refuses_on_the_same_field(case: InvalidCase) -> None:
    refused = refused_fields(case.document)
    assert case.field in refused, refused
    python = {i.field: i.message for i in validate_document(case.document)}
    if case.rule != "schema":
        assert refused[case.field] == python[case.field]


def test_every_rule_has_a_failing_case() -> None:
    from kuberl.api.rules import RULES
    from tests.api.test_engine_rules import DECLARED_ENGINE_RULES

    tested = {c.rule for c in INVALID_CASES} | DECLARED_ENGINE_RULES
    untested = [r.id for r in RULES if r.id not in tested and not r.transition]
    assert untested == []
