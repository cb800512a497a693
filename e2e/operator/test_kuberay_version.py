"""The operator checks the installed KubeRay on the schema the apiserver publishes, and refuses an old one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from e2e.fixtures import require_tools
from e2e.harness import Cluster, Tools
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from kuberl.operator import kuberay_support

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_the_harness_kuberay_passes_on_the_published_schema(cluster: Cluster) -> None:
    assert kuberay_support.check(cluster.api_client()) is None


def rayjob_crd_without_worker_group_labels(tools: Tools, out: Path) -> Path:
    """KubeRay v1.5's RayJob CRD minus `workerGroupSpecs[].labels`: the schema KubeRay 1.4 installs."""
    crd = yaml.load((tools.kuberay_crd_dir() / "ray.io_rayjobs.yaml").read_text(), Loader=_Loader)
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        if "rayClusterSpec" in spec:
            spec["rayClusterSpec"]["properties"]["workerGroupSpecs"]["items"]["properties"].pop("labels", None)
    out.write_text(json.dumps(crd))
    return out


def test_the_operator_refuses_a_kuberay_that_drops_worker_group_labels(kube_tools: Tools, tmp_path: Path) -> None:
    require_tools(kube_tools, ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"])
    old_crd = rayjob_crd_without_worker_group_labels(kube_tools, tmp_path / "ray.io_rayjobs.json")
    with Cluster(tools=kube_tools, kuberay_crds=False, controller_manager=False, extra_crds=(old_crd,)) as c:
        assert not c.crd_errors, c.crd_errors
        c.kubectl("create", "namespace", "team-a")
        operator = OperatorProcess(kubeconfig=c.kubeconfig, log_dir=tmp_path / "operator", namespaces=("team-a",))
        operator.start()
        try:
            assert "kuberl_operator_kuberay_supported 0.0" in operator.metrics()
            c.create(rljob("old"), namespace="team-a")
            deadline = time.monotonic() + 30
            while True:
                status = c.get("rljob", "old", "team-a").get("status") or {}
                refused = [x for x in status.get("conditions") or [] if x["type"] == "KubeRaySupported"]
                if refused:
                    break
                assert time.monotonic() < deadline, f"no KubeRaySupported condition: {status}"
                time.sleep(0.2)
            assert refused[0]["status"] == "False" and refused[0]["reason"] == "KubeRayUnsupported"
            assert "workerGroupSpecs[].labels" in refused[0]["message"]
            assert status["phase"] == "Pending"
            assert c.kubectl("get", "rayjobs", "-n", "team-a", "-o", "name").stdout == ""
            events = c.kubectl("get", "events", "-n", "team-a", "--field-selector=reason=KubeRayUnsupported").stdout
            assert "KubeRayUnsupported" in events
        finally:
            operator.stop()
            print(operator.logs()[-5000:])
