"""Where the rollout engines run, and how the trainer's weights reach them.

Four layouts, decided once at start-up from the spec and the Ray cluster the driver joined:

- **colocated** (``rollout.placement: colocated``): each trainer rank holds its own engine in its process and
  streams the gathered weights into it; the engine sleeps while the rank trains.

Three for ``rollout.placement: separate``:

- **pools** (the Ray cluster of the operator's RayJob): its worker groups carry the Ray node label
  ``kuberl.io/pool`` = ``trainer`` / ``rollout``; trainer ranks and engines select their own pool by it, and
  weights travel over NCCL from trainer rank 0.
- **disjoint** (no rollout pool label, e.g. ``kuberl run``, and GPUs for both): engines take GPUs the trainer does
  not hold; NCCL.
- **shared** (no rollout pool label, fewer GPUs than trainer + rollout ask for, e.g. one): engine ``i`` runs in its
  own process on trainer rank ``i``'s GPU (a fraction of rank ``i``'s placement-group bundle), each side within its
  memory share (``rollout.gpuMemoryUtilization`` for the engine). NCCL refuses two ranks on one GPU, so weights
  travel by CUDA IPC: every rank shares a handle to its gathered buffer, the engine on that GPU maps it.

CPU engines (``rollout.engine: hf`` with ``cluster.device: cpu``, CI's path of the separate placement) are
**pools** or **disjoint** processes without GPUs; weights travel through the Ray object store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from kuberl.api.batching import BatchPlan
from kuberl.api.contract import POOL_LABEL, ROLLOUT_POOL, TRAINER_POOL
from kuberl.api.engines import ENGINES, Transport
from kuberl.api.memory import GPU
from kuberl.api.spec import RLJobSpec


class PlacementError(ValueError):
    """The job's GPUs do not fit the Ray cluster it runs on."""


@dataclass(frozen=True)
class ClusterFacts:
    """What the plan needs to know of the Ray cluster the driver started or joined (read once, by the driver's
    :class:`~kuberl.trainer.driver.cluster.Cluster`)."""

    gpus: float = 0.0
    """The cluster's ``GPU`` resource in all."""
    rollout_pool_labelled: bool = False
    """Some alive node carries the rollout pool's label (:func:`rollout_pool_labelled`)."""
    joined: bool = False
    """The driver joined a cluster (``--address``, the RayJob) rather than starting one on this machine."""
    local_cpus: int = 1
    """This machine's CPUs (an embedded Ray's trainer ranks share them)."""
    gpu: GPU | None = None
    """The trainer's GPU when known (:func:`~kuberl.trainer.plan.execution.trainer_gpu`): its memory plan must fit."""


@dataclass(frozen=True)
class RolloutLayout:
    kind: Literal["colocated", "pools", "disjoint", "shared"]
    engines: int
    gpus_per_engine: int
    """rollout.tensorParallelSize; 0 for CPU engines."""
    transport: Transport | None
    """How a separate rollout receives weights; None when colocated (each rank loads its own engine)."""

    @property
    def separate(self) -> bool:
        """The engines run in their own Ray actors and the driver sends them the prompts."""
        return self.kind != "colocated"

    @property
    def trainer_label_selector(self) -> dict[str, str] | None:
        return {POOL_LABEL: TRAINER_POOL} if self.kind == "pools" else None

    @property
    def engine_label_selector(self) -> dict[str, str] | None:
        return {POOL_LABEL: ROLLOUT_POOL} if self.kind == "pools" else None


def plan_rollout_layout(spec: RLJobSpec, batch: BatchPlan, cluster: ClusterFacts) -> RolloutLayout:
    """The rollout's layout, from ``RLJobSpec.rollout_pool`` (placement), the Ray cluster, and the transports the
    engine takes (kuberl.api.engines)."""
    tp = spec.rollout.tensor_parallel_size
    rollout_gpus, trainer_gpus, engines = batch.rollout_gpus, batch.trainer_gpus, batch.rollout_engines
    if spec.rollout_pool is None:
        return RolloutLayout("colocated", engines, tp, None)
    if spec.cluster.device == "cpu":
        layout = RolloutLayout("pools" if cluster.rollout_pool_labelled else "disjoint", engines, 0, "object_store")
    elif cluster.rollout_pool_labelled:
        layout = RolloutLayout("pools", engines, tp, "nccl")
    elif cluster.gpus >= trainer_gpus + rollout_gpus:
        layout = RolloutLayout("disjoint", engines, tp, "nccl")
    elif tp == 1 and engines <= trainer_gpus:
        layout = RolloutLayout("shared", engines, tp, "ipc")
    else:
        raise PlacementError(
            f"cluster.rollout: {engines} engine(s) of rollout.tensorParallelSize {tp} need {rollout_gpus} GPU(s) "
            f"beside the trainer's {trainer_gpus}, and this Ray cluster has {math.floor(cluster.gpus)}; sharing the "
            "trainer's GPUs needs tensorParallelSize 1 and at most one engine per trainer GPU"
        )
    takes = ENGINES[spec.rollout.engine].transports
    if layout.transport not in takes:
        raise PlacementError(
            f"rollout.engine {spec.rollout.engine} takes weights by {', '.join(sorted(takes)) or 'no transport'}, but "
            f"its {layout.kind} layout on cluster.device {spec.cluster.device} sends them by {layout.transport}"
        )
    return layout


def rollout_pool_labelled(nodes: list[dict[str, Any]]) -> bool:
    """Whether any alive node of ``ray.nodes()`` belongs to the rollout pool."""
    return any(n.get("Alive") and (n.get("Labels") or {}).get(POOL_LABEL) == ROLLOUT_POOL for n in nodes)


def engine_actor_options(
    layout: RolloutLayout, index: int, *, trainer_placement_group: Any, share: float
) -> dict[str, Any]:
    """Ray actor options of engine ``index``: a fraction ``share`` of trainer bundle ``index`` when shared, whole
    GPUs otherwise (on the rollout pool when there is one)."""
    if layout.kind == "shared":
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": share,
            "num_gpus": share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                trainer_placement_group, placement_group_bundle_index=index
            ),
        }
    options: dict[str, Any] = {"num_cpus": 1, "num_gpus": layout.gpus_per_engine}
    if layout.engine_label_selector:
        options["label_selector"] = layout.engine_label_selector
    return options
