"""Every example's rendered pod templates are admitted as pods by the apiserver's Pod Security admission at
`restricted` (the namespace is labelled `pod-security.kubernetes.io/enforce: restricted`), server-side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.harness import Cluster, CommandError
from kuberl.api import load_rljob
from kuberl.api.policy import TRAINER_SERVICE_ACCOUNT
from kuberl.operator.rayjob import pod_templates, render_rayjob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
UID = "0b0b0b0b-1111-2222-3333-444444444444"


def restricted_namespace(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("create", "serviceaccount", TRAINER_SERVICE_ACCOUNT, "-n", namespace)


def as_pod(template: dict, name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": name},
        **{"spec": template["spec"]},
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_rendered_pod_is_admitted_under_restricted(cluster: Cluster, namespace: str, example: Path) -> None:
    restricted_namespace(cluster, namespace)
    name, spec = load_rljob(example)
    rayjob = render_rayjob(name, namespace, UID, spec)
    templates = pod_templates(rayjob["spec"])
    assert len(templates) >= 3  # head, a worker group, the submitter
    for i, template in enumerate(templates):
        priority = template["spec"].get("priorityClassName")
        if priority:  # the Priority admission plugin needs it to exist; what it holds is not under test
            cluster.kubectl("create", "priorityclass", priority, "--value=1000", check=False)
        pod = as_pod(template, f"{name}-{i}")
        result = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
        assert result.returncode == 0, f"{example.name} template {i}: {result.stderr}"
        assert "Warning" not in result.stderr, result.stderr  # audit/warn levels would print violations here


def test_the_namespace_really_enforces_restricted(cluster: Cluster, namespace: str) -> None:
    """The same template without its securityContexts is refused: the test above can fail."""
    restricted_namespace(cluster, namespace)
    name, spec = load_rljob(EXAMPLES[0])
    template = pod_templates(render_rayjob(name, namespace, UID, spec)["spec"])[0]
    del template["spec"]["securityContext"]
    for container in template["spec"]["containers"]:
        del container["securityContext"]
    with pytest.raises(CommandError, match="violates PodSecurity"):
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(as_pod(template, "bare")))
