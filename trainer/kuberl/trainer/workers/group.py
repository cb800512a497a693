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
from kuberl.trainer.plan.execution import ExecutionPlan
from kuberl.trainer.workers.dispatch import collect, mode_of, split


class WorkerGroup:
    """One Ray actor of ``cls`` per trainer rank (:attr:`ExecutionPlan.ranks`), rank ``r`` in bundle ``r`` of
    ``placement_group``, each receiving the spec and the plan as they are (Ray pickles them; nothing is parsed
    again in the worker)."""

    def __init__(
        self,
        cls: type,
        *,
        role: str,
        spec: RLJobSpec,
        plan: ExecutionPlan,
        placement_group: Any,
        env: dict[str, str] | None = None,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = plan.shares.of(role)
        remote: Any = ray.remote(cls)
        gpu = spec.cluster.device == "cuda"
        self.role = role
        self.cls = cls
        self.workers: list[Any] = [  # Ray actor handles
            remote.options(
                num_cpus=share,
                num_gpus=share if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=r),
                runtime_env={"env_vars": env or {}},
            ).remote(spec, plan, r)
            for r in range(plan.ranks)
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
