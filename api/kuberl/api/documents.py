"""Read RLJob manifests (multi-document YAML) and check them as admission would."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kuberl.api import yaml12
from kuberl.api.batching import BatchPlan, plan_batches
from kuberl.api.contract import API_VERSION, GROUP, KIND
from kuberl.api.overrides import apply_overrides
from kuberl.api.policy import OPERATOR_RULES, Policy, operator_issues
from kuberl.api.rules import POD_RULES
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import InvalidSpec, Issue, validate_document


@dataclass
class Checked:
    source: str
    """`file.yaml` or `file.yaml#2` for the second document."""
    name: str
    issues: list[Issue] = field(default_factory=list)
    plan: BatchPlan | None = None
    skipped_kind: str | None = None
    """Set for a document of another kind (a claim next to the RLJob): reported, not validated."""
    device: str = "cuda"

    @property
    def valid(self) -> bool:
        return not self.issues


STDIN = "-"
MANIFEST_SUFFIXES = (".yaml", ".yml")


def manifest_files(path: str | Path) -> list[Path]:
    """`path` itself, or the YAML files of a folder (sorted; its subfolders are not read)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"{path}: a folder with no .yaml or .yml file")
    return files


def load_documents(path: str | Path) -> list[tuple[str, Any]]:
    """Every non-empty YAML document of `path` ('-': stdin), labelled with where it came from."""
    source = "<stdin>" if str(path) == STDIN else str(path)
    try:
        text = sys.stdin.read() if str(path) == STDIN else Path(path).read_text()
    except IsADirectoryError as exc:
        raise ValueError(f"{source}: a folder; give its files, or the folder to `kuberl validate`") from exc
    except OSError as exc:
        raise FileNotFoundError(f"{source}: cannot read: {exc.strerror}") from exc
    try:
        docs = [d for d in yaml12.load_all(text, source) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from exc
    if not docs:
        raise ValueError(f"{source}: holds no YAML document (expected an RLJob)")
    if len(docs) == 1:
        return [(source, docs[0])]
    return [(f"{source}#{i + 1}", doc) for i, doc in enumerate(docs)]


def is_other_kind(doc: Any) -> bool:
    """A Kubernetes object that is not meant as an RLJob: another kind outside the kuberl.io group."""
    if not isinstance(doc, dict) or doc.get("kind") == KIND:
        return False
    group = str(doc.get("apiVersion", "")).split("/")[0]
    return isinstance(doc.get("kind"), str) and group != GROUP


def looks_like_verl(doc: Any) -> bool:
    """A verl YAML (its top-level sections, no kind) given where an RLJob is expected."""
    return isinstance(doc, dict) and "kind" not in doc and "actor_rollout_ref" in doc


def check(source: str, doc: Any, policy: Policy | None = None) -> Checked:
    """The verdict of the apiserver and then of the operator (the chart's trust `policy`, by default the chart's
    defaults, the free-form pod fields and the memory plan) on one document."""
    metadata = doc.get("metadata") if isinstance(doc, dict) else None
    name = str(metadata.get("name", "?")) if isinstance(metadata, dict) else "?"
    if is_other_kind(doc):
        return Checked(source, name, skipped_kind=f"{doc.get('apiVersion', '?')} {doc['kind']}")
    if looks_like_verl(doc):
        hint = "a verl config, not an RLJob: `kuberl import-verl FILE` converts it (mapping: docs/api.md)"
        return Checked(source, name, [Issue("", hint, "verl")])
    result = Checked(source, name, validate_document(doc))
    if result.valid:
        spec = RLJobSpec.model_validate(doc["spec"])
        result.issues = operator_issues(spec, policy or Policy())
        result.plan = plan_batches(spec)
        result.device = spec.cluster.device
    return result


def load_rljob(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    one_machine: bool = False,
    ignore: frozenset[str] = frozenset(),
) -> tuple[str, RLJobSpec]:
    """The single RLJob of `path` (name, spec) with `--set` overrides applied, or InvalidSpec with every issue.

    Documents of other kinds in the file are ignored, as `kuberl validate` skips them. `one_machine` (`kuberl run`)
    skips the rules about Kubernetes pods (POD_RULES, OPERATOR_RULES): one machine has one filesystem and no pods.
    `ignore` skips the rules of those ids (`kuberl plan` prints the plan the `plan-fits` rule refuses with).
    """
    docs = [(source, doc) for source, doc in load_documents(path) if not is_other_kind(doc)]
    if len(docs) != 1:
        raise ValueError(f"{path}: expected one {API_VERSION} {KIND} document, found {len(docs)}")
    source, doc = docs[0]
    if overrides:
        doc = apply_overrides(doc, overrides)
    checked = check(source, doc)
    issues = checked.issues
    if one_machine:
        issues = [i for i in issues if i.rule not in POD_RULES and i.rule not in OPERATOR_RULES]
    issues = [i for i in issues if i.rule not in ignore]
    if issues:
        raise InvalidSpec(issues, source)
    return checked.name, RLJobSpec.model_validate(doc["spec"])
