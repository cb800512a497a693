"""The Helm chart, rendered by the real helm: valid objects, least-privilege RBAC, a hardened operator pod,
monitors and dashboards behind their values, and a values schema that refuses what the templates can't use."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart.rendering import (
    CHART,
    RELEASE_NAMESPACE,
    REPO,
    kinds,
    one,
    render,
    run_helm,
    schema_errors,
    template_args,
)

VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "monitors-on": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
            "podMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
        },
        "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    },
    "monitors-on-namespaced": {
        "watchNamespaces": ["team-a"],
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True, "scrapeRay": False}},
    },
    "monitors-elsewhere": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "namespace": "monitoring", "honorLabels": True},
            "podMonitor": {"enabled": True, "namespace": "monitoring", "honorLabels": False},
        },
        "prometheusRule": {"enabled": True, "namespace": "monitoring", "alertLabels": {"team": "ml-platform"}},
    },
    "single-replica": {"operator": {"replicas": 1, "leaderElection": {"enabled": False}}},
    "digest": {"operator": {"image": {"tag": "0.1.0", "digest": "sha256:" + "ab" * 32}}},
    "digest-as-tag": {"operator": {"image": {"tag": "sha256:" + "cd" * 32}}},
    "dashboards-off": {"dashboards": {"enabled": False}},
    "rbac-off": {"rbac": {"create": False}, "trainer": {"serviceAccount": {"create": False}}},
    "customised": {
        "fullnameOverride": "rl-operator",
        "watchNamespaces": ["team-a"],
        "serviceAccount": {"create": False, "name": "platform-operator"},
        "trainer": {
            "namespaces": ["team-a", "team-b"],
            "serviceAccount": {"name": "rl-trainer", "annotations": {"team": "rl"}},
        },
        "operator": {
            "image": {"repository": "registry.example.com/kuberl/operator", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "extraArgs": ["--max-workers=4"],
            "env": [{"name": "KUBERL_LOG_FORMAT", "value": "json"}],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
            "podAnnotations": {"example.com/owner": "platform"},
            "podLabels": {"team": "platform"},
            "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1001, "fsGroup": 1001},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 3},
            "progressTimeoutSeconds": 120,
        },
        "rbac": {"aggregateToDefaultRoles": False},
        "security": {"allowHostNetwork": True},
        "metrics": {"service": {"enabled": False}},
        "dashboards": {
            "namespace": "monitoring",
            "labels": {"grafana_dashboard": "kuberl"},
            "annotations": {"grafana_folder": "kuberl"},
        },
    },
}


@pytest.fixture(scope="module")
def rendered(helm: Path, helm_home: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, helm_home, values) for name, values in VALUE_SETS.items()}


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


OPERATOR = {
    *{("kuberl.io", "rljobs", v) for v in ("get", "list", "watch", "patch")},
    *{("kuberl.io", "rljobs/status", v) for v in ("get", "patch")},
    ("kuberl.io", "rljobs/finalizers", "update"),
    *{("ray.io", "rayjobs", v) for v in ("get", "list", "watch", "create", "patch", "delete")},
    *{("ray.io", "rayclusters", v) for v in ("get", "patch")},  # the rollout pool resized in place
    *{("", "configmaps", v) for v in ("get", "create", "patch")},
    *{("", "persistentvolumeclaims", v) for v in ("get", "create")},
    *{("", "events", v) for v in ("create", "get", "list", "watch")},
    *{("", "pods", v) for v in ("get", "list", "watch")},  # read only: why a Ray cluster is not running
    *{("networking.k8s.io", "networkpolicies", v) for v in ("get", "create")},
    *{("apps", "deployments", v) for v in ("get", "list", "watch", "create", "patch")},  # sandbox pools
    *{("", "services", v) for v in ("get", "create")},
}
TRAINER = {
    ("kuberl.io", "rljobs", "get"),
    ("kuberl.io", "rljobs/status", "get"),
    ("kuberl.io", "rljobs/status", "patch"),
    ("", "events", "create"),
}


# ---- helm itself ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", ["defaults", "customised"])
def test_helm_lint_passes_strict(helm: Path, helm_home: Path, tmp_path: Path, value_set: str):
    args = ["lint", "--strict", str(CHART), "--namespace", RELEASE_NAMESPACE]
    if VALUE_SETS[value_set] is not None:
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(VALUE_SETS[value_set]))
        args += ["--values", str(tmp_path / "values.yaml")]
    result = run_helm(helm, helm_home, *args)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_every_rendered_object_passes_its_schema(rendered, value_set: str):
    errors = [e for obj in rendered[value_set] for e in schema_errors(obj)]
    assert not errors, "\n".join(errors)


def test_chart_crd_is_byte_identical_to_the_generated_crd():
    assert (CHART / "crds" / "rljob.yaml").read_bytes() == (REPO / "crds" / "rljob.yaml").read_bytes(), (
        "charts/kuberl/crds/rljob.yaml is stale: cp crds/rljob.yaml charts/kuberl/crds/rljob.yaml"
    )


def test_rendered_crd_is_the_generated_crd(rendered):
    assert one(rendered["defaults"], "CustomResourceDefinition") == yaml.safe_load(
        (REPO / "crds" / "rljob.yaml").read_text()
    )


def test_chart_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    assert chart["appVersion"] == "0.1.0"
    assert f'version = "{chart["appVersion"]}"' in pyproject


# ---- operator Deployment ---------------------------------------------------------------------------------------


def test_operator_runs_two_replicas_that_elect_a_leader_through_a_lease(rendered):
    deployment = one(rendered["defaults"], "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    args = operator_container(rendered["defaults"])["args"]
    assert "--leader-elect" in args and "--lease-name=kuberl-leader" in args
    assert {"--lease-duration=15", "--renew-deadline=10", "--retry-period=2"} <= set(args)
    role = one(rendered["defaults"], "Role", "kuberl-leader-election")
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert rule_set(role["rules"]) == {("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")}
    assert [r.get("resourceNames") for r in role["rules"]] == [None, ["kuberl-leader"]]
    binding = one(rendered["defaults"], "RoleBinding", "kuberl-leader-election")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": RELEASE_NAMESPACE}]


def test_a_single_replica_without_leader_election_never_runs_two_pods(rendered):
    objects = rendered["single-replica"]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert "--leader-elect" not in operator_container(objects)["args"]
    assert not [r for r in kinds(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]


def test_two_replicas_spread_over_nodes_and_a_drain_evicts_one_at_a_time(rendered):
    deployment = one(rendered["defaults"], "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
    ]
    budget = one(rendered["defaults"], "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert budget["metadata"]["namespace"] == RELEASE_NAMESPACE


def test_a_single_replica_has_no_budget_and_no_spread(rendered):
    objects = rendered["single-replica"]
    assert not kinds(objects, "PodDisruptionBudget")
    assert "topologySpreadConstraints" not in one(objects, "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 3, "leaderElection": {"enabled": False}}}, "needs operator.leaderElection.enabled"),
        ({"operator": {"leaderElection": {"leaseDuration": 10, "renewDeadline": 10}}}, "renewDeadline must be below"),
    ],
    ids=["replicas-without-election", "deadline-not-below-lease"],
)
def test_unsafe_leader_election_settings_are_refused(
    helm: Path, helm_home: Path, tmp_path: Path, values: dict[str, Any], message: str
):
    result = run_helm(helm, helm_home, *template_args(values, tmp_path / "values.yaml"), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_image_digest_pins_the_image_given_as_digest_or_as_tag(rendered):
    assert operator_container(rendered["digest"])["image"] == "kuberl/operator@sha256:" + "ab" * 32
    assert operator_container(rendered["digest-as-tag"])["image"] == "kuberl/operator@sha256:" + "cd" * 32


def test_operator_pod_is_non_root_read_only_and_drops_all_capabilities(rendered):
    pod = one(rendered["defaults"], "Deployment")["spec"]["template"]["spec"]
    container = operator_container(rendered["defaults"])
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}  # no UID
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_pod_security_context_and_probes_come_from_values(rendered):
    pod = one(rendered["customised"], "Deployment")["spec"]["template"]["spec"]
    # helm merges the given keys into the defaults
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1001,
        "fsGroup": 1001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert operator_container(rendered["customised"])["readinessProbe"]["periodSeconds"] == 3


def test_operator_has_liveness_on_healthz_8081_metrics_on_8080_and_resources(rendered):
    container = operator_container(rendered["defaults"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--metrics-port=8080" in container["args"] and "--health-port=8081" in container["args"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["image"] == "kuberl/operator:0.1.0"


def test_operator_watches_all_namespaces_by_default(rendered):
    args = operator_container(rendered["defaults"])["args"]
    assert "--all-namespaces" in args
    assert not [a for a in args if a.startswith("--namespace")]


def test_operator_watches_each_listed_namespace(rendered):
    args = operator_container(rendered["namespaced"])["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_customised_values_reach_the_deployment(rendered):
    objects = rendered["customised"]
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert deployment["metadata"]["name"] == "rl-operator"
    assert pod["serviceAccountName"] == "platform-operator"
    assert container["image"] == "registry.example.com/kuberl/operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"][-1] == "--max-workers=4"
    assert {"name": "KUBERL_LOG_FORMAT", "value": "json"} in container["env"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "platform"
    assert not kinds(objects, "Service")
    assert not [sa for sa in kinds(objects, "ServiceAccount") if sa["metadata"]["name"] == "platform-operator"]


def test_host_network_and_the_progress_timeout_reach_the_operator_s_flags(rendered):
    default = operator_container(rendered["defaults"])["args"]
    customised = operator_container(rendered["customised"])["args"]
    assert "--allow-host-network" not in default and "--progress-timeout-seconds=900" in default
    assert "--allow-host-network" in customised and "--progress-timeout-seconds=120" in customised


# ---- RBAC ------------------------------------------------------------------------------------------------------


def test_cluster_wide_mode_grants_exactly_the_operators_needs_in_one_cluster_role(rendered):
    objects = rendered["defaults"]
    role = one(objects, "ClusterRole", "kuberl-operator")
    assert rule_set(role["rules"]) == OPERATOR
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": RELEASE_NAMESPACE}]
    operator_roles = [r for r in kinds(objects, "Role") if r["metadata"]["name"].endswith("-operator")]
    assert not operator_roles


def test_namespaced_mode_grants_a_role_per_namespace_and_nothing_cluster_wide(rendered):
    objects = rendered["namespaced"]
    assert not kinds(objects, "ClusterRoleBinding")
    # only the aggregated user roles, which grant the operator nothing, named per release namespace
    assert sorted(r["metadata"]["name"] for r in kinds(objects, "ClusterRole")) == [
        f"kuberl-{RELEASE_NAMESPACE}-edit",
        f"kuberl-{RELEASE_NAMESPACE}-view",
    ]
    roles = {
        r["metadata"]["namespace"]: r for r in kinds(objects, "Role") if r["metadata"]["name"] == "kuberl-operator"
    }
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        assert rule_set(role["rules"]) == OPERATOR
    bindings = {
        b["metadata"]["namespace"]: b
        for b in kinds(objects, "RoleBinding")
        if b["metadata"]["name"] == "kuberl-operator"
    }
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": RELEASE_NAMESPACE}]


def test_chart_grants_at_least_the_rules_the_operator_and_trainer_declare(rendered):
    """kuberl.operator.rbac holds the rules the code needs (its apiserver test runs with exactly those); the chart
    grants exactly them to the operator."""
    from kuberl.operator.rbac import OPERATOR_RULES, RAY_POD_RULES

    assert rule_set(OPERATOR_RULES) == OPERATOR
    assert rule_set(RAY_POD_RULES) <= TRAINER


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_rbac_has_no_wildcards_and_never_touches_secrets(rendered, value_set: str):
    """No kuberl identity touches Secrets: KubeRay creates each Ray cluster's token Secret, and a Ray pod has only
    its own cluster's token (from its environment), never another job's."""
    for obj in rendered[value_set]:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{obj['kind']}/{obj['metadata']['name']}: wildcard in {key}"
            assert "secrets" not in rule["resources"], f"{obj['kind']}/{obj['metadata']['name']}"
            assert not rule.get("nonResourceURLs")


def test_trainer_gets_its_service_account_and_role_in_the_release_namespace_by_default(rendered):
    objects = rendered["defaults"]
    sa = [s for s in kinds(objects, "ServiceAccount") if s["metadata"]["name"] == "kuberl-trainer"]
    assert [s["metadata"]["namespace"] for s in sa] == [RELEASE_NAMESPACE]
    role = one(objects, "Role", "kuberl-trainer")
    assert rule_set(role["rules"]) == TRAINER
    binding = one(objects, "RoleBinding", "kuberl-trainer")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl-trainer", "namespace": RELEASE_NAMESPACE}]


def test_trainer_namespaces_follow_watch_namespaces_unless_listed(rendered):
    def trainer_namespaces(objects):
        return sorted(
            r["metadata"]["namespace"] for r in kinds(objects, "Role") if r["metadata"]["name"].endswith("-trainer")
        )

    assert trainer_namespaces(rendered["namespaced"]) == ["team-a", "team-b"]
    assert trainer_namespaces(rendered["customised"]) == ["team-a", "team-b"]  # trainer.namespaces wins
    customised = rendered["customised"]
    sa = {s["metadata"]["namespace"]: s for s in kinds(customised, "ServiceAccount")}
    assert set(sa) == {"team-a", "team-b"} and all(s["metadata"]["name"] == "rl-trainer" for s in sa.values())
    for role in kinds(customised, "Role"):
        if role["metadata"]["name"].endswith("-trainer"):
            assert rule_set(role["rules"]) == TRAINER


def test_rljob_roles_aggregate_into_the_built_in_edit_and_view_roles(rendered):
    objects = rendered["defaults"]
    edit, view = one(objects, "ClusterRole", "kuberl-edit"), one(objects, "ClusterRole", "kuberl-view")
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert ("kuberl.io", "rljobs", "create") in rule_set(edit["rules"])
    assert ("kuberl.io", "rljobs/status", "patch") not in rule_set(edit["rules"])  # status is the operator's
    assert rule_set(view["rules"]) == {
        ("kuberl.io", r, v) for r in ("rljobs", "rljobs/status") for v in ("get", "list", "watch")
    }
    assert not [r for r in kinds(rendered["customised"], "ClusterRole") if r["metadata"]["name"].endswith("-edit")]


# ---- Prometheus and Grafana ------------------------------------------------------------------------------------


def test_monitors_are_off_by_default_and_the_metrics_service_is_on(rendered):
    objects = rendered["defaults"]
    assert not kinds(objects, "ServiceMonitor") and not kinds(objects, "PodMonitor")
    assert not kinds(objects, "PrometheusRule")
    service = one(objects, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_service_monitor_selects_the_operator_metrics_service(rendered):
    objects = rendered["monitors-on"]
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is False


def test_monitors_and_rules_go_to_their_own_namespace_with_honor_labels_from_values(rendered):
    objects = rendered["monitors-elsewhere"]
    service_monitor, pod_monitor = one(objects, "ServiceMonitor"), one(objects, "PodMonitor")
    rule = one(objects, "PrometheusRule")
    for obj in (service_monitor, pod_monitor, rule):
        assert obj["metadata"]["namespace"] == "monitoring"
    # the ServiceMonitor still looks for the Service in the release namespace
    assert service_monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is False
    assert all(r["labels"]["team"] == "ml-platform" for r in rule["spec"]["groups"][0]["rules"])


def test_prometheus_rule_has_the_five_alerts_against_the_release_s_metrics_service(rendered):
    rule = one(rendered["monitors-on"], "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == [
        "KuberlGPUsIdle",
        "KuberlOperatorDown",
        "KuberlRLJobFailed",
        "KuberlRLJobNonFinite",
        "KuberlRLJobStalled",
    ]
    service = one(rendered["monitors-on"], "Service")["metadata"]["name"]
    assert f'job="{service}"' in alerts["KuberlOperatorDown"]["expr"]
    assert f'namespace="{RELEASE_NAMESPACE}"' in alerts["KuberlOperatorDown"]["expr"]
    assert "[30m]" in alerts["KuberlRLJobStalled"]["expr"]
    assert all(a["labels"]["severity"] in ("warning", "critical") for a in alerts.values())


def test_pod_monitor_scrapes_the_ports_the_operator_gives_ray_pods(rendered):
    """The PodMonitor's selector and port names must match what render_rayjob puts on the Ray pods."""
    from kuberl.api.documents import load_rljob
    from kuberl.operator.rayjob import render_rayjob

    name, spec = load_rljob(REPO / "examples" / "gsm8k-grpo.yaml")
    rayjob = render_rayjob(name, "team-a", "uid-1", spec)
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    monitor = one(rendered["monitors-on"], "PodMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    assert expression == {"key": "kuberl.io/rljob", "operator": "Exists"}
    assert all(t["metadata"]["labels"]["kuberl.io/rljob"] == name for t in templates)
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    head_ports = {p["name"]: p["containerPort"] for c in templates[0]["spec"]["containers"] for p in c["ports"]}
    trainer_endpoint, ray_endpoint = monitor["spec"]["podMetricsEndpoints"]
    assert head_ports[trainer_endpoint["port"]] == spec.trainer.metrics_port == 9400
    assert head_ports[ray_endpoint["port"]] == 8080
    for worker in templates[1:]:
        assert ray_endpoint["port"] in {p["name"] for c in worker["spec"]["containers"] for p in c["ports"]}
    for endpoint in (trainer_endpoint, ray_endpoint):
        assert {"sourceLabels": ["__meta_kubernetes_pod_label_kuberl_io_rljob"], "targetLabel": "rljob"} in endpoint[
            "relabelings"
        ]
    assert trainer_endpoint["honorLabels"] is True


def test_pod_monitor_in_namespaced_mode_looks_only_at_the_watched_namespaces(rendered):
    monitor = one(rendered["monitors-on-namespaced"], "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["trainer-metrics"]


def test_dashboards_ship_as_configmaps_labelled_for_the_grafana_sidecar(rendered):
    configmaps = [c for c in kinds(rendered["defaults"], "ConfigMap") if "-dashboard-" in c["metadata"]["name"]]
    assert sorted(c["metadata"]["name"] for c in configmaps) == [
        "kuberl-dashboard-gpu",
        "kuberl-dashboard-operator",
        "kuberl-dashboard-training",
    ]
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["namespace"] == RELEASE_NAMESPACE
        ((key, text),) = configmap["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / key).read_text())


def test_dashboards_follow_their_namespace_labels_and_annotations(rendered):
    configmaps = [c for c in kinds(rendered["customised"], "ConfigMap") if "-dashboard-" in c["metadata"]["name"]]
    assert len(configmaps) == 3
    for configmap in configmaps:
        assert configmap["metadata"]["namespace"] == "monitoring"
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "kuberl"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "kuberl"}


def test_rbac_off_renders_no_roles_and_no_trainer_service_account(rendered):
    objects = rendered["rbac-off"]
    for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert not kinds(objects, kind), kind
    assert [sa["metadata"]["name"] for sa in kinds(objects, "ServiceAccount")] == ["kuberl"]


def test_dashboards_off_renders_no_dashboard(rendered):
    assert not kinds(rendered["dashboards-off"], "ConfigMap")


def test_dashboard_json_is_what_the_generator_writes():
    result = subprocess.run(
        [sys.executable, str(CHART / "dashboards" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_notes_say_how_to_turn_monitors_on(helm: Path, helm_home: Path, tmp_path: Path):
    out = run_helm(
        helm, helm_home, "install", "kuberl", str(CHART), "--dry-run=client", "--namespace", RELEASE_NAMESPACE
    ).stdout
    assert "metrics.serviceMonitor.enabled=true" in out
    assert "in every namespace" in out
    assert "run `kuberl crd --apply`" in out  # Helm never upgrades crds/


def test_notes_name_the_kuberay_the_readme_installs_and_warn_of_an_unset_monitoring_namespace(
    helm: Path, helm_home: Path
):
    readme = (REPO / "README.md").read_text()
    version = re.search(r"kuberay-operator --repo \S+ \\\n\s+--version (\S+)", readme)
    assert version is not None
    args = ["install", "kuberl", str(CHART), "--dry-run=client", "--namespace", RELEASE_NAMESPACE]
    out = run_helm(helm, helm_home, *args, "--set", "metrics.serviceMonitor.enabled=true").stdout
    assert f"kuberay-operator --version {version.group(1)} --namespace kuberay-system" in out
    assert "security.monitoringNamespace is empty" in out
    out = run_helm(helm, helm_home, *args, "--set", "security.monitoringNamespace=monitoring").stdout
    assert "security.monitoringNamespace is empty" not in out


# ---- values.schema.json ----------------------------------------------------------------------------------------

BAD_VALUES = {
    "unknown-top-level-key": ({"watchNamespace": ["a"]}, "watchNamespace"),
    "namespace-not-dns-1123": ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    "duplicate-namespace": ({"watchNamespaces": ["a", "a"]}, "watchNamespaces"),
    "port-as-string": ({"operator": {"metricsPort": "8080"}}, "metricsPort"),
    "port-out-of-range": ({"operator": {"healthPort": 70000}}, "healthPort"),
    "unknown-operator-key": ({"operator": {"replica": 2}}, "replica"),
    "zero-replicas": ({"operator": {"replicas": 0}}, "replicas"),
    "digest-not-sha256": ({"operator": {"image": {"digest": "latest"}}}, "digest"),
    "monitor-labels-renamed": ({"metrics": {"serviceMonitor": {"labels": {"a": "b"}}}}, "labels"),
    "monitor-namespace-invalid": ({"metrics": {"podMonitor": {"namespace": "Monitoring"}}}, "namespace"),
    "gpu-idle-as-percent": ({"prometheusRule": {"gpuIdleBelow": 10}}, "gpuIdleBelow"),
    "stalled-after-not-a-duration": ({"prometheusRule": {"stalledAfter": "half an hour"}}, "stalledAfter"),
    "bad-pull-policy": ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "pullPolicy"),
    "monitor-flag-not-boolean": ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "enabled"),
    "bad-scrape-interval": ({"metrics": {"podMonitor": {"interval": "15 seconds"}}}, "interval"),
    "port-name-too-long": ({"metrics": {"podMonitor": {"trainerPort": "trainer-metrics-port"}}}, "trainerPort"),
    "dashboard-label-not-a-string": ({"dashboards": {"labels": {"grafana_dashboard": 1}}}, "grafana_dashboard"),
    "resources-unknown-key": ({"operator": {"resources": {"request": {"cpu": "1"}}}}, "request"),
    "trainer-sa-name-invalid": ({"trainer": {"serviceAccount": {"name": "Trainer SA"}}}, "name"),
    "spread-unknown-policy": ({"operator": {"topologySpread": {"whenUnsatisfiable": "Never"}}}, "whenUnsatisfiable"),
    "budget-zero-unavailable": ({"operator": {"podDisruptionBudget": {"maxUnavailable": 0}}}, "maxUnavailable"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_values_schema_refuses_bad_values_naming_the_field(helm: Path, helm_home: Path, tmp_path: Path, case: str):
    values, field = BAD_VALUES[case]
    result = run_helm(helm, helm_home, *template_args(values, tmp_path / "values.yaml"), check=False)
    assert result.returncode != 0, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert field in result.stderr, result.stderr


def test_service_monitor_without_the_metrics_service_is_refused(helm: Path, helm_home: Path, tmp_path: Path):
    values = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    result = run_helm(helm, helm_home, *template_args(values, tmp_path / "values.yaml"), check=False)
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


def test_values_yaml_meets_its_own_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load((CHART / "values.yaml").read_text())))
    assert not errors, [e.message for e in errors]


def test_values_schema_is_draft_07_and_closed_everywhere_it_names_properties():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            open_object = "properties" in node and node.get("additionalProperties") is not False
            # EnvVar: valueFrom etc. pass through
            if open_object and path not in ("properties/operator/properties/env/items",):
                open_objects.append(path)
            for key, value in node.items():
                walk(value, f"{path}/{key}" if path else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(schema, "")
    assert not open_objects, f"objects without additionalProperties: false: {open_objects}"


def test_validation_reports_every_error_of_an_object_not_just_the_first(rendered):
    deployment = json.loads(json.dumps(one(rendered["defaults"], "Deployment")))
    deployment["spec"]["replica"] = 1
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = [8081]
    monitor = json.loads(json.dumps(one(rendered["monitors-on"], "PodMonitor")))
    monitor["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    errors = schema_errors(deployment) + schema_errors(monitor)
    assert len(errors) == 3, errors
    assert any("replica" in e for e in errors) and any("honourLabels" in e for e in errors)
