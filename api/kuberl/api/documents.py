"""Read RLJob manifests (multi-document YAML) and check them as admission would."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kuberl.api.batching import BatchPlan, plan_batches
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import InvalidSpec, Issue, validate_document


@dataclass
class Checked:
    source: str
    """`file.yaml` or `file.yaml#2` for the second document."""
    name: str
    issues: list[Issue] = field(default_factory=list)
    plan: BatchPlan | None = None

    @property
    def valid(self) -> bool:
        return not self.issues


def load_documents(path: str | Path) -> list[tuple[str, Any]]:
    """Every non-empty YAML document of `path`, labelled with where it came from."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FileNotFoundError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if len(docs) == 1:
        return [(str(path), docs[0])]
    return [(f"{path}#{i + 1}", doc) for i, doc in enumerate(docs)]


def check(source: str, doc: Any) -> Checked:
    name = doc.get("metadata", {}).get("name", "?") if isinstance(doc, dict) else "?"
    result = Checked(source, str(name), validate_document(doc))
    if result.valid:
        result.plan = plan_batches(RLJobSpec.model_validate(doc["spec"]))
    return result


def load_rljob(path: str | Path) -> tuple[str, RLJobSpec]:
    """The single RLJob of `path` (name, spec), or InvalidSpec with every issue."""
    docs = load_documents(path)
    if len(docs) != 1:
        raise ValueError(f"{path}: expected one RLJob document, found {len(docs)}")
    source, doc = docs[0]
    checked = check(source, doc)
    if not checked.valid:
        raise InvalidSpec(checked.issues, source)
    return checked.name, RLJobSpec.model_validate(doc["spec"])
