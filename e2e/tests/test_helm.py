"""helm against the harness's apiserver: the chart tier's `helm install --dry-run=server` needs exactly this."""

from __future__ import annotations

import textwrap
from pathlib import Path

from e2e.harness import Cluster


def _chart(root: Path) -> Path:
    chart = root / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-smoke
        data:
          greeting: {{ .Values.greeting | quote }}
          kube: {{ .Capabilities.KubeVersion.Version | quote }}
        """)
    )
    return chart


def test_helm_reports_its_pinned_version(cluster: Cluster, helm_bin: Path):
    assert cluster.helm("version", "--short").stdout.startswith(cluster.tools.helm_version)


def test_helm_install_server_dry_run_sees_the_cluster(cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path):
    out = cluster.helm("install", "smoke", str(_chart(tmp_path)), "-n", namespace, "--dry-run=server").stdout
    assert "name: smoke-smoke" in out
    assert f'kube: "{cluster.tools.k8s_version}"' in out


def test_helm_install_creates_the_release_objects(cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path):
    cluster.helm("install", "smoke", str(_chart(tmp_path)), "-n", namespace)
    assert cluster.get("configmap", "smoke-smoke", namespace)["data"]["greeting"] == "hello"
