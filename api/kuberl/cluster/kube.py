"""The cluster a command talks to: kubeconfig, context and namespace chosen as kubectl chooses them."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from kuberl.api.contract import GROUP, PLURAL, VERSION

INSTALL_HINT = "pip install 'kuberl[cluster]'"
FIELD_MANAGER = "kuberl"  # the server-side apply field manager of `kuberl submit` and `kuberl crd --apply`


class ClusterError(RuntimeError):
    """A cluster call that failed, as the user should read it: what, where, and what to do."""


@dataclass
class Target:
    api: Any
    """kubernetes.client.ApiClient for the chosen context."""
    namespace: str
    context: str | None

    def describe(self) -> str:
        return f"namespace {self.namespace}" + (f" of context {self.context}" if self.context else "")


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Target:
    """The ApiClient and namespace as kubectl picks them: --kubeconfig, else $KUBECONFIG, else ~/.kube/config (or
    the pod's service account inside a cluster); --context, else the current one; -n, else the context's namespace,
    else default."""
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ClusterError(f"this command talks to Kubernetes through the kubernetes client: {INSTALL_HINT}") from exc
    configuration = client.Configuration()
    context_namespace: str | None = None
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None  # read now: the client reads it at import
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((c for c in contexts if c["name"] == context), current) if context else current
        context_namespace = (chosen or {}).get("context", {}).get("namespace")
        context = (chosen or {}).get("name", context)
    except config.ConfigException as exc:
        if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise ClusterError(f"no usable kubeconfig ({where}): {exc}") from exc
        config.load_incluster_config(client_configuration=configuration)
        context_namespace = _in_cluster_namespace()
    return Target(client.ApiClient(configuration), namespace or context_namespace or "default", context)


def _in_cluster_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def api_error(exc: Exception, what: str) -> ClusterError:
    """A kubernetes ApiException (or a connection error) as one line: the status, the server's message, the fix."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    body = getattr(exc, "body", None)
    message = str(exc).splitlines()[0] if status is None else reason
    if isinstance(body, (str, bytes)):
        import json

        with contextlib.suppress(ValueError):
            message = json.loads(body).get("message", message)
    hint = {
        403: " (your account may not do this: ask for the namespace's edit role)",
        404: "",
    }.get(status or 0, "")
    return ClusterError(f"{what}: {message}{hint}")


def get_rljob(target: Target, name: str) -> dict[str, Any]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        found: dict[str, Any] = client.CustomObjectsApi(target.api).get_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, target.namespace, PLURAL, name
        )
        return found
    except ApiException as exc:
        if exc.status == 404:
            raise ClusterError(
                f"RLJob {name} not found in {target.describe()} (kubectl get rljobs -A lists them all)"
            ) from exc
        raise api_error(exc, f"reading RLJob {name}") from exc
    except Exception as exc:  # an unreachable server: urllib3's errors
        raise api_error(exc, f"reading RLJob {name} from {target.api.configuration.host}") from exc


def patch_rljob(target: Target, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        patched: dict[str, Any] = client.CustomObjectsApi(target.api).patch_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, target.namespace, PLURAL, name, patch
        )
        return patched
    except ApiException as exc:
        raise api_error(exc, f"changing RLJob {name}") from exc
