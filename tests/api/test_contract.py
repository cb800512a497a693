"""The operator-trainer contract: what the rendered RayJob sets is what the trainer reads, by the contract's names."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from kuberl.api import contract, load_rljob
from kuberl.api.spec import EnvVar
from kuberl.api.status import Progress, RLJobStatus
from kuberl.operator.rayjob import NCCL_ENV, render_rayjob
from kuberl.operator.status import next_status, status_patch
from kuberl.trainer import prestop, run
from kuberl.trainer.observe.status import StatusReporter

ROOT = Path(__file__).resolve().parents[2]
TRAINER_SOURCES = sorted((ROOT / "trainer" / "kuberl" / "trainer").rglob("*.py"))
UID = "0b0b0b0b-1111-2222-3333-444444444444"
CONTRACT_ENV = {value for name, value in vars(contract).items() if name.startswith("ENV_") and isinstance(value, str)}


def rendered(namespace: str = "team-a") -> dict:
    name, spec = load_rljob(ROOT / "examples" / "separate-rollout.yaml")  # head, trainer and rollout pools
    return render_rayjob(name, namespace, UID, spec)


def pods(rayjob: dict) -> dict[str, dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = {contract.HEAD_POOL: cluster["headGroupSpec"]}
    groups |= {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    return groups


def env_of(group: dict) -> dict[str, str]:
    (container,) = group["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "<valueFrom>") for e in container["env"]}


def names_used(path: Path) -> set[str]:
    """Every identifier and attribute name in a module (`ENV_REPORT_STATUS`, `contract.ENV_REPORT_STATUS`)."""
    tree = ast.parse(path.read_text())
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }


def test_the_pods_set_no_kuberl_variable_outside_the_contract() -> None:
    ours = {k for k, _ in NCCL_ENV}  # read by NCCL, torch and Ray, not by kuberl
    ours.add(contract.RAY_JOB_STOP_WAIT_ENV)  # read by Ray's job supervisor on the head
    for pool, group in pods(rendered()).items():
        assert set(env_of(group)) - ours <= CONTRACT_ENV, pool


def test_the_head_pod_sets_every_contract_variable_but_kuberays_and_the_workers_none() -> None:
    groups = pods(rendered())
    assert set(groups) == {contract.HEAD_POOL, contract.TRAINER_POOL, contract.ROLLOUT_POOL}
    assert CONTRACT_ENV & set(env_of(groups.pop(contract.HEAD_POOL))) == CONTRACT_ENV - set(contract.RAY_AUTH_ENV)
    for pool, group in groups.items():
        assert not CONTRACT_ENV & set(env_of(group)), pool


def test_the_ray_cluster_requires_kuberays_token_and_no_pod_can_turn_it_off() -> None:
    """KubeRay sets RAY_AUTH_MODE and RAY_AUTH_TOKEN only where a container has none: a user's own are dropped."""
    name, spec = load_rljob(ROOT / "examples" / "separate-rollout.yaml")
    spec.cluster.env.extend(EnvVar(name=var, value="disabled") for var in contract.RAY_AUTH_ENV)
    rayjob = render_rayjob(name, "team-a", UID, spec)
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": contract.RAY_AUTH_MODE_TOKEN}
    templates = [g["template"] for g in pods(rayjob).values()] + [rayjob["spec"]["submitterPodTemplate"]]
    for template in templates:
        for container in template["spec"]["containers"]:
            assert not {e["name"] for e in container.get("env") or []} & set(contract.RAY_AUTH_ENV)


@pytest.mark.parametrize("constant", sorted(n for n in vars(contract) if n.startswith("ENV_")))
def test_the_trainer_reads_every_contract_variable(constant: str) -> None:
    readers = [p.name for p in TRAINER_SOURCES if constant in names_used(p)]
    assert readers, f"contract.{constant} is set by the operator but no trainer module reads it"


def test_the_prestop_module_parses_the_hooks_the_operator_renders() -> None:
    for pool, group in pods(rendered()).items():
        (container,) = group["template"]["spec"]["containers"]
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:3] == ["python", "-m", contract.PRESTOP_MODULE]
        args = prestop.parse_args(command[3:])
        assert args.role == ("head" if pool == contract.HEAD_POOL else "worker")
        assert args.timeout == group["template"]["spec"]["terminationGracePeriodSeconds"]


def test_the_trainer_parses_the_entrypoint_the_operator_renders() -> None:
    command = shlex.split(rendered("team-a")["spec"]["entrypoint"])
    assert command[:3] == ["python", "-m", contract.TRAINER_MODULE]
    args = run.parse_args(command[3:])
    assert (args.spec_file, args.name, args.namespace) == (contract.SPEC_PATH, "separate-rollout", "team-a")


def test_the_trainer_takes_its_namespace_from_the_head_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env_of(pods(rendered("team-b"))[contract.HEAD_POOL]).items():
        monkeypatch.setenv(key, value)
    assert run.parse_args(["--spec-file", contract.SPEC_PATH, "--name", "j"]).namespace == "team-b"


def test_the_head_pod_turns_status_reporting_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # stands in for the pod's in-cluster credentials
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv(contract.ENV_REPORT_STATUS, raising=False)
    assert StatusReporter.from_env("j", "team-a") is None
    for key, value in env_of(pods(rendered())[contract.HEAD_POOL]).items():
        monkeypatch.setenv(key, value)
    assert StatusReporter.from_env("j", "team-a") is not None


def test_the_trainer_progress_patch_is_a_valid_status_the_operator_leaves_alone() -> None:
    body = StatusReporter.body(Progress(step=3, total_steps=10, reward_mean=0.5, tokens_per_second=12.0))
    status = RLJobStatus.model_validate(body["status"])  # extra="forbid": a misspelt key fails here
    assert status.progress is not None and status.progress.step == 3 and status.progress.updated_at
    operator_status, _ = next_status(body["status"], None)
    assert contract.PROGRESS_FIELD not in status_patch(body["status"], operator_status)


def test_timestamps_are_rfc3339_utc_seconds() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    at = datetime(2025, 1, 2, 4, 5, 6, 789, tzinfo=timezone(timedelta(hours=1)))
    assert contract.timestamp(at) == "2025-01-02T03:05:06Z"
    assert datetime.strptime(contract.timestamp(), contract.TIMESTAMP_FORMAT).replace(tzinfo=UTC) <= datetime.now(UTC)
