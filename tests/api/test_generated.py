"""Generated files are fresh and the CRD stays within what the apiserver accepts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kuberl.api.crd import crd_yaml
from kuberl.api.docs import api_markdown
from kuberl.api.rules import RULES, VERL_CHECKS

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_is_fresh() -> None:
    assert (ROOT / "crds/rljob.yaml").read_text() == crd_yaml(), "crds/rljob.yaml is stale: run `kuberl crd`"


def test_committed_api_docs_are_fresh() -> None:
    assert (ROOT / "docs/api.md").read_text() == api_markdown(), "docs/api.md is stale: run `kuberl docs`"


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], path + "[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], path + "{}")


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(crd_yaml())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_every_string_list_and_map_in_spec_is_bounded() -> None:
    unbounded = []
    for path, node in _nodes(_spec_schema()):
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
    assert unbounded == []


def test_every_number_in_spec_has_a_range() -> None:
    missing = [
        p for p, node in _nodes(_spec_schema()) if node.get("type") in ("integer", "number") and "maximum" not in node
    ]
    assert missing == []


def test_rules_have_unique_ids_and_single_line_messages() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert all("\n" not in r.static_message and r.verl for r in RULES)


def test_every_verl_rule_a_rule_names_is_listed() -> None:
    assert {r.verl for r in RULES} - {"ours"} == set(VERL_CHECKS)


def test_rule_fields_exist_in_the_schema() -> None:
    paths = {path for path, _ in _nodes(_spec_schema())}
    for rule in RULES:
        if rule.scope == "spec":
            assert "." + rule.field in paths, rule.id
