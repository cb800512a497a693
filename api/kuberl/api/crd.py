"""Generate the RLJob CustomResourceDefinition from the spec models and the rules table.

pydantic's JSON schema is turned into a Kubernetes structural schema: `$ref`s inlined,
`Optional` collapsed, defaults (also those of `default_factory`) written out so the
apiserver defaults exactly like pydantic, OpenAPI v3.0 exclusive bounds, and pass-through
objects marked `x-kubernetes-preserve-unknown-fields`.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kuberl.api import rules as rules_table
from kuberl.api.contract import GROUP, KIND, PLURAL, VERSION
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Condition, RLJobStatus

_DROP = {"title", "additionalProperties", "$defs"}


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from `root`, by the name pydantic uses in `$defs`."""
    found: dict[str, type[BaseModel]] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            stack += [a for a in _type_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return found


def _type_args(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in getattr(annotation, "__args__", ()) or ():
        out += _type_args(arg)
    return out


def field_default(field: FieldInfo) -> Any:
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, (list, dict, str, int, float, bool)):
        return value.value if hasattr(value, "value") else value
    return None


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        self.schema = root.model_json_schema(by_alias=True)
        self.defs = self.schema.get("$defs", {})
        self.models = _models(root)
        self.root = root

    def convert(self, node: dict[str, Any], model: type[BaseModel] | None = None) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            resolved = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return self.convert(resolved, self.models.get(name))
        if "anyOf" in node:
            branches = [b for b in node["anyOf"] if b.get("type") != "null"]
            if len(branches) != 1:
                raise ValueError(f"cannot express a union in a structural schema: {node}")
            merged = {**branches[0], **{k: v for k, v in node.items() if k != "anyOf"}}
            return self.convert(merged, model)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or (key == "default" and value is None):
                continue
            if key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                bound = "minimum" if key == "exclusiveMinimum" else "maximum"
                out[bound] = value
                out[key] = True
            elif key == "properties":
                out[key] = {name: self._property(name, prop, model) for name, prop in value.items()}
            elif key == "items":
                out[key] = self.convert(value)
            else:
                out[key] = value
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = self.convert(extra)
        elif extra is True or (node.get("type") == "object" and "properties" not in node and extra is None):
            out["x-kubernetes-preserve-unknown-fields"] = True
        if "enum" in out and "type" not in out:
            out["type"] = "string"
        return out

    def _property(self, name: str, prop: dict[str, Any], model: type[BaseModel] | None) -> dict[str, Any]:
        converted = self.convert(prop)
        field = _field_by_alias(model, name) if model else None
        if field is not None and not field.is_required():
            default = field_default(field)
            if default is not None:
                converted["default"] = default
        return converted


def _field_by_alias(model: type[BaseModel], alias: str) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if (field.alias or name) == alias:
            return field
    return None


def _validations(scope: str) -> list[dict[str, Any]]:
    out = []
    for rule in rules_table.RULES:
        if rule.scope != scope:
            continue
        entry: dict[str, Any] = {
            "rule": rule.cel,
            "message": rule.static_message,
            "messageExpression": rule.message_expression,
            "reason": "FieldValueForbidden" if rule.transition else "FieldValueInvalid",
        }
        if rule.scope == "spec":
            entry["fieldPath"] = "." + rule.field
        out.append(entry)
    return out


def openapi_schema() -> dict[str, Any]:
    spec = _Converter(RLJobSpec).convert(_Converter(RLJobSpec).schema, RLJobSpec)
    spec["description"] = "What to train and where. Batch semantics are verl's; see docs/api.md."
    spec["x-kubernetes-validations"] = _validations("spec")
    status = _Converter(RLJobStatus).convert(_Converter(RLJobStatus).schema, RLJobStatus)
    status["description"] = "Observed state, written by the operator and the trainer."
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["required"] = [f.alias or n for n, f in Condition.model_fields.items() if f.is_required()]
    return {
        "type": "object",
        "description": "An RL post-training job (PPO, GRPO, RLOO, REINFORCE++) run as a KubeRay RayJob.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": _validations("root"),
    }


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    # why the Ray cluster is not running (PodForbidden, Unschedulable, ...), RayClusterReady once it is
    {"name": "Cluster", "type": "string", "jsonPath": '.status.conditions[?(@.type=="ClusterReady")].reason'},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.rewardMean"},
    {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percentComplete"},
    {"name": "ETA", "type": "string", "jsonPath": ".status.progress.estimatedRemainingTimeSummary"},
    # rollout engines in use (separate pool; the trainer reports them) and the rollout pods ready (the operator)
    {"name": "Engines", "type": "integer", "jsonPath": ".status.progress.rolloutEngines"},
    {"name": "RolloutPods", "type": "integer", "jsonPath": ".status.rollout.readyReplicas", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Total", "type": "integer", "jsonPath": ".status.progress.totalSteps", "priority": 1},
    {"name": "Algorithm", "type": "string", "jsonPath": ".spec.algorithm.advantageEstimator", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "RayJob", "type": "string", "jsonPath": ".status.rayJobName", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


def render_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "kuberl"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rlj"],
                "categories": ["kuberl"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Quotes the strings YAML 1.1 reads as booleans (kubectl's parser turns a key `n:` into false)."""


_YAML11_BOOLS = {"y", "n", "yes", "no", "on", "off", "true", "false"}


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "'" if value.lower() in _YAML11_BOOLS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)

HEADER = "# Generated by `kuberl crd` from kuberl.api (spec models + rules table). Do not edit.\n"


def crd_yaml() -> str:
    return HEADER + yaml.dump(render_crd(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
