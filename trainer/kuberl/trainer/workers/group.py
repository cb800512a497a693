"""A worker group: one Ray actor per rank, SPMD inside the group, driven by the single controller.

Placement: one placement group for the trainer pool with one bundle per rank (``{"CPU": 1, "GPU": 1}``, or
``{"CPU": 1}`` with ``cluster.device: cpu``); the actor, critic and reward-model actors of rank ``r`` share bundle
``r`` with fractional shares and take turns, as verl's colocated roles do (so does a separate rollout engine when
it shares the trainer's GPUs, but it does not take turns: it keeps its memory share). Each group has its own
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA) whose rendezvous address rank 0 picks.
"""

from __future__ import annotations

from typing import Any

from kuberl.api.spec import RLJobSpec
from kuberl.trainer.plan.execution import ExecutionPlan, plan_execution
from kuberl.trainer.workers.dispatch import collect, mode_of, split

FRACTION = {"actor": 0.4, "critic": 0.25, "reward_model": 0.15, "rollout": 0.2}
"""Share of a rank's bundle each role's actor requests; Ray only needs them to fit in one bundle together."""


class WorkerGroup:
    """``world_size`` Ray actors of ``cls``, rank ``r`` in bundle ``r`` of ``placement_group``."""

    def __init__(
        self,
        cls: type,
        *,
        role: str,
        spec: RLJobSpec,
        placement_group: Any,
        world_size: int,
        threads: int,
        plan: ExecutionPlan | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``plan``: the driver's execution plan; without one, the plan of ``spec`` alone (a colocated rollout), for
        a group driven on its own."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plan = plan or plan_execution(spec)
        share = FRACTION[role]
        remote: Any = ray.remote(cls)
        gpu = spec.cluster.device == "cuda"
        spec_json = spec.model_dump_json()
        self.role = role
        self.cls = cls
        self.workers: list[Any] = [  # Ray actor handles
            remote.options(
                num_cpus=share,
                num_gpus=share if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=r),
                runtime_env={"env_vars": env or {}},
            ).remote(spec_json, r, world_size, threads, plan)
            for r in range(world_size)
        ]
        address, port = ray.get(self.workers[0].rendezvous.remote())
        ray.get([w.init_distributed.remote(address, port) for w in self.workers])

    def __len__(self) -> int:
        return len(self.workers)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call ``method`` on the ranks, split and collected as the method's dispatch mode says
        (:mod:`kuberl.trainer.workers.dispatch`); Ray's GetTimeoutError after ``timeout`` seconds."""
        mode = mode_of(self.cls, method)
        return collect(mode, self.each(method, split(mode, len(self.workers), args), timeout=timeout))

    def each(self, method: str, per_rank: list[tuple[Any, ...] | None], timeout: float | None = None) -> list[Any]:
        """Call ``method`` on rank ``r`` with ``per_rank[r]`` as arguments (not at all where it is None)."""
        import ray

        calls = [
            getattr(w, method).remote(*args) for w, args in zip(self.workers, per_rank, strict=True) if args is not None
        ]
        return ray.get(calls, timeout=timeout)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
