"""The cluster commands' pure parts: what `kuberl status` prints, the log reader pod mirrored from the RayJob's head
pod (as the operator renders it), and the kubeconfig, context and namespace picked as kubectl picks them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.contract import CHECKPOINT_MOUNT, DRIVER_LOG
from kuberl.api.documents import load_rljob
from kuberl.cluster.kube import connect
from kuberl.cluster.logs import LogUnavailable, head_template, log_path, reader_pod, spec_configmap
from kuberl.cluster.view import pod_row, progress_line, status_text
from kuberl.operator.rayjob import render_rayjob, spec_json

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def rljob(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "gsm8k", "namespace": "rl-team", "uid": "u-1"}, "status": status}


RUNNING = {
    "phase": "Running",
    "startTime": "2026-12-05T11:30:00Z",
    "rayJobName": "gsm8k-x7k2p",
    "rayClusterName": "gsm8k-x7k2p-raycluster",
    "restarts": 1,
    "progress": {
        "step": 120,
        "totalSteps": 900,
        "percentComplete": 13,
        "rewardMean": 0.4213,
        "estimatedRemainingTimeSummary": "2h05m",
        "tokensPerSecond": 15234.5,
        "lastCheckpoint": "/var/lib/kuberl/checkpoints/gsm8k/global_step_100",
        "updatedAt": "2026-12-05T11:59:20Z",
    },
    "conditions": [
        {"type": "Running", "status": "True", "reason": "RayJobRunning", "message": "the trainer runs"},
        {"type": "ClusterReady", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"},
    ],
}


def pod(name: str, labels: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{}], "nodeName": "gpu-1"},
        "status": status,
    }


def test_status_shows_phase_since_when_progress_conditions_and_pods() -> None:
    pods = [
        pod(
            "gsm8k-head-1",
            {"ray.io/node-type": "head"},
            phase="Running",
            containerStatuses=[{"ready": True, "restartCount": 2}],
        ),
        pod(
            "gsm8k-worker-1",
            {"ray.io/node-type": "worker", "ray.io/group": "trainer"},
            phase="Pending",
            containerStatuses=[{"ready": False, "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
        ),
    ]
    text = status_text({**rljob(RUNNING)}, pods, NOW)
    lines = text.splitlines()
    assert lines[0] == "RLJob gsm8k in rl-team: Running, started 2026-12-05T11:30:00Z (30m00s ago)"
    assert "  progress: Running  step 120/900 (13%)  reward 0.4213  ETA 2h05m" not in text  # no phase twice
    assert "step 120/900 (13%)  reward 0.4213  ETA 2h05m" in text
    assert "  throughput: 15,234 tokens/s" in text
    assert "  reported: 2026-12-05T11:59:20Z (40s ago)" in text
    assert "  RayJob gsm8k-x7k2p, RayCluster gsm8k-x7k2p-raycluster, restarts 1" in text
    assert "    ClusterReady=False  Unschedulable: 0/3 nodes are available" in text
    assert lines[-2].split() == ["gsm8k-head-1", "head", "Running", "1/1", "restarts", "2", "gpu-1"]
    assert lines[-1].split()[:3] == ["gsm8k-worker-1", "trainer", "ImagePullBackOff"]


def test_the_progress_line_names_what_blocks_a_job() -> None:
    assert progress_line(rljob(RUNNING)) == (
        "Running  step 120/900 (13%)  reward 0.4213  ETA 2h05m  ClusterReady=False Unschedulable"
    )
    failed = {"phase": "Failed", "message": "reward function raised: KeyError 'answer'"}
    assert progress_line(rljob(failed)) == "Failed  reward function raised: KeyError 'answer'"


def test_a_pod_that_cannot_be_scheduled_shows_the_reason() -> None:
    unscheduled = pod(
        "p", {}, phase="Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    )
    unscheduled["spec"].pop("nodeName")
    assert pod_row(unscheduled) == ("p", "-", "Unschedulable", "0/1", "restarts 0", "-")


# --- the log reader ---------------------------------------------------------------------------------------------


def rendered(example: str = "gsm8k-grpo.yaml", **changes: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    name, spec = load_rljob(ROOT / "examples" / example)
    spec = spec.model_copy(update=changes)
    rayjob = render_rayjob(name, "rl-team", "u-1", spec)
    return {"metadata": {"name": name, "namespace": "rl-team", "uid": "u-1"}}, rayjob, spec_json(spec, name, "u-1")


def test_the_log_path_is_the_pods_checkpoint_dir_on_the_claim() -> None:
    _, rayjob, spec = rendered()
    assert spec_configmap(head_template(rayjob)) == "gsm8k-grpo-spec"
    assert log_path(spec) == f"{CHECKPOINT_MOUNT}/gsm8k-grpo-u-1/gsm8k-grpo/{DRIVER_LOG}"  # the RLJob's own folder


def test_the_reader_pod_mounts_what_the_head_mounts_read_only_and_prints_the_log() -> None:
    job, rayjob, spec = rendered()
    head = head_template(rayjob)["spec"]
    path = log_path(spec)
    pod = reader_pod(job, head_template(rayjob), path, follow=True, tail=None)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["tail", "-n", "+1", "-F", path]
    assert container["image"] == head["containers"][0]["image"]
    assert all(m["readOnly"] for m in container["volumeMounts"])
    claim = next(m for m in container["volumeMounts"] if m["mountPath"] == CHECKPOINT_MOUNT)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == claim["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "rl-checkpoints"
    assert (
        pod["spec"].get("nodeSelector") == head.get("nodeSelector")
        and pod["spec"]["securityContext"] == head["securityContext"]
    )
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert len(pod["metadata"]["name"]) <= 63 and pod["metadata"]["labels"]["kuberl.io/rljob"] == "gsm8k-grpo"
    once = reader_pod(job, head_template(rayjob), path, follow=False, tail=20)
    assert once["spec"]["containers"][0]["command"] == ["tail", "-n", "20", path]


def test_a_log_on_no_volume_is_refused_with_why() -> None:
    job, rayjob, _ = rendered()
    with pytest.raises(LogUnavailable, match="is on no volume the head pod mounts"):
        reader_pod(job, head_template(rayjob), "/tmp/checkpoints/logs/driver.log", follow=False, tail=None)


# --- kubeconfig and namespace as kubectl picks them ------------------------------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    cluster = {"name": "c", "cluster": {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "team", "context": {"cluster": "c", "user": "u", "namespace": "rl-team"}},
                    {"name": "plain", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "team",
            }
        )
    )
    return path


def test_the_namespace_is_the_flag_else_the_contexts_else_default(kubeconfig: Path) -> None:
    assert connect(str(kubeconfig), None, None).namespace == "rl-team"
    assert connect(str(kubeconfig), None, "other").namespace == "other"
    assert connect(str(kubeconfig), "plain", None).namespace == "default"


def test_kubeconfig_comes_from_the_environment_as_for_kubectl(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    target = connect(None, "plain", None)
    assert target.api.configuration.host == "https://10.0.0.1:6443" and target.context == "plain"
