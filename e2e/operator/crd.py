"""The RLJob CRD as the operator tests install it: the generated one, and variants applied as JSON."""

from __future__ import annotations

import json
from typing import Any

import yaml

from e2e.harness import Cluster, rljob_crd_file


def generated_crd() -> dict[str, Any]:
    return next(
        d for d in yaml.safe_load_all(rljob_crd_file().read_text()) if d and d.get("kind") == "CustomResourceDefinition"
    )


def apply_json(cluster: Cluster, doc: dict[str, Any], *args: str) -> None:
    """Server-side apply of `doc` sent as JSON (no YAML 1.1 surprises on the way)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *args, "-f", "-", input=json.dumps(doc))


def require_rljob_crd(cluster: Cluster) -> dict[str, Any]:
    """The generated CRD, which the harness installed; fail with the apiserver's reason if it was refused."""
    refused = cluster.crd_errors.get(rljob_crd_file())
    if refused:
        raise AssertionError(f"the apiserver refused crds/rljob.yaml: {refused}")
    return generated_crd()
