"""What one run starts on Ray and tears down again: Ray itself (embedded, or joined by address), the trainer ranks'
placement group, the worker groups (actor, critic, reward model), the separate rollout engines and the agent loop.

The execution plan is decided here, once Ray is up (the rollout layout depends on the cluster's GPUs and labels),
and every group receives it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kuberl.api import RLJobSpec
from kuberl.api.contract import ENV_RAY_AUTH_MODE, ENV_RAY_AUTH_TOKEN
from kuberl.trainer.data.prompts import Prompt
from kuberl.trainer.plan.execution import ExecutionPlan, plan_execution, trainer_gpu
from kuberl.trainer.plan.layout import RolloutLayout, rollout_pool_labelled
from kuberl.trainer.rollout.engine_group import EngineGroup

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.workers.group import WorkerGroup

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "H20": 148e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
"""Dense bf16 peak per GPU by device-name substring, for perf/mfu/actor; KUBERL_PEAK_FLOPS overrides."""


def parse_cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class Cluster:
    """The run's Ray processes: started by :meth:`start` in dependency order, stopped by :meth:`shutdown`."""

    def __init__(self, spec: RLJobSpec, *, ranks: int, address: str | None, write: Callable[[str], None]) -> None:
        self.spec = spec
        self.ranks = ranks
        self.address = address
        self.write = write
        self.ray_started_here = False
        self.groups: list[Any] = []
        """Every started worker group and the rollout engines, killed at shutdown."""
        self.pg: Any = None
        self.plan: ExecutionPlan
        """Decided in :meth:`start_workers`, once Ray is up (the rollout layout depends on the cluster)."""
        self.actor: WorkerGroup
        self.critic: WorkerGroup | None = None
        self.reward_model: WorkerGroup | None = None
        self.rollout: EngineGroup | None = None
        """The separate engines (an EngineGroup); None when each trainer rank holds a colocated engine."""
        self.agent: AgentLoop | None = None
        """The multi-turn loop (rollout.agent); None for single-turn rollouts."""
        self.pad_id: int
        self.params: tuple[int, int]
        """The policy's parameters, and of them the trained ones."""
        self.eos_ids: list[int]
        self.model_config: Any
        self.gpu_name: str | None = None

    def start(self, *, total_steps: int, tokenizer: Any, agent_prompts: list[Prompt]) -> None:
        """``agent_prompts``: the train and validation prompts the agent loop's tools may be asked about."""
        self.start_ray()
        self.start_workers(total_steps=total_steps, tokenizer=tokenizer, agent_prompts=agent_prompts)

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
                num_cpus=max(os.cpu_count() or 1, self.ranks),
                include_dashboard=False,
                log_to_driver=True,
            )
        self.ray_started_here = True

    def start_workers(self, *, total_steps: int, tokenizer: Any, agent_prompts: list[Prompt]) -> None:
        import ray
        from ray.util.placement_group import placement_group

        from kuberl.trainer.workers.actor import ActorWorker
        from kuberl.trainer.workers.critic import CriticWorker
        from kuberl.trainer.workers.group import WorkerGroup
        from kuberl.trainer.workers.reward_model import RewardModelWorker

        spec = self.spec
        pool = spec.cluster.trainer
        if spec.cluster.device == "cuda" and not self.address:
            from kuberl.trainer.plan.layout import PlacementError

            # a local Ray has all the GPUs it will ever have: fail now rather than wait for a placement
            gpus = ray.cluster_resources().get("GPU", 0.0)
            if gpus < self.ranks:
                raise PlacementError(
                    f"cluster.trainer asks for {self.ranks} GPU(s) and this machine has {int(gpus)}; "
                    "without GPUs use cluster.device cpu and rollout.engine hf"
                )
        gpu = trainer_gpu(spec, local=not self.address)
        self.plan = plan_execution(
            spec,
            cluster_gpus=ray.cluster_resources().get("GPU", 0.0),
            rollout_pool_labelled=rollout_pool_labelled(ray.nodes()),
            gpu=gpu,
        )
        budget = self.plan.actor_update.max_tokens
        if budget is not None and spec.batch.dynamic_batch_size.max_token_len_per_gpu is None:
            self.write(
                f"micro-batch token budget {budget}: "
                + (f"the largest the memory plan fits on {gpu.name}" if gpu else "the GPU is unknown, the default")
                + " (batch.dynamicBatchSize.maxTokenLenPerGPU left out)"
            )
        layout = self.plan.rollout
        bundle = {"CPU": 1.0, "GPU": 1.0} if spec.cluster.device == "cuda" else {"CPU": 1.0}
        selector = layout.trainer_label_selector
        self.pg = placement_group(
            [dict(bundle) for _ in range(self.ranks)],
            strategy="PACK",
            bundle_label_selector=[selector] * self.ranks if selector else None,
        )
        try:
            ray.get(self.pg.ready(), timeout=600)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the Ray cluster cannot place {self.ranks} trainer ranks of {bundle} within 10 minutes; "
                f"cluster resources: {ray.cluster_resources()}"
            ) from None
        if self.address:
            threads = max(1, int(parse_cpu(pool.cpu)) // pool.gpus_per_node)
        else:
            threads = max(1, (os.cpu_count() or 1) // self.ranks)
        common = {
            "spec": spec,
            "plan": self.plan,
            "placement_group": self.pg,
            "world_size": self.ranks,
            "threads": threads,
        }
        self.actor = WorkerGroup(ActorWorker, role="actor", **common)
        self.groups = [self.actor]
        info = self.actor.call("init_model", total_steps)[0]
        self.pad_id = info["pad_id"]
        self.eos_ids = info["eos_ids"]
        self.params = (info["params"], info["trainable_params"])
        self.agent = self.start_agent(tokenizer, agent_prompts)
        self.write(
            f"policy {spec.model.path}: {info['params'] / 1e6:.2f}M parameters, "
            f"{info['trainable_params'] / 1e6:.2f}M trained"
        )
        if layout.separate:
            self.start_rollout(layout, threads=threads)
        if self.plan.uses_critic:
            self.critic = WorkerGroup(CriticWorker, role="critic", **common)
            self.groups.append(self.critic)
            self.critic.call("init_model", total_steps)
        if spec.reward.model:
            self.reward_model = WorkerGroup(RewardModelWorker, role="reward_model", **common)
            self.groups.append(self.reward_model)
        self.model_config = self.load_model_config()

    def start_rollout(self, layout: RolloutLayout, *, threads: int) -> None:
        """Start the separate engines (vLLM with dummy weights; ``hf`` on CPU from the model's own), connect the
        trainer ranks to them and send the policy's weights once (version 0)."""
        import ray

        from kuberl.trainer.plan.layout import engine_actor_options
        from kuberl.trainer.workers.base import FRACTION

        options = [
            engine_actor_options(layout, i, trainer_placement_group=self.pg, share=FRACTION["rollout"])
            for i in range(layout.engines)
        ]
        engine = self.plan.engine
        if engine is None:  # hf on CPU (validation allows nothing else)
            from kuberl.trainer.rollout.hf import HFEngineActor

            r = self.spec.rollout
            rollout = EngineGroup.spawn(
                HFEngineActor,
                options,
                self.spec.model.path,
                pad_id=self.pad_id,
                eos_ids=self.eos_ids,
                seed=self.spec.data.seed,
                threads=threads,
                calculate_log_probs=r.calculate_log_probs,
                max_batch_size=r.max_num_seqs,
            )
            name = "hf"
        else:
            from kuberl.trainer.rollout.vllm import VLLMEngineActor

            rollout = EngineGroup.spawn(
                VLLMEngineActor,
                options,
                engine.model_path,
                pad_id=self.pad_id,
                eos_ids=self.eos_ids,
                weight_transfer=layout.transport,
                **engine.kwargs(),
            )
            name = "vLLM"
        self.rollout = rollout
        self.groups.append(rollout)
        group = None
        if layout.transport == "nccl":
            group = ray.get(self.actor.workers[0].broadcast_group.remote([layout.gpus_per_engine] * layout.engines))
        self.actor.call("connect_rollout", rollout.engines, layout.transport, group)
        self.actor.call("sync_weights", 0)
        devices = f"{layout.gpus_per_engine} GPU(s)" if layout.gpus_per_engine else "CPU"
        self.write(
            f"rollout: {layout.engines} separate {name} engine(s) of {devices}, {layout.kind} layout, "
            f"weights by {layout.transport}"
        )

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
