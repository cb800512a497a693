"""What one run starts on Ray and tears down again: Ray itself (embedded, or joined by address), the trainer ranks'
placement group, the worker groups (actor, critic, reward model), the separate rollout engines and the agent loop.

The order: :meth:`Cluster.start_ray`, then the driver reads :meth:`Cluster.facts` and builds the execution plan
from them (:func:`~kuberl.trainer.plan.execution.plan_execution`), then :meth:`Cluster.start_workers` starts what
the plan says, every group and engine receiving the plan.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kuberl.api import RLJobSpec, plan_batches
from kuberl.api.contract import ENV_RAY_AUTH_MODE, ENV_RAY_AUTH_TOKEN
from kuberl.trainer.data.prompts import Prompt
from kuberl.trainer.experience.metrics import perf_metrics
from kuberl.trainer.model.loading import model_family_flops_per_token
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.plan.execution import ExecutionPlan, trainer_gpu
from kuberl.trainer.plan.layout import ClusterFacts, PlacementError, rollout_pool_labelled
from kuberl.trainer.rollout.engine_pool import EnginePool
from kuberl.trainer.rollout.registry import EngineContext, engine

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.workers.group import WorkerGroup

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "H20": 148e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
"""Dense bf16 peak per GPU by device-name substring, for perf/mfu/actor; KUBERL_PEAK_FLOPS overrides."""


class Cluster:
    """The run's Ray processes: started by :meth:`start_ray` and :meth:`start_workers`, stopped by :meth:`shutdown`."""

    def __init__(self, spec: RLJobSpec, *, address: str | None, write: Callable[[str], None]) -> None:
        self.spec = spec
        self.address = address
        self.write = write
        self.ray_started_here = False
        self.groups: list[Any] = []
        """Every started worker group and the rollout engines, killed at shutdown."""
        self.pg: Any = None
        self.plan: ExecutionPlan
        """The driver's plan, handed to :meth:`start_workers`."""
        self.actor: WorkerGroup
        self.critic: WorkerGroup | None = None
        self.reward_model: WorkerGroup | None = None
        self.rollout: EnginePool | None = None
        """The separate engines; None when each trainer rank holds a colocated engine."""
        self.connected: list[Any] = []
        """The engine actors the trainer ranks' weight transfer is connected to."""
        self.agent: AgentLoop | None = None
        """The multi-turn loop (rollout.agent); None for single-turn rollouts."""
        self.pad_id: int
        self.params: tuple[int, int]
        """The policy's parameters, and of them the trained ones."""
        self.eos_ids: list[int]
        self.flops_per_token: float
        """The policy's training FLOPs per token, for perf/mfu/actor."""
        self.gpu_name: str | None = None

    def start_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            # the RLJob's Ray cluster requires its token (KubeRay's authOptions set both variables from the Secret
            # it creates per Ray cluster); ray.init reads RAY_AUTH_TOKEN itself
            if os.environ.get(ENV_RAY_AUTH_MODE) == "token" and not os.environ.get(ENV_RAY_AUTH_TOKEN):
                raise SystemExit(
                    f"{ENV_RAY_AUTH_MODE}=token but {ENV_RAY_AUTH_TOKEN} is empty: KubeRay's token Secret of this "
                    "Ray cluster is missing or has no auth_token"
                )
            ray.init(address=self.address, log_to_driver=True)
        else:
            ray.init(
                address="local",
                _node_ip_address="127.0.0.1",
                num_cpus=max(os.cpu_count() or 1, plan_batches(self.spec).trainer_gpus),
                include_dashboard=False,
                log_to_driver=True,
            )
        self.ray_started_here = True

    def facts(self) -> ClusterFacts:
        """What the plan needs of the Ray cluster. A local Ray has all the GPUs it will ever have: too few for the
        trainer fail here rather than wait for a placement."""
        import ray

        gpus = ray.cluster_resources().get("GPU", 0.0)
        ranks = plan_batches(self.spec).trainer_gpus
        if self.spec.cluster.device == "cuda" and not self.address and gpus < ranks:
            raise PlacementError(
                f"cluster.trainer asks for {ranks} GPU(s) and this machine has {int(gpus)}; "
                "without GPUs use cluster.device cpu and rollout.engine hf"
            )
        return ClusterFacts(
            gpus=gpus,
            rollout_pool_labelled=rollout_pool_labelled(ray.nodes()),
            joined=bool(self.address),
            local_cpus=os.cpu_count() or 1,
            gpu=trainer_gpu(self.spec, local=not self.address),
        )

    def start_workers(
        self, plan: ExecutionPlan, *, total_steps: int, tokenizer: Any, agent_prompts: list[Prompt]
    ) -> None:
        """``agent_prompts``: the train and validation prompts the agent loop's tools may be asked about."""
        import ray
        from ray.util.placement_group import placement_group

        from kuberl.trainer.workers.actor import ActorWorker
        from kuberl.trainer.workers.critic import CriticWorker
        from kuberl.trainer.workers.group import WorkerGroup
        from kuberl.trainer.workers.reward_model import RewardModelWorker

        spec, self.plan = self.spec, plan
        selector = plan.rollout.trainer_label_selector
        self.pg = placement_group(
            [dict(plan.rank_bundle) for _ in range(plan.ranks)],
            strategy="PACK",
            bundle_label_selector=[selector] * plan.ranks if selector else None,
        )
        try:
            ray.get(self.pg.ready(), timeout=600)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the Ray cluster cannot place {plan.ranks} trainer ranks of {plan.rank_bundle} within 10 minutes; "
                f"cluster resources: {ray.cluster_resources()}"
            ) from None
        self.actor = WorkerGroup(ActorWorker, role="actor", spec=spec, plan=plan, placement_group=self.pg)
        self.groups = [self.actor]
        info = self.actor.call("init_model", total_steps, engine(plan.engine.name))[0]
        self.pad_id = info["pad_id"]
        self.eos_ids = info["eos_ids"]
        self.params = (info["params"], info["trainable_params"])
        self.agent = self.start_agent(tokenizer, agent_prompts)
        self.write(
            f"policy {spec.model.path}: {info['params'] / 1e6:.2f}M parameters, "
            f"{info['trainable_params'] / 1e6:.2f}M trained"
        )
        if plan.rollout.separate:
            self.start_rollout()
        if plan.uses_critic:
            self.critic = WorkerGroup(CriticWorker, role="critic", spec=spec, plan=plan, placement_group=self.pg)
            self.groups.append(self.critic)
            self.critic.call("init_model", total_steps)
        if spec.reward.model:
            self.reward_model = WorkerGroup(
                RewardModelWorker, role="reward_model", spec=spec, plan=plan, placement_group=self.pg
            )
            self.groups.append(self.reward_model)
        self.flops_per_token = model_family_flops_per_token(self.load_model_config())

    def start_rollout(self) -> None:
        """Start the separate engines (vLLM with dummy weights; ``hf`` on CPU from the model's own) as a pool that
        follows the rollout nodes, connect the trainer ranks to them and send the policy's weights (version 0)."""
        import torch

        plan, layout = self.plan, self.plan.rollout
        assert layout.transport is not None, "a separate layout names its transport"
        pool = self.spec.rollout_pool
        assert pool is not None, "a separate layout has a rollout pool"
        device = torch.device("cuda" if layout.gpus_per_engine else "cpu")
        context = EngineContext(pad_id=self.pad_id, eos_ids=self.eos_ids, device=device, threads=plan.threads)
        self.rollout = EnginePool(
            engine(plan.engine.name).make_separate(plan.engine, context, layout.transport),
            layout,
            model_path=plan.engine.model_path,
            pad_id=self.pad_id,
            seed=plan.engine.seed,
            engines_per_node=max(layout.engines // pool.nodes, 1),
            trainer_placement_group=self.pg,
            share=plan.shares.rollout,
            empty_timeout=self.spec.run_policy.empty_rollout_pool_timeout_seconds,
            send=self.send_weights,
            write=self.write,
        )
        self.groups.append(self.rollout)
        self.rollout.start()
        self.rollout.update(0)
        devices = f"{layout.gpus_per_engine} GPU(s)" if layout.gpus_per_engine else "CPU"
        self.write(
            f"rollout: {self.rollout.size} separate {engine(plan.engine.name).title} engine(s) of {devices}, "
            f"{layout.kind} layout, weights by {layout.transport}"
        )

    def send_weights(self, engines: list[Any], version: int) -> list[int]:
        """The trainer ranks send weights ``version`` to ``engines``, reconnecting their weight transfer first when
        the engines changed; the indices of engines found dead."""
        import ray

        layout = self.plan.rollout
        if engines != self.connected:
            group = None
            if layout.transport == "nccl":
                sizes = [layout.gpus_per_engine] * len(engines)
                group = ray.get(self.actor.workers[0].broadcast_group.remote(sizes))
            self.actor.call("connect_rollout", engines, layout.transport, group)
            self.connected = list(engines)
        lost: list[int] = self.actor.call("sync_weights", version)[0]
        return lost

    def sync_weights(self, version: int) -> None:
        """The updated weights, version ``version``, into the rollout engines (the separate pool's, joined engines
        included, or every rank's own)."""
        if self.rollout is not None:
            self.rollout.update(version)
        else:
            self.actor.call("sync_weights", version)

    def start_agent(self, tokenizer: Any, prompts: list[Prompt]) -> AgentLoop | None:
        """The multi-turn loop with its tool workers (rollout.agent), or None for single-turn rollouts."""
        agent = self.spec.rollout.agent
        if agent is None:
            return None
        from kuberl.trainer.rollout.agent import AgentLoop

        loop = AgentLoop(
            agent,
            tokenizer,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            max_response_length=self.spec.data.max_response_length,
        )
        loop.register_prompts(
            [
                (p.input_ids, {**p.extra_info, "data_source": p.data_source, "ground_truth": p.ground_truth})
                for p in prompts
            ]
        )
        return loop

    def checkpointed_roles(self) -> list[tuple[str, WorkerGroup]]:
        """The worker groups whose state a checkpoint holds, by folder name."""
        return [("actor", self.actor)] + ([("critic", self.critic)] if self.critic is not None else [])

    def load_model_config(self) -> Any:
        """The policy's transformers config, for its FLOPs per token."""
        from kuberl.trainer.model.loading import TINY_SCHEME, parse_tiny, resolve, tiny_config

        source = resolve(self.spec.model.path)
        if source.startswith(TINY_SCHEME):
            return tiny_config(parse_tiny(source))
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(source)

    def perf_metrics(self, tokens: float, timer: Timer) -> dict[str, float]:
        """A step's throughput, the actor update's MFU and the devices' memory and utilisation."""
        return perf_metrics(
            tokens,
            timer,
            ranks=self.plan.ranks,
            flops_per_token=self.flops_per_token,
            ppo_epochs=self.spec.batch.ppo_epochs,
            peak_flops=self.peak_flops(),
            device_stats=self.device_stats(),
        )

    def device_stats(self) -> list[dict[str, float]] | None:
        return self.actor.call("device_stats") if self.spec.cluster.device == "cuda" else None

    def peak_flops(self) -> float | None:
        """Peak FLOP/s of one device, or None when unknown (CPU without KUBERL_PEAK_FLOPS): no MFU then."""
        if os.environ.get("KUBERL_PEAK_FLOPS"):
            return float(os.environ["KUBERL_PEAK_FLOPS"])
        if self.spec.cluster.device != "cuda":
            return None
        if self.gpu_name is None:
            self.gpu_name = self.actor.call("device_name")[0]
        return next((v for k, v in PEAK_FLOPS.items() if k in self.gpu_name), None)

    def shutdown(self, *, pod_stopping: bool) -> None:
        """``pod_stopping``: SIGTERM arrived, the pod's Ray processes got it too; leave them be."""
        import ray

        if self.agent is not None:
            self.agent.close()
        if pod_stopping:
            return
        for group in self.groups:
            with contextlib.suppress(Exception):
                group.kill()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.pg)
        if self.ray_started_here:
            ray.shutdown()
