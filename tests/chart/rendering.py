"""Runs the real helm on charts/kuberl and validates what it renders.

helm comes from the e2e harness's tool dir (`bash e2e/tools.sh install` builds it; `KUBERL_HELM` overrides the
path, see e2e/harness.py `Tools`). Core kinds are validated with kubernetes-validate's bundled OpenAPI schemas of
the newest Kubernetes it ships, in its strict flavour (unknown fields are errors), reporting every error rather
than the first; ServiceMonitor/PodMonitor with the minimal monitoring.coreos.com/v1 schema in this folder.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kuberl"
RELEASE = "kuberl"
RELEASE_NAMESPACE = "kuberl-system"
MONITORING_SCHEMA = Path(__file__).resolve().parent / "monitoring-coreos-v1.schema.json"


class HelmFailed(AssertionError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr.strip()}")
        self.stderr = result.stderr


def helm_env(home: Path) -> dict[str, str]:
    """helm with its config, cache and data under `home`: nothing read from or written to the user's ~/.config."""
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def run_helm(helm: Path, home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, env=helm_env(home), timeout=120)
    if check and result.returncode != 0:
        raise HelmFailed(list(args), result)
    return result


def template_args(values: Mapping[str, Any] | None, values_file: Path, *extra: str) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--include-crds", *extra]
    if values is not None:
        values_file.write_text(yaml.safe_dump(dict(values)))
        args += ["--values", str(values_file)]
    return args


def render(helm: Path, home: Path, values: Mapping[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """`helm template --include-crds` with `values`; the rendered objects (empty documents dropped)."""
    out = run_helm(helm, home, *template_args(values, home / "values.yaml", *extra)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kinds(objects: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o["kind"] == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in kinds(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


# ---- schema validation ---------------------------------------------------------------------------------------


@cache
def _kube_schema_dir() -> tuple[Path, str]:
    import kubernetes_validate.utils as kv

    version = kv.latest_version()
    folder = Path(str(kv.importlib_resources.files("kubernetes_validate"))) / "kubernetes-json-schema"
    return folder / f"v{version}-local-strict", version


@cache
def _kube_validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    folder, _ = _kube_schema_dir()
    group_version = api_version.split("/")
    prefix = group_version[0].split(".")[0] + "-" + group_version[1] if len(group_version) == 2 else group_version[0]
    schema_file = folder / f"{kind.lower()}-{prefix}.json"
    if not schema_file.exists():
        raise LookupError(f"no bundled schema for {api_version} {kind} ({schema_file.name})")
    schema = json.loads(schema_file.read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    # both files carry an $id (`/api/...`); their $refs point at `/api/_definitions.json#/$defs/...`
    registry = referencing.Registry().with_resources(
        (res.id(), res) for res in map(referencing.Resource.from_contents, (schema, definitions))
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


@cache
def _monitoring_validators() -> dict[str, jsonschema.protocols.Validator]:
    schemas = json.loads(MONITORING_SCHEMA.read_text())
    return {kind: jsonschema.Draft7Validator(schema) for kind, schema in schemas["kinds"].items()}


def _where(error: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in error.absolute_path) or "(root)"


def schema_errors(obj: Mapping[str, Any]) -> list[str]:
    """Every schema error of one rendered object, as `Kind/name: path: message`."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    name = f"{kind}/{obj.get('metadata', {}).get('name')}"
    if api_version == "monitoring.coreos.com/v1":
        validator = _monitoring_validators().get(kind)
        if validator is None:
            return [f"{name}: no schema for {api_version} {kind} in {MONITORING_SCHEMA.name}"]
    else:
        try:
            validator = _kube_validator(kind, api_version)
        except LookupError as exc:
            return [f"{name}: {exc}"]
    return [f"{name}: {_where(e)}: {e.message}" for e in validator.iter_errors(dict(obj))]
