"""An independent reading of the generated CRD: structural defaulting, the OpenAPI schema and its CEL rules.

It does what the apiserver does with `crds/rljob.yaml`, without the Python models, so the
tests can check that the CRD and `kuberl.api.validate_document` give the same verdicts.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import cel
import jsonschema
import yaml

from kuberl.api.celfuncs import context
from kuberl.api.validation import field_path

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "rljob.yaml"


@cache
def load_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a default, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = apply_defaults(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields become errors (what `kubectl apply --validate=strict` asks of the server)."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _strict(schema["items"])
    return out


@cache
def _validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_strict(load_schema()))


def _dotted(path: Any) -> str:
    parts = list(path)
    return field_path(str(parts[0]), tuple(parts[1:])) if parts else ""


def refused_fields(document: dict[str, Any]) -> dict[str, str]:
    """Field path → message for everything the CRD refuses in `document` (on create)."""
    schema = load_schema()
    validator = _validator()
    doc = apply_defaults(schema, copy.deepcopy(document))
    errors: dict[str, str] = {}
    for error in validator.iter_errors(doc):
        path = _dotted(error.absolute_path)
        if error.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", error.message)[0]
            errors[f"{path}.{missing}" if path else missing] = "Required value"
        elif error.validator == "additionalProperties":
            for extra in re.findall(r"'([^']+)' was unexpected", error.message):
                errors[f"{path}.{extra}" if path else extra] = error.message
        else:
            errors[path] = error.message
    if errors:
        return errors
    scopes = [
        ("", schema, {"metadata": {"name": doc["metadata"]["name"]}, **doc}),
        ("spec", schema["properties"]["spec"], doc["spec"]),
    ]
    for prefix, node, value in scopes:
        for rule in node.get("x-kubernetes-validations", []):
            if "oldSelf" in rule["rule"]:
                continue
            if cel.evaluate(rule["rule"], context({"self": value})) is not True:
                field = prefix + rule["fieldPath"] if "fieldPath" in rule else _root_field(rule)
                errors[field] = str(cel.evaluate(rule["messageExpression"], context({"self": value})))
    return errors


def _root_field(rule: dict[str, Any]) -> str:
    """Root rules carry no fieldPath (the apiserver reports them on the object); name what they read."""
    return "metadata.name" if "metadata.name" in rule["rule"] else ""
