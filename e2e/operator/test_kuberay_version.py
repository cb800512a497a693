"""The operator checks the installed KubeRay on the schema the apiserver publishes, and refuses an old one."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.fixtures import require_tools
from e2e.harness import Cluster, Tools
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from kuberl.operator import kuberay_support

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_the_harness_kuberay_passes_on_the_published_schema(cluster: Cluster) -> None:
    assert kuberay_support.check(cluster.api_client()) is None


# What an older KubeRay's RayJob CRD lacks, cut from the harness's own: the field path inside spec.rayClusterSpec
# and the words of the refusal.
OLD_SCHEMAS = {
    "1.4 (no worker-group labels)": (("workerGroupSpecs", "items", "labels"), "workerGroupSpecs[].labels"),
    "1.5.0 (no authOptions)": (("authOptions",), "rayClusterSpec.authOptions"),
}


def rayjob_crd_without(tools: Tools, field: tuple[str, ...], out: Path) -> Path:
    """The harness KubeRay's RayJob CRD minus `spec.rayClusterSpec.<field>`: the schema an older KubeRay installs."""
    crd = yaml.load((tools.kuberay_crd_dir() / "ray.io_rayjobs.yaml").read_text(), Loader=_Loader)
    *parents, leaf = field
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        if "rayClusterSpec" in spec:
            node = spec["rayClusterSpec"]
            for key in parents:
                node = node["properties"][key] if key != "items" else node["items"]
            node["properties"].pop(leaf, None)
    out.write_text(json.dumps(crd))
    return out


@pytest.fixture(scope="module")
def cluster_without_kuberay(kube_tools: Tools) -> Iterator[Cluster]:
    """An apiserver of its own without KubeRay's CRDs (and without a controller-manager: nothing here needs one),
    shared by the older schemas: each test installs its RayJob CRD over the one before."""
    require_tools(kube_tools, ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"])
    with Cluster(tools=kube_tools, kuberay_crds=False, controller_manager=False) as c:
        yield c


def published_problem(c: Cluster, words: str) -> str:
    """Wait until the apiserver publishes the RayJob schema just installed: the operator's check names `words`."""
    deadline = time.monotonic() + 30
    while (problem := kuberay_support.check(c.api_client())) is None or words not in problem:
        assert time.monotonic() < deadline, f"the published RayJob schema does not lack {words}: {problem}"
        time.sleep(0.2)
    return problem


@pytest.mark.parametrize("old", list(OLD_SCHEMAS))
def test_the_operator_refuses_an_older_kuberay(cluster_without_kuberay: Cluster, tmp_path: Path, old: str) -> None:
    c = cluster_without_kuberay
    field, words = OLD_SCHEMAS[old]
    old_crd = rayjob_crd_without(c.tools, field, tmp_path / "ray.io_rayjobs.json")
    # server-side, strict: the first test creates the CRD, the next one replaces the whole schema
    c.kubectl("apply", "--server-side", "--force-conflicts", "--validate=strict", "-f", str(old_crd))
    published_problem(c, words)
    namespace = "team-" + re.sub(r"[^0-9]+", "-", old.split()[0]).strip("-")  # one per schema: team-1-4, team-1-5-0
    c.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(kubeconfig=c.kubeconfig, log_dir=tmp_path / "operator", namespaces=(namespace,))
    operator.start()
    try:
        assert "kuberl_operator_kuberay_supported 0.0" in operator.metrics()
        c.create(rljob("old"), namespace=namespace)
        deadline = time.monotonic() + 30
        while True:
            status = c.get("rljob", "old", namespace).get("status") or {}
            refused = [x for x in status.get("conditions") or [] if x["type"] == "KubeRaySupported"]
            if refused:
                break
            assert time.monotonic() < deadline, f"no KubeRaySupported condition: {status}"
            time.sleep(0.2)
        assert refused[0]["status"] == "False" and refused[0]["reason"] == "KubeRayUnsupported"
        assert words in refused[0]["message"]
        assert status["phase"] == "Pending"
        assert c.kubectl("get", "rayjobs", "-n", namespace, "-o", "name").stdout == ""
        events = c.kubectl("get", "events", "-n", namespace, "--field-selector=reason=KubeRayUnsupported").stdout
        assert "KubeRayUnsupported" in events
    finally:
        operator.stop()
        print(operator.logs()[-5000:])
