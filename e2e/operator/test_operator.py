"""The operator as a real process against a real kube-apiserver; KubeRay is played by `KubeRaySim`.

Each test gets its own namespace and its own operator process (`--namespace <ns>`).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness import Cluster
from e2e.operator.crd import apply_json
from e2e.operator.kuberay_rules import kuberay_checks, rayjob_schema_errors
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import validate_document
from kuberl.operator import rbac
from kuberl.operator.rayjob import render_configmap, render_rayjob

GROUP, VERSION, PLURAL = "kuberl.io", "v1alpha1", "rljobs"


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


def wait_until(what: str, fn: Callable[[], Any], timeout: float = 30, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = exc
        if last and not isinstance(last, ApiException):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


class Kube:
    """Thin helpers over the admin client."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def create_rljob(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, doc)

    def rljob(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def patch_rljob(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )

    def rayjob(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object("ray.io", "v1", self.ns, "rayjobs", name)

    def rayjobs(self, label: str | None = None) -> list[dict[str, Any]]:
        kwargs = {"label_selector": label} if label else {}
        return self.custom.list_namespaced_custom_object("ray.io", "v1", self.ns, "rayjobs", **kwargs)["items"]

    def configmap(self, name: str) -> client.V1ConfigMap:
        return self.core.read_namespaced_config_map(name, self.ns)

    def events(self, name: str) -> list[client.CoreV1Event]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in items if e.involved_object.kind == "RLJob"]

    def phase(self, name: str) -> str | None:
        return (self.rljob(name).get("status") or {}).get("phase")

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        return wait_until(
            f"RLJob {name} phase {phase}",
            lambda: (obj := self.rljob(name)) and (obj.get("status") or {}).get("phase") == phase and obj,
            timeout,
        )

    def wait_events(self, name: str, reasons: list[str], timeout: float = 30) -> list[client.CoreV1Event]:
        def have() -> list | None:
            events = self.events(name)
            seen = {e.reason for e in events}
            return events if set(reasons) <= seen else None

        return wait_until(f"events {reasons} on {name}", have, timeout)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    raise AssertionError(f"no {type_} condition in {obj.get('status')}")


def grant_operator_rules(cluster: Cluster, namespace: str) -> None:
    """The `limited` user gets only rbac.OPERATOR_RULES in `namespace` (the chart's namespaced operator role)."""
    user = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "limited"}
    cluster.apply(
        [
            rbac.role("kuberl-operator", namespace, rbac.OPERATOR_RULES),
            rbac.binding("kuberl-operator", namespace, "kuberl-operator", user),
        ]
    )


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


# --- creation ----------------------------------------------------------------------


def test_create_makes_the_configmap_and_rayjob_of_the_expected_shape(operator: OperatorProcess, k: Kube) -> None:
    created = k.create_rljob(rljob("shape"))
    rayjob = wait_until("RayJob", lambda: k.rayjob("shape"))
    uid = created["metadata"]["uid"]
    spec = RLJobSpec.model_validate(created["spec"])
    expected = render_rayjob("shape", k.ns, uid, spec)
    assert rayjob["spec"]["entrypoint"] == expected["spec"]["entrypoint"]
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] == "trainer"
    # what the apiserver stored is what we rendered (it validates, prunes nothing and only adds defaults)
    stored = {k_: v for k_, v in rayjob.items() if k_ in ("apiVersion", "kind", "spec")}
    assert rayjob_schema_errors({**stored, "metadata": {"name": "shape"}}) == []
    assert kuberay_checks(rayjob) == []
    for key in ("entrypoint", "shutdownAfterJobFinishes", "suspend", "backoffLimit", "ttlSecondsAfterFinished"):
        assert rayjob["spec"][key] == expected["spec"][key], key
    assert [r["uid"] for r in rayjob["metadata"]["ownerReferences"]] == [uid]
    ref = rayjob["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"], ref["blockOwnerDeletion"]) == ("RLJob", "shape", True, True)
    assert rayjob["metadata"]["labels"]["kuberl.io/rljob"] == "shape"

    configmap = k.configmap("shape-spec")
    assert configmap.data == render_configmap("shape", k.ns, uid, spec)["data"]
    assert [r.uid for r in configmap.metadata.owner_references] == [uid]

    obj = wait_until("status", lambda: (o := k.rljob("shape")).get("status", {}).get("rayJobName") and o)
    status = obj["status"]
    assert status["phase"] == "Pending"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "Valid")["status"] == "True"
    assert condition(obj, "Created")["status"] == "True"
    assert "finalizers" not in obj["metadata"]
    assert not k.events("shape"), "a new RLJob's first phase is in its status, not in an Event"


def test_kueue_queue_name_is_passed_through(operator: OperatorProcess, k: Kube) -> None:
    k.create_rljob(rljob("queued", **{"cluster.queueName": "team-a"}))
    rayjob = wait_until("RayJob", lambda: k.rayjob("queued"))
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


# --- status from KubeRay -----------------------------------------------------------


def test_status_follows_kuberay_to_success(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("ok"))
    sim.wait_for(k.ns, "ok")
    sim.initializing(k.ns, "ok")
    pending = wait_until("cluster name", lambda: (o := k.rljob("ok")).get("status", {}).get("rayClusterName") and o)
    assert pending["status"]["phase"] == "Pending"
    assert condition(pending, "Running")["reason"] == "Initializing"

    sim.running(k.ns, "ok")
    running = k.wait_phase("ok", "Running")
    assert condition(running, "Running")["status"] == "True"
    assert running["status"]["startTime"]
    assert running["status"]["dashboardURL"].endswith(":8265")
    created_at = condition(running, "Created")["lastTransitionTime"]

    sim.complete(k.ns, "ok")
    done = k.wait_phase("ok", "Succeeded")
    assert condition(done, "Succeeded")["status"] == "True"
    assert condition(done, "Running")["status"] == "False"
    assert condition(done, "Created")["lastTransitionTime"] == created_at
    assert done["status"]["completionTime"]
    events = k.wait_events("ok", ["Running", "Succeeded"])
    assert all(e.type == "Normal" for e in events)


def test_status_follows_kuberay_to_failure(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("bad"))
    sim.wait_for(k.ns, "bad")
    sim.initializing(k.ns, "bad")
    sim.running(k.ns, "bad")
    k.wait_phase("bad", "Running")
    sim.fail(k.ns, "bad", message="Job entrypoint command failed with exit code 1")
    failed = k.wait_phase("bad", "Failed")
    cond = condition(failed, "Failed")
    assert (cond["status"], cond["reason"]) == ("True", "AppFailed")
    assert "exit code 1" in cond["message"]
    assert failed["status"]["message"] == cond["message"]
    events = k.wait_events("bad", ["Failed"])
    assert [e.type for e in events if e.reason == "Failed"] == ["Warning"]


def test_retries_show_as_restarting_and_count_restarts(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("flaky", **{"runPolicy.backoffLimit": 2}))
    rayjob = sim.wait_for(k.ns, "flaky")
    assert rayjob["spec"]["backoffLimit"] == 2
    sim.initializing(k.ns, "flaky")
    sim.running(k.ns, "flaky")
    k.wait_phase("flaky", "Running")
    sim.retry(k.ns, "flaky")
    restarting = k.wait_phase("flaky", "Restarting")
    assert restarting["status"]["restarts"] == 1
    sim.running(k.ns, "flaky")
    running = k.wait_phase("flaky", "Running")
    assert running["status"]["restarts"] == 1
    k.wait_events("flaky", ["Restarting"])
    assert "kuberl_operator_restarts_total 1.0" in operator.metrics()


def test_validation_failed_rayjob_fails_the_rljob(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("vf"))
    sim.wait_for(k.ns, "vf")
    sim.validation_failed(k.ns, "vf", "The RayJob spec is invalid: something KubeRay refused")
    failed = k.wait_phase("vf", "Failed")
    assert condition(failed, "Failed")["reason"] == "ValidationFailed"


# --- suspend -----------------------------------------------------------------------


def test_suspend_toggles_the_rayjob_and_the_status_follows(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("pause"))
    sim.wait_for(k.ns, "pause")
    sim.initializing(k.ns, "pause")
    sim.running(k.ns, "pause")
    k.wait_phase("pause", "Running")

    k.patch_rljob("pause", {"spec": {"runPolicy": {"suspend": True}}})
    wait_until("RayJob suspend=true", lambda: k.rayjob("pause")["spec"]["suspend"] is True)
    sim.follow_suspend(k.ns, "pause")
    suspended = wait_until(
        "Suspended by KubeRay",
        lambda: (
            (o := k.rljob("pause")).get("status", {}).get("phase") == "Suspended"
            and condition(o, "Suspended")["reason"] == "Suspended"
            and o
        ),
    )
    assert condition(suspended, "Suspended")["status"] == "True"
    assert condition(suspended, "Running")["status"] == "False"
    assert "rayClusterName" not in suspended["status"]
    wait_until("observedGeneration", lambda: k.rljob("pause")["status"].get("observedGeneration") == 2)

    k.patch_rljob("pause", {"spec": {"runPolicy": {"suspend": False}}})
    wait_until("RayJob suspend=false", lambda: k.rayjob("pause")["spec"]["suspend"] is False)
    sim.follow_suspend(k.ns, "pause")
    resumed = k.wait_phase("pause", "Pending")
    assert condition(resumed, "Suspended")["status"] == "False"
    k.wait_events("pause", ["Suspended", "Resumed"])


def test_batch_changes_are_refused_while_running(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("frozen"))
    sim.wait_for(k.ns, "frozen")
    sim.running(k.ns, "frozen")
    k.wait_phase("frozen", "Running")
    with pytest.raises(ApiException) as err:
        k.patch_rljob("frozen", {"spec": {"batch": {"trainBatchSize": 16}}})
    assert err.value.status == 422
    assert "spec.batch and spec.algorithm cannot change while the job is" in err.value.body


def test_suspended_job_gets_the_new_template_on_resume(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("retpl", **{"runPolicy.suspend": True}))
    sim.wait_for(k.ns, "retpl")
    sim.follow_suspend(k.ns, "retpl")
    k.wait_phase("retpl", "Suspended")
    k.patch_rljob(
        "retpl", {"spec": {"cluster": {"image": "registry.example/kuberl:2"}, "runPolicy": {"suspend": False}}}
    )

    def updated() -> bool:
        rj = k.rayjob("retpl")
        image = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
        return rj["spec"]["suspend"] is False and image == "registry.example/kuberl:2"

    wait_until("RayJob with the new image, resumed", updated)
    assert "registry.example/kuberl:2" in k.configmap("retpl-spec").data["spec.json"]


# --- invalid specs -----------------------------------------------------------------


def _without_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_cel(v) for key, v in node.items() if key != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [_without_cel(v) for v in node]
    return node


@pytest.fixture
def crd_without_cel(cluster: Cluster, rljob_crd: dict):
    """The RLJob CRD with every CEL rule removed (as an older CRD would be); restored afterwards."""
    apply_json(cluster, _without_cel(copy.deepcopy(rljob_crd)))
    yield
    apply_json(cluster, rljob_crd)
    cluster.wait_established([rljob_crd["metadata"]["name"]])


def test_invalid_rljob_past_admission_fails_with_the_rules_message(
    crd_without_cel: None, operator: OperatorProcess, k: Kube
) -> None:
    doc = rljob("invalid", **{"batch.trainBatchSize": 9, "batch.ppoMiniBatchSize": 3})  # 9 × 4 responses on 2 ranks: ok
    doc["spec"]["cluster"]["trainer"]["gpusPerNode"] = 8  # 36 responses are not divisible by 8 ranks
    issues = validate_document(doc)
    assert issues, "the test case must break a rule"
    # the apiserver may take a moment to drop the CEL rules from its cache
    wait_until("creation without CEL", lambda: _try_create(k, doc), timeout=30, interval=0.5)
    failed = k.wait_phase("invalid", "Failed")
    valid = condition(failed, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert issues[0].message in valid["message"]
    assert issues[0].message in failed["status"]["message"]
    events = k.wait_events("invalid", ["InvalidSpec"])
    assert {e.type for e in events if e.reason == "InvalidSpec"} == {"Warning"}
    time.sleep(1)
    assert k.rayjobs() == []
    with pytest.raises(ApiException) as err:
        k.configmap("invalid-spec")
    assert err.value.status == 404


def _try_create(k: Kube, doc: dict[str, Any]) -> bool:
    try:
        k.create_rljob(doc)
        return True
    except ApiException as exc:
        if exc.status == 422:
            return False
        raise


def test_spec_the_operator_cannot_render_fails_without_a_rayjob(operator: OperatorProcess, k: Kube) -> None:
    doc = rljob("clash", **{"cluster.volumes": [{"name": "kuberl-spec", "emptyDir": {}}]})
    k.create_rljob(doc)
    failed = k.wait_phase("clash", "Failed")
    assert condition(failed, "Valid")["status"] == "False"
    assert "kuberl-spec" in condition(failed, "Valid")["message"]
    assert k.rayjobs() == []


# --- robustness --------------------------------------------------------------------


def test_operator_killed_repeatedly_mid_reconcile_makes_exactly_one_rayjob_each(
    operator: OperatorProcess, k: Kube
) -> None:
    names = [f"crash-{i}" for i in range(6)]
    rng = random.Random(4)
    for name in names:
        k.create_rljob(rljob(name))
        time.sleep(rng.uniform(0.0, 0.3))
        operator.kill()
        operator.start(wait_ready=False)
    for _ in range(4):  # keep killing while the backlog is being worked through
        time.sleep(rng.uniform(0.2, 1.0))
        operator.kill()
        operator.start(wait_ready=False)
    operator.wait_ready()
    for name in names:
        obj = wait_until(f"{name} status", lambda n=name: (o := k.rljob(n)).get("status", {}).get("rayJobName") and o)
        assert condition(obj, "Created")["status"] == "True"
        assert len(k.rayjobs(f"kuberl.io/rljob={name}")) == 1
        assert k.configmap(f"{name}-spec").metadata.owner_references[0].uid == obj["metadata"]["uid"]
    assert len(k.rayjobs()) == len(names)
    # no kopf bookkeeping left half-done, and nothing of it in .status
    for name in names:
        wait_until(
            f"{name} handled",
            lambda n=name: (
                not [a for a in k.rljob(n)["metadata"].get("annotations", {}) if a.startswith("kuberl.io/rljob_")]
            ),
            timeout=30,
        )
        assert "kopf" not in k.rljob(name)["status"]


def test_status_written_while_the_operator_was_down_is_caught_up(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("catchup"))
    sim.wait_for(k.ns, "catchup")
    k.wait_phase("catchup", "Pending")
    operator.stop()
    sim.initializing(k.ns, "catchup")
    sim.running(k.ns, "catchup")
    operator.start()
    k.wait_phase("catchup", "Running")


def test_a_status_changed_behind_the_operators_back_is_corrected_by_the_resync(
    operator: OperatorProcess, k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("drift"))
    sim.wait_for(k.ns, "drift")
    sim.running(k.ns, "drift")
    k.wait_phase("drift", "Running")
    k.custom.patch_namespaced_custom_object_status(  # no RayJob event follows this: only the resync sees it
        GROUP,
        VERSION,
        k.ns,
        PLURAL,
        "drift",
        {"status": {"phase": "Pending"}},
        _content_type="application/merge-patch+json",
    )
    assert k.phase("drift") == "Pending"
    k.wait_phase("drift", "Running", timeout=20)  # --resync-seconds 5 (conftest)


def test_trainer_progress_survives_operator_status_writes(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("prog"))
    sim.wait_for(k.ns, "prog")
    sim.running(k.ns, "prog")
    k.wait_phase("prog", "Running")
    k.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        k.ns,
        PLURAL,
        "prog",
        {"status": {"progress": {"step": 3, "totalSteps": 10, "rewardMean": 0.5}}},
        _content_type="application/merge-patch+json",
    )
    sim.complete(k.ns, "prog")
    done = k.wait_phase("prog", "Succeeded")
    assert done["status"]["progress"]["step"] == 3
    assert done["status"]["progress"]["rewardMean"] == 0.5


def test_rayjob_deleted_under_a_live_rljob_fails_it(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("orphan"))
    sim.wait_for(k.ns, "orphan")
    k.wait_phase("orphan", "Pending")
    k.custom.delete_namespaced_custom_object("ray.io", "v1", k.ns, "rayjobs", "orphan")
    failed = k.wait_phase("orphan", "Failed")
    assert condition(failed, "Failed")["reason"] == "RayJobDeleted"


# --- deletion ----------------------------------------------------------------------


def test_deleting_the_rljob_garbage_collects_its_children(cluster: Cluster, operator: OperatorProcess, k: Kube) -> None:
    created = k.create_rljob(rljob("gone"))
    rayjob = wait_until("RayJob", lambda: k.rayjob("gone"))
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    k.custom.delete_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, "gone")
    if not cluster.controller_manager:
        pytest.skip("no kube-controller-manager: ownerReferences checked, GC not observable")
    wait_until("RayJob collected", lambda: not k.rayjobs("kuberl.io/rljob=gone"), timeout=120)

    def configmap_gone() -> bool:
        try:
            k.configmap("gone-spec")
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_until("ConfigMap collected", configmap_gone, timeout=120)


def test_recreated_rljob_of_the_same_name_gets_its_own_rayjob(operator: OperatorProcess, k: Kube) -> None:
    first = k.create_rljob(rljob("again"))
    wait_until("RayJob", lambda: k.rayjob("again"))
    k.custom.delete_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, "again")
    wait_until(
        "RLJob gone",
        lambda: (
            not [
                o
                for o in k.custom.list_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL)["items"]
                if o["metadata"]["name"] == "again"
            ]
            or None
        ),
    )
    second = k.create_rljob(rljob("again"))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    # the garbage collector removes the old children first; it may need a discovery round (30 s) for a new CRD
    rayjob = wait_until(
        "the new RayJob",
        lambda: (r := k.rayjob("again"))["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"] and r,
        timeout=300,
    )
    assert rayjob
    k.wait_phase("again", "Pending", timeout=30)


# --- operations --------------------------------------------------------------------


def test_metrics_and_health_endpoints(operator: OperatorProcess, k: Kube, sim: KubeRaySim) -> None:
    k.create_rljob(rljob("metered"))
    sim.wait_for(k.ns, "metered")
    sim.running(k.ns, "metered")
    k.wait_phase("metered", "Running")
    wait_until("gauge", lambda: 'kuberl_operator_rljobs{phase="Running"} 1.0' in operator.metrics())
    text = operator.metrics()
    assert 'kuberl_operator_reconcile_duration_seconds_count{handler="create"}' in text
    assert "kuberl_operator_reconcile_errors_total" in text or "kuberl_operator_reconcile_errors" in text
    assert operator.healthz()


def test_operator_runs_with_exactly_the_documented_rbac(
    cluster: Cluster, namespace: str, k: Kube, sim: KubeRaySim, tmp_path
) -> None:
    """The `limited` user gets only rbac.OPERATOR_RULES in the namespace; the whole create → status cycle works."""
    grant_operator_rules(cluster, namespace)
    proc = OperatorProcess(kubeconfig=cluster.limited_kubeconfig, log_dir=tmp_path / "op", namespaces=(namespace,))
    proc.start()
    try:
        k.create_rljob(rljob("least"))
        sim.wait_for(k.ns, "least")
        sim.running(k.ns, "least")
        k.wait_phase("least", "Running")
        k.wait_events("least", ["Running"])
        k.patch_rljob("least", {"spec": {"runPolicy": {"suspend": True}}})
        wait_until("suspend propagated", lambda: k.rayjob("least")["spec"]["suspend"] is True)
        logs = proc.logs()
        assert "forbidden" not in logs.lower(), logs[-5000:]
    finally:
        proc.stop()
        print(proc.logs()[-20000:])
