"""The harness's control plane: versions, authentication, RBAC, optimistic concurrency, controllers."""

from __future__ import annotations

import json
import time

from e2e.harness import Cluster


def _configmap(name: str, **extra) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **extra}, "data": {"k": "v"}}


def test_server_reports_the_pinned_kubernetes_version(cluster: Cluster):
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == cluster.tools.k8s_version
    assert version["clientVersion"]["gitVersion"] == cluster.tools.k8s_version


def test_apiserver_listens_on_loopback_only(cluster: Cluster):
    assert cluster.server.startswith("https://127.0.0.1:")


def test_limited_user_is_authenticated_as_itself(cluster: Cluster):
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=cluster.limited_kubeconfig).stdout)
    assert whoami["status"]["userInfo"]["username"] == "limited"
    assert "system:masters" not in whoami["status"]["userInfo"].get("groups", [])


def test_limited_user_without_bindings_gets_403(cluster: Cluster, namespace: str):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CoreV1Api(cluster.api_client(cluster.limited_kubeconfig))
    try:
        api.list_namespaced_config_map(namespace)
    except ApiException as exc:
        assert exc.status == 403, exc
        assert 'User "limited" cannot list resource "configmaps"' in json.loads(exc.body)["message"]
    else:
        raise AssertionError("the limited user listed configmaps without any RBAC binding")


def test_rolebinding_grants_the_limited_user_exactly_its_namespace(cluster: Cluster, namespace: str):
    cluster.kubectl("create", "rolebinding", "limited-view", "--clusterrole=view", "--user=limited", "-n", namespace)
    as_limited = dict(kubeconfig=cluster.limited_kubeconfig, check=False)
    assert cluster.kubectl("auth", "can-i", "list", "configmaps", "-n", namespace, **as_limited).stdout.strip() == "yes"
    assert cluster.kubectl("auth", "can-i", "list", "configmaps", "-n", "default", **as_limited).stdout.strip() == "no"
    assert cluster.kubectl("get", "configmaps", "-n", namespace, **as_limited).returncode == 0


def test_update_with_a_stale_resource_version_is_a_409_conflict(cluster: Cluster, namespace: str):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CoreV1Api(cluster.api_client())
    created = api.create_namespaced_config_map(namespace, _configmap("cm"))
    stale = created.metadata.resource_version
    api.patch_namespaced_config_map("cm", namespace, {"data": {"k": "v2"}})
    body = _configmap("cm", resourceVersion=stale)
    body["data"] = {"k": "v3"}
    try:
        api.replace_namespaced_config_map("cm", namespace, body)
    except ApiException as exc:
        assert exc.status == 409
        assert "the object has been modified" in exc.body
    else:
        raise AssertionError("replace with a stale resourceVersion succeeded")


def test_garbage_collector_deletes_owned_objects(cluster: Cluster, namespace: str):
    cluster.create(_configmap("owner"), namespace=namespace)
    owner = cluster.get("configmap", "owner", namespace)
    owned = _configmap(
        "owned",
        ownerReferences=[
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "owner",
                "uid": owner["metadata"]["uid"],
            }
        ],
    )
    cluster.create(owned, namespace=namespace)
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cluster.kubectl("get", "configmap", "owned", "-n", namespace, check=False).returncode != 0:
            return
        time.sleep(0.2)
    raise AssertionError("kube-controller-manager did not garbage-collect the owned ConfigMap within 30 s")


def test_namespace_deletion_completes(cluster: Cluster):
    cluster.kubectl("create", "namespace", "t-ns-deletion")
    cluster.create(_configmap("cm"), namespace="t-ns-deletion")
    cluster.kubectl("delete", "namespace", "t-ns-deletion", "--timeout=60s")
    assert cluster.kubectl("get", "namespace", "t-ns-deletion", check=False).returncode != 0


def test_each_namespace_gets_a_default_service_account(cluster: Cluster, namespace: str):
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode != 0:
        assert time.monotonic() < deadline, "serviceaccount-controller did not create `default` within 30 s"
        time.sleep(0.2)


def test_service_account_kubeconfig_authenticates_as_the_service_account(cluster: Cluster, namespace: str):
    cluster.kubectl("create", "serviceaccount", "operator", "-n", namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, "operator")
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:operator"
    assert cluster.kubectl("get", "configmaps", "-n", namespace, kubeconfig=kubeconfig, check=False).returncode != 0
