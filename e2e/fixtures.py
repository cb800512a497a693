"""pytest fixtures for the Kubernetes harness (register with `pytest_plugins = ["e2e.fixtures"]`).

- `cluster` (session): one etcd + kube-apiserver + kube-controller-manager for the whole session.
- `namespace`: a fresh namespace per test, deleted afterwards (without waiting for finalization).
- `kube_tools`: the tool paths; `helm_bin`: the helm binary (skips when helm is not built).

A test that needs a tool that is not built is skipped with one line saying how to build it, except under
`CI=true`, where it fails: CI builds the tools first (`bash e2e/tools.sh install`), so a missing one is a bug.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import INSTALL_HINT, Cluster, Tools


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_tool(message: str) -> None:
    """Skip (locally) or fail (CI=true) the current test because a tool is not built."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: `{INSTALL_HINT}` must run before pytest)", pytrace=False)
    pytest.skip(message)


def require_tools(tools: Tools, names: list[str]) -> None:
    missing = tools.missing(names)
    if missing:
        missing_tool(f"{', '.join(missing)} not built: run `{INSTALL_HINT}`")


def pytest_configure(config: pytest.Config) -> None:
    # pyproject declares it too; repeating it keeps `--strict-markers` happy when this plugin is used elsewhere
    config.addinivalue_line("markers", "k8s: needs the kube-apiserver harness")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def kube_tools() -> Tools:
    return Tools.from_env()


@pytest.fixture(scope="session")
def cluster(kube_tools: Tools) -> Iterator[Cluster]:
    require_tools(kube_tools, ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"])
    with Cluster(tools=kube_tools) as running:
        yield running


@pytest.fixture
def helm_bin(kube_tools: Tools) -> Path:
    require_tools(kube_tools, ["helm"])
    return kube_tools.path("helm")


def _namespace_name(nodeid: str) -> str:
    """A DNS-1123 label from the test's name plus a random suffix: `t-<name>-<6 hex>`, at most 63 chars."""
    name = re.sub(r"[^a-z0-9]+", "-", nodeid.rsplit("::", 1)[-1].lower()).strip("-")
    return f"t-{name[:48].strip('-')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.nodeid)
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
