"""The README's "Run on a cluster" steps, as written: the chart rendered with exactly the flags of its `helm upgrade`
line admits KubeRay (from the namespace step 1 installs it in) and Prometheus through the NetworkPolicies the chart
and the operator render; the columns the README shows for `kubectl get rljobs` are the CRD's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.crd import PRINTER_COLUMNS
from kuberl.api.documents import load_rljob
from kuberl.operator.__main__ import parse_args
from kuberl.operator.rayjob import render_networkpolicy
from tests.chart.rendering import CHART, REPO, kinds, one, run_helm

README = REPO / "README.md"
EXAMPLE = REPO / "examples" / "gsm8k-grpo.yaml"


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def command_words(block: str, starts: str) -> list[str]:
    """The words of the command in `block` that starts with `starts`, continuation lines joined."""
    joined = block.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.strip().startswith(starts))
    return shlex.split(line, comments=True)


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


@pytest.fixture(scope="module")
def readme() -> dict[str, Any]:
    text = README.read_text()
    blocks = code_blocks(text)
    registry = re.search(r"export REGISTRY=(\S+)", text)
    assert registry is not None
    kuberay = command_words(next(b for b in blocks if "kuberay-operator" in b), "helm upgrade --install kuberay")
    chart = next(b for b in blocks if "helm upgrade --install kuberl charts/kuberl" in b)
    words = command_words(chart.replace("$REGISTRY", registry.group(1)), "helm upgrade --install kuberl")
    prometheus = next(b for b in blocks if b.strip().startswith("--set metrics.serviceMonitor"))
    return {
        "kuberay_namespace": option(kuberay, "--namespace"),
        "helm": words,
        "prometheus_flags": shlex.split(prometheus),
        "text": text,
    }


@pytest.fixture(scope="module")
def installed(readme: dict[str, Any], helm: Path, helm_home: Path) -> list[dict[str, Any]]:
    """`helm template` with the README's release, chart, namespace and --set flags (kube-prometheus-stack's too)."""
    words = readme["helm"]
    release, chart = words[3], words[4]
    assert (REPO / chart).resolve() == CHART
    sets = [w for i, w in enumerate(words) if i and words[i - 1] == "--set"]
    args = ["template", release, str(CHART), "--namespace", option(words, "--namespace")]
    for flag in [*sets, *[w for w in readme["prometheus_flags"] if w != "--set"]]:
        args += ["--set", flag]
    return [d for d in yaml.safe_load_all(run_helm(helm, helm_home, *args).stdout) if d]


def operator_trust(objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The operator's security policy from the rendered Deployment's arguments, parsed by the operator itself."""
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    monkeypatch.setenv("POD_NAMESPACE", "kuberl-system")
    return parse_args(container["args"]).trust


def admitted(policy: dict[str, Any]) -> dict[str, set[int]]:
    """namespace → ports a NetworkPolicy admits from it (by namespace selector)."""
    out: dict[str, set[int]] = {}
    for rule in policy["spec"]["ingress"]:
        for peer in rule.get("from", []):
            namespace = peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
            if namespace:
                out.setdefault(namespace, set()).update(p["port"] for p in rule.get("ports", []))
    return out


def test_the_rljob_network_policy_admits_kuberay_from_the_namespace_step_1_installs_it_in(
    readme: dict[str, Any], installed: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, spec = load_rljob(EXAMPLE)
    policy = render_networkpolicy("gsm8k-grpo", "rl-team", "uid", spec, operator_trust(installed, monkeypatch))
    assert 8265 in admitted(policy).get(readme["kuberay_namespace"], set()), admitted(policy)


def test_prometheus_may_scrape_the_ray_pods_and_the_operator(
    installed: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    (monitor,) = kinds(installed, "PodMonitor")
    (service_monitor,) = kinds(installed, "ServiceMonitor")
    assert monitor and service_monitor
    trust = operator_trust(installed, monkeypatch)
    assert trust.monitoring_namespace == "monitoring"
    _, spec = load_rljob(EXAMPLE)
    ray = admitted(render_networkpolicy("gsm8k-grpo", "rl-team", "uid", spec, trust))
    assert {8080, spec.trainer.metrics_port} <= ray["monitoring"]
    operator = admitted(one(installed, "NetworkPolicy"))
    assert 8080 in operator["monitoring"]


def test_the_get_rljobs_columns_in_the_readme_are_the_crds(readme: dict[str, Any]) -> None:
    columns = ["NAME", *(c["name"].upper() for c in PRINTER_COLUMNS if not c.get("priority"))]
    shown = re.findall(r"get rljobs.*# (NAME .*)$", readme["text"], flags=re.MULTILINE)
    assert shown and all(line.split() == columns for line in shown), (shown, columns)


def test_the_set_up_offers_the_cpu_build_of_torch_at_the_pinned_version(readme: dict[str, Any]) -> None:
    (command,) = [b for b in code_blocks(readme["text"]) if "download.pytorch.org/whl/cpu" in b]
    assert "grep '^torch==' constraints.txt" in command
    assert re.search(r"^torch==\S+$", (REPO / "constraints.txt").read_text(), flags=re.MULTILINE)
