"""Offline admission: the schema (pydantic) and the rules table (CEL), as the apiserver applies them."""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import cel
from pydantic import BaseModel, ValidationError

from kuberl.api import celfuncs
from kuberl.api.contract import API_VERSION, KIND
from kuberl.api.rules import POD_RULES, RULES, Rule
from kuberl.api.spec import QUANTITY_PATTERN, RLJobSpec
from kuberl.api.verl import suggestion_for


@dataclass(frozen=True)
class Issue:
    field: str
    """Dotted path from the object root, e.g. `spec.batch.ppoMiniBatchSize`."""
    message: str
    rule: str
    """The rule id, or `schema` for type, range and unknown-field errors."""

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidSpec(ValueError):
    """An RLJob that admission would refuse; carries every issue at once."""

    def __init__(self, issues: list[Issue], source: str = "RLJob") -> None:
        self.issues = issues
        super().__init__(f"{source} is invalid:\n" + "\n".join(f"  {i}" for i in issues))


@cache
def _program(expression: str) -> cel.Program:
    return cel.compile(expression)


def _evaluate(expression: str, context: cel.Context) -> Any:
    return _program(expression).execute(context)


def check_rule(rule: Rule, context: cel.Context) -> Issue | None:
    """Evaluate one rule; `context` binds `self` (and `oldSelf` for transition rules)."""
    try:
        ok = _evaluate(rule.cel, context)
    except Exception as exc:  # an evaluation error refuses the object, as on the apiserver
        return Issue(rule.path, f"rule {rule.id} could not be evaluated: {exc}", rule.id)
    if ok is True:
        return None
    try:
        message = str(_evaluate(rule.message_expression, context))
    except Exception:
        message = rule.static_message
    return Issue(rule.path, message, rule.id)


def spec_to_wire(spec: RLJobSpec) -> dict[str, Any]:
    """The spec as the apiserver stores it after defaulting: camelCase, absent optionals omitted."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def schema_issues(error: ValidationError, model: type[BaseModel], prefix: str) -> list[Issue]:
    issues = []
    for err in error.errors():
        loc = [str(p) for p in err["loc"]]
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field" + _did_you_mean(model, loc)
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["type"] == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == QUANTITY_PATTERN:
            message = quantity_message(str(err["input"]))
        elif "input" in err and err["type"] not in ("model_type", "dict_type"):
            message = f"{message} (got {err['input']!r})"
        issues.append(Issue(field_path(prefix, err["loc"]), message, "schema"))
    return issues


QUANTITY_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5}  # a suffix's power of 1024 (Ki) or 1000 (k)


def quantity_message(value: str) -> str:
    """Why `value` is not a Kubernetes quantity, with the spelling to use (`4GB` → 4Gi or 4G)."""
    message = f"{value!r} is not a Kubernetes quantity"
    in_bytes = re.fullmatch(r"\s*([0-9.]+)\s*([kKMGTP])(i?)B\s*", value)
    if in_bytes is None:
        return f"{message}: a number with an optional suffix, such as 16, 500m, 64Gi or 1.5G"
    number, prefix, binary = in_bytes.groups()
    prefix = prefix.upper()
    power = QUANTITY_POWERS[prefix]
    if binary:
        return f"{message}: write {number}{prefix}i ({number} × 2^{10 * power} bytes); quantities have no B"
    decimal = "k" if prefix == "K" else prefix
    return (
        f"{message}: write {number}{prefix}i ({number} × 2^{10 * power} bytes) or {number}{decimal} "
        f"({number} × 10^{3 * power}); quantities have no B"
    )


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 issue`, `2 issues`."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def invalid_text(source: str, name: str, issues: list[Issue]) -> str:
    """What every command prints for an invalid RLJob: the count, then one line per issue with its rule."""
    lines = [f"{source}: RLJob {name} is invalid ({plural(len(issues), 'issue')})"]
    lines += [f"  {issue.field}: {issue.message}  [{issue.rule}]" for issue in issues]
    return "\n".join(lines)


def field_path(prefix: str, loc: tuple[int | str, ...]) -> str:
    """A pydantic location in the apiserver's notation (`spec.tools[0].name`), so both name a field alike."""
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _did_you_mean(model: type[BaseModel], loc: list[str]) -> str:
    """Find the fields allowed where the unknown one sits and suggest the nearest."""
    current: Any = model
    for part in loc[:-1]:
        current = _field_type(current, part)
        if current is None:
            return ""
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return ""
    verl_field = suggestion_for(loc)
    if verl_field is not None:
        return f"; did you mean 'spec.{verl_field}'? (a verl name; docs/api.md maps verl's keys, `kuberl import-verl` converts)"
    names = [f.alias or n for n, f in current.model_fields.items()]
    python_name = current.model_fields.get(loc[-1])
    if python_name is not None and python_name.alias:
        return f"; did you mean {python_name.alias!r}? (manifests use the camelCase wire names)"
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(names)}"


def _field_type(model: Any, part: str) -> Any:
    if part.isdigit():
        return model
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    for name, info in model.model_fields.items():
        if part in (name, info.alias):
            return _unwrap(info.annotation)
    return None


def _unwrap(annotation: Any) -> Any:
    """Optional[X] and list[X] → X: the model that holds the next path element."""
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def parse_spec(spec: dict[str, Any], source: str = "RLJob") -> RLJobSpec:
    """Validate a spec dict (camelCase) against schema and rules, except those about Kubernetes pods (POD_RULES:
    the trainer may run on one machine); raise InvalidSpec listing every issue."""
    document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": spec}
    issues = [i for i in validate_document(document) if not i.field.startswith("metadata") and i.rule not in POD_RULES]
    if issues:
        raise InvalidSpec(issues, source)
    return RLJobSpec.model_validate(spec)


def parse_wire(spec: Any) -> tuple[RLJobSpec | None, list[Issue]]:
    """Parse a spec by its wire (camelCase) names only, as the CRD's schema does.

    On schema issues, the spec is parsed again with the refused values left out (their defaults in place) so the
    rules can still be checked and every issue reported at once; None when that is not possible (a required field
    is missing or a list item is refused).
    """
    try:
        return RLJobSpec.model_validate(spec, strict=True, by_alias=True, by_name=False), []
    except ValidationError as exc:
        errors = exc.errors()
        issues = schema_issues(exc, RLJobSpec, "spec")
    repaired = copy.deepcopy(spec)
    if not all(err["type"] != "missing" and _drop(repaired, err["loc"]) for err in errors):
        return None, issues
    try:
        return RLJobSpec.model_validate(repaired, strict=True, by_alias=True, by_name=False), issues
    except ValidationError:
        return None, issues


def _drop(node: Any, loc: tuple[int | str, ...]) -> bool:
    """Remove the value at `loc` from nested mappings; False when `loc` does not lead through mappings."""
    for part in loc[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if not isinstance(node, dict) or loc[-1] not in node:
        return False
    del node[loc[-1]]
    return True


def validate_document(doc: Any, old: dict[str, Any] | None = None) -> list[Issue]:
    """Every issue the apiserver would raise for this RLJob (and, with `old`, for an update of it)."""
    if not isinstance(doc, dict):
        return [Issue("", f"an RLJob must be a mapping, got {type(doc).__name__}", "schema")]
    issues = []
    if doc.get("apiVersion") != API_VERSION:
        issues.append(Issue("apiVersion", f"expected {API_VERSION}, got {doc.get('apiVersion')!r}", "schema"))
    if doc.get("kind") != KIND:
        issues.append(Issue("kind", f"expected {KIND}, got {doc.get('kind')!r}", "schema"))
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        issues.append(Issue("metadata.name", "required field is missing", "schema"))
        metadata = {"name": ""}
    unknown = sorted(set(doc) - {"apiVersion", "kind", "metadata", "spec", "status"})
    issues += [Issue(key, "unknown field", "schema") for key in unknown]
    if "spec" not in doc:
        return [*issues, Issue("spec", "required field is missing", "schema")]
    spec, refused = parse_wire(doc["spec"])
    issues += refused
    if spec is None:
        return issues
    wire = {"metadata": {"name": metadata["name"]}, "spec": spec_to_wire(spec)}
    if "status" in doc:
        wire["status"] = doc["status"]
    # one CEL context per scope: converting the object into CEL values costs more than evaluating a rule
    contexts = {
        "spec": celfuncs.context({"self": wire["spec"]}),
        "root": celfuncs.context({"self": wire, "oldSelf": _old_wire(old) if old is not None else None}),
    }
    refused_fields = {next(p for p in reversed(i.field.split(".")) if not p.isdigit()) for i in refused}
    for rule in RULES:
        if rule.transition and old is None:
            continue
        if any(re.search(rf"\.{re.escape(name)}\b", rule.cel) for name in refused_fields):
            continue  # the rule would read a default in place of the refused value
        issue = check_rule(rule, contexts[rule.scope])
        if issue:
            issues.append(issue)
    return issues


def _old_wire(old: dict[str, Any]) -> dict[str, Any]:
    wire: dict[str, Any] = {"metadata": {"name": old.get("metadata", {}).get("name", "")}}
    try:
        wire["spec"] = spec_to_wire(RLJobSpec.model_validate(old.get("spec", {}), by_alias=True, by_name=False))
    except ValidationError:
        wire["spec"] = old.get("spec", {})
    if "status" in old:
        wire["status"] = old["status"]
    return wire
