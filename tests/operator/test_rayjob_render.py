"""render_rayjob / render_configmap: the RayJob KubeRay would run, for every example and the corner cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.operator.kuberay_rules import kuberay_checks, rayjob_schema_errors
from kuberl.api import load_rljob
from kuberl.api.contract import CHECKPOINT_MOUNT
from kuberl.api.spec import DEFAULT_RETRIES_ON_CLAIM, DEFAULT_TERMINATION_GRACE_SECONDS, RLJobSpec
from kuberl.operator.rayjob import (
    NCCL_ENV,
    configmap_name,
    pod_view,
    render_checkpoint_claim,
    render_configmap,
    render_rayjob,
    spec_hash,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
UID = "0b0b0b0b-1111-2222-3333-444444444444"


def base_spec(**cluster) -> dict:
    return {
        "model": {"path": "/models/m"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["/data/train.parquet"]},
        "batch": {"trainBatchSize": 64, "rolloutN": 4, "ppoMiniBatchSize": 32, "ppoMicroBatchSizePerGPU": 4},
        "cluster": {"trainer": {"nodes": 2, "gpusPerNode": 8}, **cluster},
    }


def spec_of(doc: dict) -> RLJobSpec:
    return RLJobSpec.model_validate(doc)


def containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_a_rayjob_the_kuberay_crd_and_controller_accept(path: Path) -> None:
    name, spec = load_rljob(path)
    rayjob = render_rayjob(name, "team-a", UID, spec)
    assert rayjob_schema_errors(rayjob) == []
    assert kuberay_checks(rayjob) == []


def test_the_strict_schema_catches_an_unknown_field() -> None:
    rayjob = render_rayjob("j", "ns", UID, spec_of(base_spec()))
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicaz"] = 2
    assert any("replicaz" in e for e in rayjob_schema_errors(rayjob))


def test_kuberay_checks_catch_suspend_without_shutdown_and_long_names() -> None:
    rayjob = render_rayjob("j" * 48, "ns", UID, spec_of(base_spec()))
    rayjob["spec"]["suspend"] = True
    rayjob["spec"]["shutdownAfterJobFinishes"] = False
    errors = kuberay_checks(rayjob)
    assert any("47" in e for e in errors)
    assert any("suspended" in e for e in errors)


def test_rayjob_is_named_like_the_rljob_and_owned_by_it() -> None:
    rayjob = render_rayjob("gsm8k", "team-a", UID, spec_of(base_spec()))
    meta = rayjob["metadata"]
    assert (meta["name"], meta["namespace"]) == ("gsm8k", "team-a")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "name": "gsm8k",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"]["kuberl.io/rljob"] == "gsm8k"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "kuberl-operator"
    assert "kueue.x-k8s.io/queue-name" not in meta["labels"]


def test_queue_name_becomes_the_kueue_label() -> None:
    rayjob = render_rayjob("j", "ns", UID, spec_of(base_spec(queueName="team-a-gpus")))
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpus"


def test_entrypoint_runs_the_trainer_on_the_mounted_spec() -> None:
    rayjob = render_rayjob("gsm8k", "team-a", UID, spec_of(base_spec()))
    assert rayjob["spec"]["entrypoint"] == (
        "python -m kuberl.trainer.run --spec-file /etc/kuberl/spec.json --name gsm8k --namespace team-a"
    )


def test_run_policy_maps_to_rayjob_fields() -> None:
    doc = base_spec()
    doc["runPolicy"] = {
        "suspend": True,
        "backoffLimit": 3,
        "activeDeadlineSeconds": 7200,
        "ttlSecondsAfterFinished": 60,
    }
    spec = render_rayjob("j", "ns", UID, spec_of(doc))["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert (spec["suspend"], spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        True,
        3,
        7200,
        60,
    )


def test_every_ray_pod_gets_the_grace_period_and_a_prestop_hook_that_saves_before_it_dies() -> None:
    name, spec = load_rljob(ROOT / "examples" / "separate-rollout.yaml")  # a trainer and a rollout group
    spec = spec.model_copy(
        update={"run_policy": spec.run_policy.model_copy(update={"termination_grace_period_seconds": 900})}
    )
    rayjob = render_rayjob(name, "ns", UID, spec)
    assert rayjob_schema_errors(rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    head, *workers = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    assert len(workers) == 2
    for group in (head, *workers):
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] == 900
    (head_container,) = containers(head)
    assert head_container["lifecycle"]["preStop"]["exec"]["command"] == [
        *("python", "-m", "kuberl.trainer.prestop", "head", "--timeout", "900"),
        *("--dashboard", "http://127.0.0.1:8265"),
    ]
    assert env_of(head_container)["RAY_JOB_STOP_WAIT_TIME_S"] == "900"  # Ray's supervisor: SIGKILL only after it
    for group in workers:
        (worker,) = containers(group)
        assert worker["lifecycle"]["preStop"]["exec"]["command"] == [
            *("python", "-m", "kuberl.trainer.prestop", "worker", "--timeout", "900")
        ]
    default = render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert default["template"]["spec"]["terminationGracePeriodSeconds"] == DEFAULT_TERMINATION_GRACE_SECONDS


def test_active_deadline_is_omitted_unless_set() -> None:
    spec = render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]
    assert "activeDeadlineSeconds" not in spec
    assert spec["suspend"] is False


def test_backoff_limit_defaults_to_retries_only_with_checkpoints_on_a_claim() -> None:
    on_claim = render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]
    assert on_claim["backoffLimit"] == DEFAULT_RETRIES_ON_CLAIM > 0
    off_claim = render_rayjob("j", "ns", UID, spec_of(base_spec() | {"storage": {}}))["spec"]
    assert off_claim["backoffLimit"] == 0
    explicit = render_rayjob("j", "ns", UID, spec_of(base_spec() | {"runPolicy": {"backoffLimit": 0}}))["spec"]
    assert explicit["backoffLimit"] == 0


def test_head_has_no_gpus_and_reports_status() -> None:
    doc = base_spec(head={"cpu": "2", "memory": "8Gi", "nodeSelector": {"pool": "cpu"}})
    head = render_rayjob("j", "ns", UID, spec_of(doc))["spec"]["rayClusterSpec"]["headGroupSpec"]
    (container,) = containers(head)
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    assert env_of(container)["KUBERL_REPORT_STATUS"] == "1"
    assert head["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert head["rayStartParams"]["num-cpus"] == "0"


def test_trainer_group_has_fixed_size_gpus_shm_and_nccl_env() -> None:
    doc = base_spec()
    doc["cluster"]["trainer"].update(
        {
            "cpu": "32",
            "memory": "256Gi",
            "sharedMemory": "32Gi",
            "nodeSelector": {"pool": "h100"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
        }
    )
    (group,) = render_rayjob("j", "ns", UID, spec_of(doc))["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["groupName"] == "trainer"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    (container,) = containers(group)
    assert container["resources"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8}
    assert container["resources"]["requests"] == {"cpu": "32", "memory": "256Gi"}
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "h100"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
    ]
    assert pod["affinity"]["nodeAffinity"]
    shm = next(v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    assert shm["emptyDir"]["sizeLimit"] == "32Gi"
    assert {"name": shm["name"], "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = env_of(container)
    for key, value in NCCL_ENV:
        assert env[key] == value
    assert "KUBERL_REPORT_STATUS" not in env


def test_cpu_device_requests_no_gpus() -> None:
    name, spec = load_rljob(ROOT / "examples" / "tiny-cpu.yaml")
    rayjob = render_rayjob(name, "ns", UID, spec)
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert "nvidia.com/gpu" not in containers(group)[0]["resources"]["limits"]


def test_separate_placement_adds_a_rollout_group_from_cluster_rollout() -> None:
    name, spec = load_rljob(ROOT / "examples" / "separate-rollout.yaml")
    groups = render_rayjob(name, "ns", UID, spec)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer", "rollout"]
    rollout = groups[1]
    assert rollout["replicas"] == spec.cluster.rollout.nodes
    assert rollout["template"]["spec"]["nodeSelector"] == {"pool": "h200-rollout"}
    assert rollout["labels"] == {"kuberl.io/pool": "rollout"}
    assert rollout["template"]["metadata"]["labels"]["kuberl.io/pool"] == "rollout"


def test_colocated_placement_has_only_the_trainer_group() -> None:
    groups = render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer"]


def test_every_pod_mounts_the_spec_configmap_and_the_user_volumes() -> None:
    doc = base_spec(
        volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "rl-ckpt"}}],
        volumeMounts=[{"name": "ckpt", "mountPath": "/checkpoints", "subPath": "run1"}],
        env=[
            {"name": "HF_HOME", "value": "/checkpoints/hf"},
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
        image="registry.example/kuberl:1",
        imagePullPolicy="Always",
        serviceAccountName="rl-runner",
        priorityClassName="training",
        rayVersion="2.60.1",
    )
    rayjob = render_rayjob("j", "ns", UID, spec_of(doc))
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.1"
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kuberl-spec"] == {"name": "kuberl-spec", "configMap": {"name": configmap_name("j")}}
        assert volumes["ckpt"] == {"name": "ckpt", "persistentVolumeClaim": {"claimName": "rl-ckpt"}}
        assert {"name": "kuberl-spec", "mountPath": "/etc/kuberl", "readOnly": True} in container["volumeMounts"]
        assert {"name": "ckpt", "mountPath": "/checkpoints", "subPath": "run1"} in container["volumeMounts"]
        assert (container["image"], container["imagePullPolicy"]) == ("registry.example/kuberl:1", "Always")
        assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("rl-runner", "training")
        env = env_of(container)
        assert env["HF_HOME"] == "/checkpoints/hf"
        assert env["NCCL_DEBUG"] == "INFO"  # the user's value wins
        assert [e["name"] for e in container["env"]].count("NCCL_DEBUG") == 1
        assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}} in container["env"]
    assert rayjob_schema_errors(rayjob) == []
    assert kuberay_checks(rayjob) == []


def test_configmap_holds_the_defaulted_spec_as_json() -> None:
    spec = spec_of(base_spec())
    cm = render_configmap("gsm8k", "team-a", UID, spec)
    assert cm["metadata"]["name"] == "gsm8k-spec"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == UID
    data = json.loads(cm["data"]["spec.json"])
    assert data["batch"]["trainBatchSize"] == 64
    assert data["rollout"]["engine"] == "vllm"  # a default, filled in
    assert RLJobSpec.model_validate(data) == pod_view(spec, "gsm8k", UID)
    # relative: in the RLJob's own folder on the claim
    assert data["trainer"]["checkpointDir"] == f"{CHECKPOINT_MOUNT}/gsm8k-{UID}/checkpoints"


def test_spec_hash_is_stable_and_tracks_changes() -> None:
    a, b = spec_of(base_spec()), spec_of(base_spec(image="other:1"))
    assert spec_hash(a, "j", UID) == spec_hash(spec_of(base_spec()), "j", UID)
    assert spec_hash(a, "j", UID) != spec_hash(b, "j", UID)
    assert render_rayjob("j", "ns", UID, a)["metadata"]["annotations"]["kuberl.io/spec-hash"] == spec_hash(a, "j", UID)


# --- pod settings per pool and head (issue 20) ---------------------------------------

POD_SETTINGS = {
    "labels": {"team": "rl", "example.com/cost-center": "42"},
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
    "imagePullSecrets": ["regcred"],
    "envFrom": [{"secretRef": {"name": "hf-token"}}, {"configMapRef": {"name": "proxy"}}],
    "extraResources": {"rdma/hca_shared_devices_a": "1"},
    "schedulerName": "volcano",
    "runtimeClassName": "nvidia",
    "priorityClassName": "rl-high",
}


def test_pod_settings_reach_every_pool_and_the_head_and_kuberay_accepts_them() -> None:
    head_affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    doc = base_spec(
        head={"pod": {**POD_SETTINGS, "extraResources": {}}, "affinity": head_affinity},
        rollout={"nodes": 1, "gpusPerNode": 8, "pod": {"schedulerName": "kai-scheduler"}},
        priorityClassName="rl-default",
    )
    doc["rollout"] = {"placement": "separate"}
    doc["cluster"]["trainer"]["pod"] = POD_SETTINGS
    rayjob = render_rayjob("j", "ns", UID, spec_of(doc))
    assert rayjob_schema_errors(rayjob) == []
    assert kuberay_checks(rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    head, (trainer, rollout) = cluster["headGroupSpec"], cluster["workerGroupSpecs"]
    for group in (head, trainer):
        meta, pod = group["template"]["metadata"], group["template"]["spec"]
        assert meta["labels"]["team"] == "rl" and meta["labels"]["kuberl.io/rljob"] == "j"
        assert meta["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["schedulerName"] == "volcano" and pod["runtimeClassName"] == "nvidia"
        assert pod["priorityClassName"] == "rl-high"  # the pool's wins over cluster.priorityClassName
        assert containers(group)[0]["envFrom"] == POD_SETTINGS["envFrom"]
    assert head["template"]["spec"]["affinity"] == head_affinity
    resources = containers(trainer)[0]["resources"]
    assert resources["requests"]["rdma/hca_shared_devices_a"] == "1"
    assert resources["limits"] == {
        "cpu": "16",
        "memory": "128Gi",
        "rdma/hca_shared_devices_a": "1",
        "nvidia.com/gpu": 8,
    }
    rollout_pod = rollout["template"]["spec"]
    assert rollout_pod["schedulerName"] == "kai-scheduler" and rollout_pod["priorityClassName"] == "rl-default"
    assert "imagePullSecrets" not in rollout_pod and "annotations" not in rollout["template"]["metadata"]


def test_managed_by_reaches_the_rayjob_only_when_set() -> None:
    assert "managedBy" not in render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]
    doc = base_spec(queueName="team-a", managedBy="kueue.x-k8s.io/multikueue")
    rayjob = render_rayjob("j", "ns", UID, spec_of(doc))
    assert rayjob["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert rayjob_schema_errors(rayjob) == []


def issues_of(spec: dict) -> dict[str, str]:
    from kuberl.api.validation import validate_document

    doc = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"}, "spec": spec}
    return {i.field: i.message for i in validate_document(doc)}


@pytest.mark.parametrize(
    ("cluster", "field", "words"),
    [
        ({"trainer": {"pod": {"labels": {"kuberl.io/pool": "x"}}}}, "spec.cluster.trainer.pod.labels", "kuberl.io/"),
        ({"head": {"pod": {"labels": {"ray.io/node-type": "x"}}}}, "spec.cluster.head.pod.labels", "ray.io/"),
        (
            {"trainer": {"pod": {"extraResources": {"nvidia.com/gpu": "8"}}}},
            "spec.cluster.trainer.pod.extraResources",
            "gpusPerNode",
        ),
        (
            {"head": {"pod": {"extraResources": {"memory": "1Gi"}}}},
            "spec.cluster.head.pod.extraResources",
            "domain/name",
        ),
        ({"managedBy": "kueue.x-k8s.io/multikueue"}, "spec.cluster.managedBy", "needs cluster.queueName"),
    ],
    ids=["pool-label-reserved", "head-label-reserved", "gpu-as-extra", "memory-as-extra", "multikueue-without-queue"],
)
def test_bad_pod_settings_are_refused_naming_the_field(cluster: dict, field: str, words: str) -> None:
    spec = base_spec()
    for key, value in cluster.items():
        spec["cluster"][key] = {**spec["cluster"].get(key, {}), **value} if isinstance(value, dict) else value
    issues = issues_of(spec)
    assert field in issues and words in issues[field], issues


def test_rollout_pod_settings_are_checked_too() -> None:
    spec = base_spec(rollout={"nodes": 1, "pod": {"labels": {"kuberl.io/rljob": "other"}}})
    spec["rollout"] = {"placement": "separate"}
    assert "spec.cluster.rollout.pod.labels" in issues_of(spec)


def test_network_settings_become_nccl_and_gloo_variables_in_every_pod() -> None:
    doc = base_spec(network={"socketInterface": "^lo,docker", "ibHca": "mlx5_0,mlx5_1"})
    cluster = render_rayjob("j", "ns", UID, spec_of(doc))["spec"]["rayClusterSpec"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        env = env_of(containers(group)[0])
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "^lo,docker"
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and "NCCL_IB_DISABLE" not in env
    plain = env_of(
        containers(render_rayjob("j", "ns", UID, spec_of(base_spec()))["spec"]["rayClusterSpec"]["headGroupSpec"])[0]
    )
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE"} & set(plain)
    tcp = render_rayjob("j", "ns", UID, spec_of(base_spec(network={"disableIB": True})))
    assert env_of(containers(tcp["spec"]["rayClusterSpec"]["workerGroupSpecs"][0])[0])["NCCL_IB_DISABLE"] == "1"


def test_contradicting_network_settings_are_refused() -> None:
    issues = issues_of(base_spec(network={"ibHca": "mlx5_0", "disableIB": True}))
    assert "disableIB is true" in issues["spec.cluster.network.ibHca"]


def test_a_queued_rayjob_meets_what_kueues_rayjob_webhook_requires() -> None:
    """Kueue's RayJob webhook refuses in-tree autoscaling, a cluster that outlives the job (shutdownAfterJobFinishes
    false, or clusterSelector: an existing cluster) and more worker groups than its pod sets hold (8 with the head
    and the submitter: 6 worker groups); the largest RLJob (separate rollout) renders none of those."""
    doc = base_spec(queueName="team-a", rollout={"nodes": 2, "gpusPerNode": 8})
    doc["rollout"] = {"placement": "separate"}
    rayjob = render_rayjob("j", "ns", UID, spec_of(doc))
    spec = rayjob["spec"]
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert spec["shutdownAfterJobFinishes"] is True
    assert "clusterSelector" not in spec
    assert not spec["rayClusterSpec"].get("enableInTreeAutoscaling", False)
    assert len(spec["rayClusterSpec"]["workerGroupSpecs"]) <= 6
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"]  # a fixed size Kueue can admit


# --- checkpoint storage ------------------------------------------------------------


def pods_of(rayjob: dict) -> list[dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    return [g["template"]["spec"] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]


def test_the_default_claim_is_created_kept_and_mounted_at_one_path_on_every_pod() -> None:
    spec = spec_of(base_spec())
    claim = render_checkpoint_claim("j", "ns", UID, spec)
    assert claim is not None and claim["metadata"]["name"] == "j-checkpoints"
    assert "ownerReferences" not in claim["metadata"]  # retention Retain: the claim outlives the RLJob
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}
    for pod in pods_of(render_rayjob("j", "ns", UID, spec)):
        assert {"name": "kuberl-checkpoints", "persistentVolumeClaim": {"claimName": "j-checkpoints"}} in pod["volumes"]
        (container,) = pod["containers"]
        assert {"name": "kuberl-checkpoints", "mountPath": CHECKPOINT_MOUNT} in container["volumeMounts"]


def test_retention_delete_makes_the_rljob_own_the_claim() -> None:
    doc = {**base_spec(), "storage": {"claim": {"size": "5Gi", "storageClassName": "nfs"}, "retention": "Delete"}}
    claim = render_checkpoint_claim("j", "ns", UID, spec_of(doc))
    assert claim is not None
    assert claim["metadata"]["ownerReferences"][0]["uid"] == UID
    assert claim["spec"]["storageClassName"] == "nfs"


def test_an_existing_claim_is_mounted_and_nothing_is_created() -> None:
    spec = spec_of({**base_spec(), "storage": {"claimName": "rl-checkpoints"}})
    assert render_checkpoint_claim("j", "ns", UID, spec) is None
    for pod in pods_of(render_rayjob("j", "ns", UID, spec)):
        assert {"name": "kuberl-checkpoints", "persistentVolumeClaim": {"claimName": "rl-checkpoints"}} in pod[
            "volumes"
        ]


def test_without_storage_no_claim_is_mounted_and_the_checkpoint_dir_is_kept() -> None:
    doc = {**base_spec(), "storage": {}, "trainer": {"checkpointDir": "/data/ckpt"}}
    spec = spec_of(doc)
    assert render_checkpoint_claim("j", "ns", UID, spec) is None
    assert json.loads(render_configmap("j", "ns", UID, spec)["data"]["spec.json"])["trainer"]["checkpointDir"] == (
        "/data/ckpt"
    )
    for pod in pods_of(render_rayjob("j", "ns", UID, spec)):
        assert all(v["name"] != "kuberl-checkpoints" for v in pod["volumes"])


@pytest.mark.parametrize("version", ["2.52.0", "2.60.0", "v3.0", "2.52.0-rc1"])
def test_the_ray_cluster_requires_a_token_and_kuberay_accepts_the_version(version: str) -> None:
    rayjob = render_rayjob("job", "team-a", UID, spec_of(base_spec(rayVersion=version)))
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    assert kuberay_checks(rayjob) == []


def test_kuberay_checks_refuse_token_mode_on_an_old_ray_as_kuberay_does() -> None:
    rayjob = render_rayjob("job", "team-a", UID, spec_of(base_spec()))
    rayjob["spec"]["rayClusterSpec"]["rayVersion"] = "2.51.0"
    assert kuberay_checks(rayjob) == ["authOptions.mode is 'token' but minimum Ray version is 2.52.0, got 2.51.0"]
