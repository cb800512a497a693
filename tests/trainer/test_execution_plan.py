"""The execution plan is built once, on the driver, and crosses Ray as the typed object it is: every worker reads the
driver's decisions instead of deriving them from the spec again (docs/architecture.md lists them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kuberl.api import RLJobSpec, parse_spec
from kuberl.trainer.plan.execution import ExecutionPlan, MicroBatching, parse_cpu, plan_execution
from kuberl.trainer.plan.layout import ClusterFacts
from tests.api.cases import BASE

TRAINER = Path(__file__).resolve().parents[2] / "trainer" / "kuberl" / "trainer"

PLANNERS = {"plan_execution", "plan_batches", "plan_rollout_layout"}
"""The builders of derived values (kuberl.api.batching, kuberl.trainer.plan)."""

MAY_PLAN = {"plan/execution.py", "driver/trainer.py", "driver/cluster.py", "commands.py"}
"""Where they are called: the plan itself, the driver, which builds it (and counts its ranks before Ray is up), and
``kuberl plan``, which lays out a job offline for a cluster of ``--gpus`` GPUs."""


def gpu_spec(**batch: object) -> RLJobSpec:
    spec = dict(BASE["spec"])
    spec["batch"] = {**spec["batch"], **batch}
    return parse_spec(spec)


def test_the_plan_holds_each_roles_micro_batching_threads_and_shares() -> None:
    spec = gpu_spec(ppoMicroBatchSizePerGPU=4, logProbMicroBatchSizePerGPU=16)
    plan = plan_execution(spec, ClusterFacts(gpus=8, joined=True))
    assert plan.ranks == plan.batch.trainer_gpus == 8
    assert plan.actor_update == MicroBatching(4, None)
    assert plan.log_prob == MicroBatching(16, None)
    assert plan.rank_bundle == {"CPU": 1.0, "GPU": 1.0}
    assert plan.threads == max(1, int(parse_cpu(spec.cluster.trainer.cpu)) // 8)
    assert sum(plan.shares.of(role) for role in ("actor", "critic", "reward_model", "rollout")) <= 1.0
    assert (plan.engine.name, plan.rollout.kind) == ("vllm", "colocated")
    # four optimizer steps a step: the old log-probs come from a pass of their own, before the update
    assert plan.actor_update_fields == ("advantages", "old_log_probs")
    assert not plan.old_log_probs_from_update
    one_step = plan_execution(gpu_spec(ppoMiniBatchSize=64), ClusterFacts(gpus=8))
    assert one_step.old_log_probs_from_update and one_step.actor_update_fields == ("advantages",)


def test_a_local_ray_shares_the_machines_cpus_over_the_ranks() -> None:
    assert plan_execution(gpu_spec(), ClusterFacts(gpus=8, local_cpus=64)).threads == 8


@pytest.mark.timeout(120)
def test_workers_receive_the_drivers_spec_and_plan_as_typed_objects(local_ray) -> None:
    import ray

    spec = gpu_spec()
    plan = plan_execution(spec, ClusterFacts(gpus=8, joined=True))

    @ray.remote
    def receive(spec: RLJobSpec, plan: ExecutionPlan) -> tuple[RLJobSpec, ExecutionPlan, str]:
        return spec, plan, type(spec).__name__ + "/" + type(plan).__name__

    received_spec, received_plan, types = ray.get(receive.remote(spec, plan))
    assert types == "RLJobSpec/ExecutionPlan"  # objects in the worker, not JSON to parse again
    assert received_spec == spec and received_plan == plan


def calls_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
    }


def test_derived_values_are_planned_only_on_the_driver() -> None:
    planning = {str(path.relative_to(TRAINER)) for path in TRAINER.rglob("*.py") if calls_in(path) & PLANNERS}
    assert planning <= MAY_PLAN, f"re-derived outside the plan: {sorted(planning - MAY_PLAN)}"
