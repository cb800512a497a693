"""Builtins that run the policy's programs (the code_tests rewards, the python tool) are admitted with the sandbox
pool they run in, offline and by the CRD's CEL, and refused without it (tests/api/cases.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kuberl.api import validate_document
from tests.api.cases import BASE
from tests.api.crd_eval import refused_fields


def with_spec(**parts: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(parts)
    return doc


ADMITTED = {
    "code_tests with its pool": with_spec(reward={"function": "code_tests", "sandbox": {}}),
    "code_tests_all_pass with its pool": with_spec(reward={"function": "code_tests_all_pass", "sandbox": {}}),
    "the python tool with its pool": with_spec(rollout={"agent": {"tools": [{"name": "python"}], "sandbox": {}}}),
    "python under another name with its pool": with_spec(
        rollout={"agent": {"tools": [{"name": "run", "function": "python"}], "sandbox": {}}}
    ),
    "a tool named python that is the user's needs no pool": with_spec(
        rollout={"agent": {"tools": [{"name": "python", "function": "my_tools:python"}]}}
    ),
    "a custom function may use a pool": with_spec(reward={"function": "score:compute", "sandbox": {}}),
}


@pytest.mark.parametrize("doc", ADMITTED.values(), ids=ADMITTED.keys())
def test_sandboxed_builtins_with_their_pool_are_admitted(doc: dict[str, Any]) -> None:
    assert validate_document(doc) == []
    assert refused_fields(doc) == {}
