"""The harness's own pieces that need no built tool: paths, names, certificates."""

from __future__ import annotations

import re
import subprocess

import pytest
from cryptography import x509

from e2e import pki
from e2e.fixtures import _namespace_name
from e2e.harness import ALL_TOOLS, REPO_ROOT, Tools


def test_tools_sh_env_and_the_harness_agree_on_every_tool_path(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("KUBERL_TOOLS_DIR", str(tmp_path))
    for tool in ALL_TOOLS:
        monkeypatch.delenv("KUBERL_" + tool.replace("-", "_").upper(), raising=False)
    monkeypatch.delenv("KUBERL_KUBERAY_CRDS", raising=False)
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "e2e" / "tools.sh"), "env"], capture_output=True, text=True, check=True
    ).stdout
    printed = dict(line.split("=", 1) for line in out.splitlines())
    tools = Tools.from_env()
    for tool in ALL_TOOLS:
        assert printed["KUBERL_" + tool.replace("-", "_").upper()] == str(tools.path(tool))
    assert printed["KUBERL_KUBERAY_CRDS"] == str(tools.kuberay_crd_dir())


def test_the_kuberay_module_version_is_one_kuberl_supports():
    """KubeRay < 1.5 prunes workerGroupSpecs[].labels (the pool label) from RayJobs."""
    major, minor = (int(x) for x in Tools.from_env().kuberay_version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 5)


def test_versions_env_matches_the_go_module_pin():
    tools = Tools.from_env()
    go_mod = (REPO_ROOT / "e2e" / "tools" / "go.mod").read_text()
    assert re.search(rf"k8s\.io/kubernetes {re.escape(tools.k8s_version)}\b", go_mod)
    minor = tools.k8s_version.split(".")[1]
    assert re.search(rf"k8s\.io/api => k8s\.io/api v0\.{minor}\.", go_mod)


def test_a_tool_override_wins(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KUBERL_KUBECTL", "/usr/local/bin/kubectl")
    assert str(Tools.from_env().path("kubectl")) == "/usr/local/bin/kubectl"


@pytest.mark.parametrize(
    "nodeid",
    [
        "e2e/tests/test_x.py::test_short",
        "e2e/tests/test_x.py::test_" + "a_very_long_name" * 10 + "[Param-With_UPPER/and.dots]",
    ],
)
def test_namespace_names_are_dns_labels(nodeid: str):
    name = _namespace_name(nodeid)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)


def test_serving_certificate_names_loopback_and_the_in_cluster_service(tmp_path):
    ca = pki.CertificateAuthority(tmp_path)
    pair = ca.issue("apiserver", "kube-apiserver", server_hosts=("127.0.0.1", "kubernetes.default.svc"))
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["kubernetes.default.svc"]
    assert cert.issuer == x509.load_pem_x509_certificate(ca.pem).subject


def test_client_certificate_carries_user_and_groups(tmp_path):
    pair = pki.CertificateAuthority(tmp_path).issue("admin", "admin", organizations=("system:masters",))
    subject = x509.load_pem_x509_certificate(pair.cert.read_bytes()).subject
    assert subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "admin"
    assert subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert oct(pair.key.stat().st_mode & 0o777) == "0o600"
