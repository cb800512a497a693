"""The chart against a real kube-apiserver: `helm install --dry-run=server`, real installs (the apiserver's own
validation and strict field checks), and the RBAC it grants, asked of the apiserver with `kubectl auth can-i`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from e2e.harness import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kuberl"
MONITORING_CRDS = Path(__file__).resolve().parent / "monitoring-crds.yaml"


def release_for(namespace: str) -> str:
    return "kuberl-" + namespace.rsplit("-", 1)[-1]  # unique per test: cluster-scoped objects carry its name


def install(
    cluster: Cluster,
    namespace: str,
    *args: str,
    values: dict | None = None,
    tmp: Path | None = None,
    check: bool = True,
    crds: bool = False,
):
    """`helm install`; without the chart's CRD unless `crds` (the RLJob CRD is cluster-wide and has its own test)."""
    cmd = ["install", release_for(namespace), str(CHART), "--namespace", namespace, *args]
    if not crds:
        cmd.append("--skip-crds")
    if values is not None:
        assert tmp is not None
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        cmd += ["--values", str(tmp / "values.yaml")]
    result = cluster.helm(*cmd, check=False)
    if check:
        assert result.returncode == 0, f"helm {' '.join(cmd)}:\n{result.stderr.strip()}"
    return result


def can_i(cluster: Cluster, service_account: str, verb: str, resource: str, namespace: str) -> bool:
    """Ask the apiserver's authorizer (a SubjectAccessReview; no discovery, so it works without the CRD).

    `resource` is `plural[.group][/subresource]`, as in `kubectl auth can-i`.
    """
    resource, _, subresource = resource.partition("/")
    plural, _, group = resource.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": service_account,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": plural,
                "subresource": subresource,
            },
        },
    }
    out = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout
    return json.loads(out)["status"].get("allowed", False)


@pytest.fixture
def uninstall(cluster: Cluster):
    releases: list[tuple[str, str]] = []
    yield releases
    for name, namespace in releases:
        cluster.helm("uninstall", name, "--namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(MONITORING_CRDS))
    cluster.wait_established(
        [
            "servicemonitors.monitoring.coreos.com",
            "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
        ]
    )


def test_server_dry_run_renders_against_the_cluster(cluster: Cluster, helm_bin: Path, namespace: str):
    out = install(cluster, namespace, "--dry-run=server").stdout
    manifests = [d for d in yaml.safe_load_all(out.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0]) if d]
    kinds = sorted(d["kind"] for d in manifests)
    assert kinds.count("Deployment") == 1 and "ClusterRole" in kinds and "ConfigMap" in kinds
    assert "in every namespace" in out


def test_monitors_without_the_prometheus_operator_crds_fail_with_a_clear_error(
    cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path
):
    """On a cluster without the Prometheus operator: a clear refusal (runs before this module installs them)."""
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout
    if "servicemonitors.monitoring.coreos.com" in crds:
        pytest.skip("the monitoring.coreos.com CRDs are installed in this session's cluster")
    result = install(
        cluster, namespace, values={"metrics": {"serviceMonitor": {"enabled": True}}}, tmp=tmp_path, check=False
    )
    assert result.returncode != 0
    assert "ServiceMonitor" in result.stderr and "monitoring.coreos.com" in result.stderr


def test_install_creates_every_object_the_apiserver_accepts(
    cluster: Cluster, helm_bin: Path, namespace: str, uninstall
):
    release = release_for(namespace)
    install(cluster, namespace)
    uninstall.append((release, namespace))
    deployment = cluster.get("deployment", release, namespace)
    assert deployment["spec"]["replicas"] == 2  # leader election through the Lease
    assert cluster.get("role", f"{release}-leader-election", namespace)["rules"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert cluster.get("clusterrole", f"{release}-operator")["rules"]
    assert cluster.get("serviceaccount", "kuberl-trainer", namespace)
    for name in ("gpu", "training", "operator"):
        configmap = cluster.get("configmap", f"{release}-dashboard-{name}", namespace)
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        json.loads(configmap["data"][f"{name}.json"])


def test_install_with_the_chart_crd_is_accepted(cluster: Cluster, helm_bin: Path, namespace: str, uninstall):
    """The chart's crds/rljob.yaml (= the generated crds/rljob.yaml) is installed (or found) and Established."""
    release = release_for(namespace)
    result = install(cluster, namespace, crds=True, check=False)
    if result.returncode == 0:
        uninstall.append((release, namespace))
    assert result.returncode == 0, f"the apiserver refused the chart (CRD?):\n{result.stderr.strip()[:3000]}"
    cluster.wait_established(["rljobs.kuberl.io"])
    crd = cluster.get("crd", "rljobs.kuberl.io")
    assert crd["spec"]["versions"][0]["name"] == "v1alpha1"


def test_operator_service_account_can_reconcile_rljobs_and_cannot_touch_secrets(
    cluster: Cluster, helm_bin: Path, namespace: str, uninstall
):
    release = release_for(namespace)
    install(cluster, namespace)
    uninstall.append((release, namespace))
    operator = f"system:serviceaccount:{namespace}:{release}"
    elsewhere = "default"  # cluster-wide mode: any namespace
    for verb, resource in [
        ("watch", "rljobs.kuberl.io"),
        ("patch", "rljobs.kuberl.io"),
        ("patch", "rljobs.kuberl.io/status"),
        ("create", "rayjobs.ray.io"),
        ("patch", "rayjobs.ray.io"),
        ("create", "configmaps"),
        ("create", "events"),
        ("update", "rljobs.kuberl.io/finalizers"),
        ("delete", "rayjobs.ray.io"),  # a permanent failure or the stall deadline ends the job: no KubeRay retry
    ]:
        assert can_i(cluster, operator, verb, resource, elsewhere), f"operator cannot {verb} {resource}"
    for verb, resource in [
        ("get", "secrets"),  # the Ray token Secret is KubeRay's (authOptions), never the operator's
        ("create", "secrets"),
        ("list", "secrets"),
        ("watch", "secrets"),
        ("create", "pods"),
        ("delete", "rljobs.kuberl.io"),
        ("create", "rljobs.kuberl.io"),
        ("update", "rljobs.kuberl.io"),
        ("create", "rayclusters.ray.io"),
        ("delete", "configmaps"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ]:
        assert not can_i(cluster, operator, verb, resource, elsewhere), f"operator may {verb} {resource}"


def test_namespaced_install_grants_the_operator_nothing_outside_its_namespaces(
    cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path, uninstall
):
    release = release_for(namespace)
    install(cluster, namespace, values={"watchNamespaces": [namespace]}, tmp=tmp_path)
    uninstall.append((release, namespace))
    operator = f"system:serviceaccount:{namespace}:{release}"
    args = cluster.get("deployment", release, namespace)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={namespace}" in args
    assert can_i(cluster, operator, "patch", "rljobs.kuberl.io/status", namespace)
    assert can_i(cluster, operator, "create", "rayjobs.ray.io", namespace)
    assert not can_i(cluster, operator, "patch", "rljobs.kuberl.io/status", "default")
    assert not can_i(cluster, operator, "create", "rayjobs.ray.io", "default")
    assert not can_i(cluster, operator, "list", "namespaces", "default")
    assert not can_i(cluster, operator, "list", "customresourcedefinitions.apiextensions.k8s.io", "default")


def test_trainer_service_account_may_patch_only_rljob_status(
    cluster: Cluster, helm_bin: Path, namespace: str, uninstall
):
    release = release_for(namespace)
    install(cluster, namespace)
    uninstall.append((release, namespace))
    trainer = f"system:serviceaccount:{namespace}:kuberl-trainer"
    assert can_i(cluster, trainer, "patch", "rljobs.kuberl.io/status", namespace)
    assert can_i(cluster, trainer, "get", "rljobs.kuberl.io", namespace)
    assert not can_i(cluster, trainer, "patch", "rljobs.kuberl.io", namespace)
    assert not can_i(cluster, trainer, "get", "secrets", namespace)
    assert not can_i(cluster, trainer, "patch", "rljobs.kuberl.io/status", "default")


def test_monitors_install_with_every_field_kept(
    cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path, monitoring_crds, uninstall
):
    """Against (a minimal stand-in of) the Prometheus operator's CRDs: the apiserver keeps every rendered field."""
    release = release_for(namespace)
    values = {
        "watchNamespaces": [namespace],
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "prometheusRule": {"enabled": True},
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    rendered = [
        d
        for d in yaml.safe_load_all(
            cluster.helm(
                "template", release, str(CHART), "--namespace", namespace, "--values", str(tmp_path / "values.yaml")
            ).stdout
        )
        if d
    ]
    install(cluster, namespace, values=values, tmp=tmp_path)
    uninstall.append((release, namespace))
    for kind, resource in (
        ("ServiceMonitor", "servicemonitors.monitoring.coreos.com"),
        ("PodMonitor", "podmonitors.monitoring.coreos.com"),
        ("PrometheusRule", "prometheusrules.monitoring.coreos.com"),
    ):
        (expected,) = [d for d in rendered if d["kind"] == kind]
        stored = cluster.get(resource, expected["metadata"]["name"], namespace)
        assert stored["spec"] == expected["spec"]


def test_namespace_editors_and_viewers_get_rljobs_through_the_aggregated_roles(
    cluster: Cluster, helm_bin: Path, namespace: str, uninstall
):
    """kube-controller-manager's aggregation folds <release>-edit/-view into the built-in edit/admin/view roles."""
    release = release_for(namespace)
    install(cluster, namespace)
    uninstall.append((release, namespace))
    for who, role in (("dev", "edit"), ("auditor", "view")):
        cluster.kubectl(
            "create",
            "rolebinding",
            who,
            f"--clusterrole={role}",
            f"--serviceaccount={namespace}:{who}",
            "-n",
            namespace,
        )
    dev, auditor = (f"system:serviceaccount:{namespace}:{who}" for who in ("dev", "auditor"))
    deadline = time.monotonic() + 30
    while not can_i(cluster, dev, "create", "rljobs.kuberl.io", namespace) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert can_i(cluster, dev, "create", "rljobs.kuberl.io", namespace)
    assert can_i(cluster, dev, "delete", "rljobs.kuberl.io", namespace)
    assert not can_i(cluster, dev, "patch", "rljobs.kuberl.io/status", namespace)
    assert can_i(cluster, auditor, "list", "rljobs.kuberl.io", namespace)
    assert not can_i(cluster, auditor, "create", "rljobs.kuberl.io", namespace)
    assert not can_i(cluster, dev, "create", "rljobs.kuberl.io", "default")  # only where the binding is


def test_two_operators_with_the_charts_service_account_elect_one_leader(
    cluster: Cluster, helm_bin: Path, namespace: str, tmp_path: Path, uninstall
):
    """The operator runs as the chart's ServiceAccount with the args the chart gives it: the leader-election Role
    (create, and get/update of the one Lease by name) is enough to take the Lease, and the second replica waits."""
    from e2e.operator.process import OperatorProcess

    release = release_for(namespace)
    install(cluster, namespace, values={"watchNamespaces": [namespace]}, tmp=tmp_path)
    uninstall.append((release, namespace))
    args = one_deployment_args(cluster, release, namespace)
    election = tuple(a for a in args if a.startswith(("--leader-elect", "--lease-", "--renew-", "--retry-")))
    kubeconfig = cluster.service_account_kubeconfig(namespace, release)
    replicas = [
        OperatorProcess(
            kubeconfig=kubeconfig,
            log_dir=tmp_path / name,
            namespaces=(namespace,),
            extra_args=(*election, f"--lease-namespace={namespace}", f"--identity={name}"),
        )
        for name in ("pod-a", "pod-b")
    ]
    try:
        for replica in replicas:
            replica.start()
        lease = f"{release}-leader"
        deadline = time.monotonic() + 30
        holder = None
        while time.monotonic() < deadline and holder is None:
            result = cluster.kubectl(
                "get", "lease", lease, "-n", namespace, "-o", "jsonpath={.spec.holderIdentity}", check=False
            )
            holder = result.stdout.strip() or None
            time.sleep(0.5)
        assert holder in ("pod-a", "pod-b"), (replicas[0].log_tail(), replicas[1].log_tail())
        standby = replicas[1] if holder == "pod-a" else replicas[0]
        time.sleep(2)  # a few retry periods: the standby keeps waiting
        assert "waiting for Lease" in standby.logs() and "leading" not in standby.logs()
        assert all(replica.alive() for replica in replicas)
    finally:
        for replica in replicas:
            replica.stop()


def one_deployment_args(cluster: Cluster, release: str, namespace: str) -> list[str]:
    deployment = cluster.get("deployment", release, namespace)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]
