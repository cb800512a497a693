"""The single controller: one driver runs the RL loop and drives SPMD worker groups on Ray.

``kuberl run rljob.yaml`` starts an embedded local Ray (or joins ``--address``); on Kubernetes the RayJob runs
``python -m kuberl.trainer.run --spec-file /etc/kuberl/spec.json --name NAME --namespace NS`` and joins the
cluster it runs in (``ray.init(address="auto")``).

One step, top to bottom (:meth:`Trainer.train_step`): rollout → reward (:func:`kuberl.trainer.collect.collect_batch`:
overlong shaping, dynamic sampling, ReMax baselines) → old log-probs → reference log-probs →
values → advantages (on the driver) → critic update → actor update → weight sync. Validation, checkpoints and
metrics wrap it in :meth:`Trainer.fit`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from kuberl.api import RLJobSpec, parse_spec, plan_batches
from kuberl.api.contract import (
    ENV_RAY_AUTH_MODE,
    ENV_RAY_AUTH_TOKEN,
    ENV_RLJOB_NAMESPACE,
    ENV_RLJOB_UID,
    EXIT_INTERRUPTED,
    EXIT_PERMANENT,
    EXIT_STOPPED,
    TRAINER_MODULE,
)
from kuberl.api.status import FailureClass, Progress
from kuberl.trainer import checkpoint as ckpt
from kuberl.trainer.advantages import compute_advantages
from kuberl.trainer.collect import collect_batch, place_at_last_token
from kuberl.trainer.data import Prompt, PromptDataset, PromptLoader, load_rows
from kuberl.trainer.failures import classify
from kuberl.trainer.kl import apply_kl_in_reward, make_kl_controller
from kuberl.trainer.metrics import MetricsLogger, Timer
from kuberl.trainer.microbatch import Rows, concat, shard_mini_batches, shard_rows, slice_rows
from kuberl.trainer.plan import ExecutionPlan, plan_execution
from kuberl.trainer.rewards import RewardInput, load_reward_function, score_batch
from kuberl.trainer.rollout import Rollout
from kuberl.trainer.rollout.layout import RolloutLayout, rollout_pool_labelled
from kuberl.trainer.status_reporter import StatusReporter
from kuberl.trainer.step_metrics import data_metrics, perf_metrics, reduce_update_metrics

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop

log = logging.getLogger("kuberl.trainer")

STOP_SIGNALS = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_STOPPED}
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "H20": 148e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
"""Dense bf16 peak per GPU by device-name substring, for perf/mfu/actor; KUBERL_PEAK_FLOPS overrides."""


def parse_cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class Trainer:
    def __init__(
        self,
        name: str,
        spec: RLJobSpec,
        *,
        run_dir: Path,
        namespace: str = "default",
        address: str | None = None,
        steps: int | None = None,
        show_progress: bool = True,
    ) -> None:
        self.name = name
        self.spec = spec
        self.run_dir = run_dir
        self.namespace = namespace
        self.address = address
        self.steps_override = steps
        self.show_progress = show_progress
        self.batch_plan = plan_batches(spec)
        self.dp = self.batch_plan.trainer_gpus
        algo = spec.algorithm
        self.kl_ctrl = make_kl_controller(algo.kl.control, algo.kl.coef, algo.kl.target, algo.kl.horizon)
        self.global_step = 0
        self.stop_requested = False
        self.stop_code = 0
        """EXIT_INTERRUPTED or EXIT_STOPPED once a stop signal arrived."""
        self.last_checkpoint: str | None = None
        self.ray_started_here = False
        self.groups: list[Any] = []
        self.plan: ExecutionPlan
        """Decided in :meth:`start_workers`, once Ray is up (the rollout layout depends on the cluster)."""
        self.rollout: Rollout | None = None
        self.agent: AgentLoop | None = None
        """The multi-turn loop (rollout.agent); None for single-turn rollouts."""
        """The separate engines (VLLMEngineGroup); None when each trainer rank holds a colocated engine."""

    # --- setup -------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        from kuberl.trainer.models import load_tokenizer, model_family_flops_per_token

        spec = self.spec
        torch.manual_seed(spec.data.seed)
        np.random.seed(spec.data.seed)
        self.tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path)
        dataset = PromptDataset(
            load_rows(spec.data.train_files, prompt_key=spec.data.prompt_key),
            self.tokenizer,
            prompt_key=spec.data.prompt_key,
            max_prompt_length=spec.data.max_prompt_length,
            filter_overlong=spec.data.filter_overlong_prompts,
        )
        self.loader = PromptLoader(dataset, spec.batch.train_batch_size, seed=spec.data.seed, shuffle=spec.data.shuffle)
        self.val_prompts: list[Prompt] = []
        if spec.data.val_files:
            self.val_prompts = PromptDataset(
                load_rows(spec.data.val_files, prompt_key=spec.data.prompt_key),
                self.tokenizer,
                prompt_key=spec.data.prompt_key,
                max_prompt_length=spec.data.max_prompt_length,
                filter_overlong=True,
            ).prompts
        self.total_steps = (
            self.steps_override or spec.trainer.total_steps or spec.trainer.total_epochs * len(self.loader)
        )
        p = self.batch_plan
        self.write(
            f"RLJob {self.name}: {p.trainer_gpus} {spec.cluster.device} trainer rank(s), "
            f"{p.responses_per_step} responses/step, {p.optimizer_steps_per_step} optimizer step(s)/step, "
            f"micro-batch {p.micro_batch_size_per_gpu or 'by token budget'}"
            f"{f' × {p.gradient_accumulation_steps} accumulated' if p.gradient_accumulation_steps else ''}; "
            f"{self.total_steps} steps, {len(self.loader)} per epoch; {len(dataset)} prompts "
            f"({dataset.num_filtered} overlong filtered), {len(self.val_prompts)} validation prompts"
        )
        self.reward_fn = None if spec.reward.model else load_reward_function(spec.reward.function)
        self.rm_tokenizer = load_tokenizer(spec.reward.model.path) if spec.reward.model else None
        self.start_ray()
        self.start_workers()
        self.flops_per_token = model_family_flops_per_token(self.model_config)
        self.metrics = MetricsLogger(
            self.run_dir,
            loggers=spec.trainer.loggers,
            rljob=self.name,
            namespace=self.namespace,
            metrics_port=spec.trainer.metrics_port,
            total_steps=self.total_steps,
            write=self.write,
            # no environment value reaches a logger's config (wandb, tensorboard): they may hold credentials
            config=spec.model_dump(mode="json", by_alias=True, exclude={"cluster": {"env"}}),
        )
        self.reporter = StatusReporter.from_env(self.name, self.namespace)
        self.resume()

    def write(self, line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)

    def start_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            # the RLJob's Ray cluster requires its token (RAY_AUTH_MODE=token); ray.init reads RAY_AUTH_TOKEN itself
            if os.environ.get(ENV_RAY_AUTH_MODE) == "token" and not os.environ.get(ENV_RAY_AUTH_TOKEN):
                raise SystemExit(
                    f"{ENV_RAY_AUTH_MODE}=token but {ENV_RAY_AUTH_TOKEN} is empty: the token Secret is missing"
                )
            ray.init(address=self.address, log_to_driver=True)
        else:
            ray.init(
                address="local",
                _node_ip_address="127.0.0.1",
                num_cpus=max(os.cpu_count() or 1, self.dp),
                include_dashboard=False,
                log_to_driver=True,
            )
        self.ray_started_here = True

    def start_workers(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        from kuberl.trainer.workers import ActorWorker, CriticWorker, RewardModelWorker, WorkerGroup

        spec = self.spec
        pool = spec.cluster.trainer
        if spec.cluster.device == "cuda" and not self.address:
            from kuberl.trainer.rollout.layout import PlacementError

            # a local Ray has all the GPUs it will ever have: fail now rather than wait for a placement
            gpus = ray.cluster_resources().get("GPU", 0.0)
            if gpus < self.dp:
                raise PlacementError(
                    f"cluster.trainer asks for {self.dp} GPU(s) and this machine has {int(gpus)}; "
                    "without GPUs use cluster.device cpu and rollout.engine hf"
                )
        self.plan = plan_execution(
            spec,
            cluster_gpus=ray.cluster_resources().get("GPU", 0.0),
            rollout_pool_labelled=rollout_pool_labelled(ray.nodes()),
        )
        layout = self.plan.rollout
        bundle = {"CPU": 1.0, "GPU": 1.0} if spec.cluster.device == "cuda" else {"CPU": 1.0}
        selector = layout.trainer_label_selector
        self.pg = placement_group(
            [dict(bundle) for _ in range(self.dp)],
            strategy="PACK",
            bundle_label_selector=[selector] * self.dp if selector else None,
        )
        try:
            ray.get(self.pg.ready(), timeout=600)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the Ray cluster cannot place {self.dp} trainer ranks of {bundle} within 10 minutes; "
                f"cluster resources: {ray.cluster_resources()}"
            ) from None
        if self.address:
            threads = max(1, int(parse_cpu(pool.cpu)) // pool.gpus_per_node)
        else:
            threads = max(1, (os.cpu_count() or 1) // self.dp)
        common = {
            "spec": spec,
            "plan": self.plan,
            "placement_group": self.pg,
            "world_size": self.dp,
            "threads": threads,
        }
        self.actor = WorkerGroup(ActorWorker, role="actor", **common)
        self.groups = [self.actor]
        info = self.actor.all("init_model", self.total_steps)[0]
        self.pad_id = info["pad_id"]
        self.eos_ids = info["eos_ids"]
        self.agent = self.start_agent()
        self.write(
            f"policy {spec.model.path}: {info['params'] / 1e6:.2f}M parameters, "
            f"{info['trainable_params'] / 1e6:.2f}M trained"
        )
        if layout.separate:
            self.start_rollout(layout)
        self.critic = None
        if self.plan.uses_critic:
            self.critic = WorkerGroup(CriticWorker, role="critic", **common)
            self.groups.append(self.critic)
            self.critic.all("init_model", self.total_steps)
        self.reward_model = None
        if spec.reward.model:
            self.reward_model = WorkerGroup(RewardModelWorker, role="reward_model", **common)
            self.groups.append(self.reward_model)
        self.model_config = self._model_config()

    def start_rollout(self, layout: RolloutLayout) -> None:
        """Start the separate engines (with dummy weights), connect the trainer ranks to them and send the
        policy's weights once."""
        from kuberl.trainer.rollout.layout import engine_actor_options
        from kuberl.trainer.rollout.vllm import VLLMEngineGroup
        from kuberl.trainer.workers import FRACTION

        engine = self.plan.engine
        assert engine is not None, "a separate rollout is a vLLM rollout (validation enforces it)"
        options = [
            engine_actor_options(layout, i, trainer_placement_group=self.pg, share=FRACTION["rollout"])
            for i in range(layout.engines)
        ]
        self.rollout = VLLMEngineGroup.spawn(
            options,
            engine.model_path,
            pad_id=self.pad_id,
            eos_ids=self.eos_ids,
            weight_transfer=layout.transport,
            **engine.kwargs(),
        )
        self.groups.append(self.rollout)
        group = None
        if layout.transport == "nccl":
            import ray

            group = ray.get(self.actor.workers[0].broadcast_group.remote([layout.gpus_per_engine] * layout.engines))
        self.actor.all("connect_rollout", self.rollout.engines, layout.transport, group)
        self.actor.all("sync_weights")
        self.write(
            f"rollout: {layout.engines} separate vLLM engine(s) of {layout.gpus_per_engine} GPU(s), "
            f"{layout.kind} layout, weights by {layout.transport}"
        )

    def start_agent(self) -> AgentLoop | None:
        """The multi-turn loop with its tool workers (rollout.agent), or None for single-turn rollouts."""
        agent = self.spec.rollout.agent
        if agent is None:
            return None
        from kuberl.trainer.rollout.agent import AgentLoop

        loop = AgentLoop(
            agent,
            self.tokenizer,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            max_response_length=self.spec.data.max_response_length,
        )
        prompts = [*self.loader.dataset.prompts, *self.val_prompts]
        loop.register_prompts(
            [
                (p.input_ids, {**p.extra_info, "data_source": p.data_source, "ground_truth": p.ground_truth})
                for p in prompts
            ]
        )
        return loop

    def _model_config(self) -> Any:
        from kuberl.trainer.models import TINY_SCHEME, parse_tiny, resolve, tiny_config

        source = resolve(self.spec.model.path)
        if source.startswith(TINY_SCHEME):
            return tiny_config(parse_tiny(source))
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(source)

    # --- resume / checkpoint ---------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.spec.trainer.checkpoint_dir)

    @property
    def checkpoint_identity(self) -> ckpt.Identity:
        """What this run's checkpoints record and what auto-resume requires: the RLJob uid (the operator sets it) and
        the hash of model/data/algorithm/batch."""
        return ckpt.Identity(os.environ.get(ENV_RLJOB_UID) or None, ckpt.resume_fields_hash(self.spec))

    def resume(self) -> None:
        damaged: list[ckpt.Damaged] = []
        folder = ckpt.resolve_resume(self.spec.trainer.resume, self.checkpoint_dir, self.checkpoint_identity, damaged)
        for skipped in damaged:
            message = f"checkpoint {skipped.folder} is damaged and was skipped: {skipped.reason}"
            self.write(f"warning: {message}")
            if self.reporter is not None:
                self.reporter.event("CheckpointDamaged", message)
        if folder is None:
            return
        state = ckpt.read_state(folder)
        self.actor.all("load_checkpoint", str(folder / "actor"))
        if self.critic is not None:
            self.critic.all("load_checkpoint", str(folder / "critic"))
        self.loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.load_state_dict(state["kl_controller"])
        self.global_step = int(state["step"])
        self.last_checkpoint = str(folder)
        ckpt.restore_driver_rng(folder)
        self.write(f"resumed from {folder} at step {self.global_step}")

    def save_checkpoint(self) -> str:
        folder = ckpt.prepare(self.checkpoint_dir, self.global_step)
        self.actor.all("save_checkpoint", str(folder / "actor"))
        if self.critic is not None:
            self.critic.all("save_checkpoint", str(folder / "critic"))
        ckpt.write_state(
            folder,
            {
                "step": self.global_step,
                "epoch": self.loader.epoch,
                "rljob": self.name,
                "dataloader": self.loader.state_dict(),
                "kl_controller": self.kl_ctrl.state_dict(),
                "total_steps": self.total_steps,
                "trainer_ranks": self.dp,
            },
            self.checkpoint_identity,
        )
        ckpt.mark_latest(self.checkpoint_dir, folder)
        ckpt.rotate(self.checkpoint_dir, self.spec.trainer.max_checkpoints)
        self.last_checkpoint = str(folder)
        return str(folder)

    # --- the loop --------------------------------------------------------------------------------------------

    def fit(self) -> int:
        from tqdm import tqdm

        spec = self.spec.trainer
        previous = {signum: signal.signal(signum, self._on_stop_signal) for signum in STOP_SIGNALS}
        bar = tqdm(
            total=self.total_steps,
            initial=self.global_step,
            desc=self.name,
            unit="step",
            disable=not self.show_progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        try:
            if spec.val_before_train and self.val_prompts and self.global_step == 0:
                val = self.validate()
                self.metrics.log(0, val)
            saved_at = -1
            while self.global_step < self.total_steps and not self.stop_requested:
                for prompts in self.loader:
                    epoch = self.loader.epoch
                    metrics = self.train_step(prompts)
                    self.global_step += 1
                    last = self.global_step >= self.total_steps
                    timer = Timer()
                    if spec.test_freq > 0 and self.val_prompts and (self.global_step % spec.test_freq == 0 or last):
                        with timer("testing"):
                            metrics.update(self.validate())
                    if (spec.save_freq > 0 and self.global_step % spec.save_freq == 0) or last or self.stop_requested:
                        with timer("save_checkpoint"):
                            self.save_checkpoint()
                        saved_at = self.global_step
                    metrics.update(timer.metrics())
                    metrics["training/global_step"] = self.global_step
                    metrics["training/epoch"] = epoch
                    self.metrics.log(self.global_step, metrics)
                    self.report(metrics, force=last)
                    bar.update(1)
                    if last or self.stop_requested:
                        break
            if self.stop_requested:
                if saved_at != self.global_step:
                    self.save_checkpoint()
                self.write(f"interrupted: checkpoint saved at step {self.global_step} in {self.last_checkpoint}")
                return self.stop_code
            return 0
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        """SIGINT (Ctrl-C) and SIGTERM (how Kubernetes and Ray stop a pod): finish the step, save, exit 128+signal.
        The pod's terminationGracePeriodSeconds must cover the rest of the step plus a save."""
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        self.stop_code = STOP_SIGNALS[signal.Signals(signum)]
        self.write(
            f"{signal.Signals(signum).name}: finishing this step, saving a checkpoint and exiting "
            "(a second signal aborts)"
        )

    def report(self, metrics: dict[str, float], force: bool) -> None:
        if self.reporter is None:
            return
        step_time = metrics.get("perf/time_per_step") or 0.0
        self.reporter.report(
            Progress(
                step=self.global_step,
                total_steps=self.total_steps,
                epoch=int(metrics.get("training/epoch", 0)),
                reward_mean=metrics.get("critic/score/mean"),
                last_checkpoint=self.last_checkpoint,
                tokens_per_second=metrics["perf/total_num_tokens"] / step_time if step_time else None,
            ),
            force=force,
        )

    # --- one step --------------------------------------------------------------------------------------------

    def train_step(self, prompts: list[Prompt]) -> dict[str, float]:
        spec, algo = self.spec, self.spec.algorithm
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer("step"):
            batch = collect_batch(self, prompts, timer)
            rows, scores, group_ids = batch.rows, batch.scores, batch.group_ids
            metrics.update(batch.metrics)
            if self.agent is not None:
                metrics.update(self.agent.metrics())
            token_scores = place_at_last_token(scores, rows["response_mask"])
            fused = self.plan.old_log_probs_from_update
            if not fused:
                with timer("old_log_prob"):
                    out = self.forward_all(self.actor, "compute_log_probs", rows)
                    rows["old_log_probs"] = out["log_probs"]
            if self.plan.uses_reference:
                with timer("ref"):
                    rows["ref_log_probs"] = self.forward_all(self.actor, "compute_ref_log_probs", rows)["ref_log_probs"]
            if self.critic is not None:
                with timer("values"):
                    rows["values"] = self.forward_all(self.critic, "compute_values", rows)["values"]
            with timer("adv"):
                mask = rows["response_mask"].float()
                token_rewards = token_scores
                if algo.kl.in_reward:
                    token_rewards, mean_kl = apply_kl_in_reward(
                        token_scores,
                        rows["old_log_probs"],
                        rows["ref_log_probs"],
                        mask,
                        coef=self.kl_ctrl.value,
                        kind=algo.kl.type,
                    )
                    metrics["actor/reward_kl_penalty"] = mean_kl
                    metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
                    self.kl_ctrl.update(mean_kl, len(batch.samples))
                advantages, returns = compute_advantages(
                    algo.advantage_estimator,
                    token_rewards,
                    mask,
                    values=rows.get("values"),
                    group_ids=group_ids,
                    gamma=algo.gamma,
                    lam=algo.lam,
                    norm_adv_by_std=algo.norm_adv_by_std,
                    reward_baselines=batch.reward_baselines,
                )
                rows["advantages"], rows["returns"] = advantages, returns
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.update(self.critic, rows, ("values", "returns"), "critic"))
            with timer("update_actor"):
                keys = ("advantages",) + (() if fused else ("old_log_probs",))
                keys += ("ref_log_probs",) if algo.kl.loss.enabled else ()
                metrics.update(self.update(self.actor, rows, keys, "actor"))
                if fused:  # the old log-probs and entropy of the update's own forward, rows in rank order
                    parts = self.actor.all("update_outputs")
                    out = {k: torch.cat([r[k] for r in parts]) for k in ("log_probs", "entropy")}
                    rows["old_log_probs"] = out["log_probs"]
            with timer("update_weights"):
                self.actor.all("sync_weights")
        metrics.update(timer.metrics())
        metrics.update(
            data_metrics(
                rows,
                scores,
                token_rewards,
                out.get("entropy"),
                batch.extra_metrics(),
                max_response_length=spec.data.max_response_length,
                kl_coef=self.kl_coef(),
            )
        )
        metrics.update(
            perf_metrics(
                rows,
                timer,
                ranks=self.dp,
                flops_per_token=self.flops_per_token,
                ppo_epochs=spec.batch.ppo_epochs,
                peak_flops=self.peak_flops(),
                device_stats=self.device_stats(),
            )
        )
        return metrics

    def train_sampling(self) -> dict[str, Any]:
        r = self.spec.rollout
        return {
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "max_new_tokens": self.spec.data.max_response_length,
        }

    def val_sampling(self) -> dict[str, Any]:
        r = self.spec.rollout
        sample = r.val.do_sample
        return {
            "temperature": r.val.temperature if sample else 0.0,
            "top_p": r.val.top_p if sample else 1.0,
            "top_k": r.top_k,
            "max_new_tokens": self.spec.data.max_response_length,
        }

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> Rows:
        """Single-turn, or the agent loop over single turns (rollout.agent)."""
        if self.agent is None:
            return self.generate_turn(prompts, n, sampling)
        return self.agent.generate(
            prompts,
            n,
            lambda contexts, budget, stop: self.generate_turn(
                contexts, 1, {**sampling, "max_new_tokens": budget, "stop": stop}
            ),
        )

    def generate_turn(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> Rows:
        """Each rank generates a consecutive share; whole prompts when they divide evenly, else single samples.
        A separate rollout splits the prompts over its engines instead."""
        if self.rollout is not None:
            return self.rollout.generate(prompts, n, **sampling).as_rows()
        if len(prompts) % self.dp == 0:
            per = len(prompts) // self.dp
            calls = [(prompts[r * per : (r + 1) * per], n, sampling) for r in range(self.dp)]
        else:
            expanded = [p for p in prompts for _ in range(n)]
            chunks = np.array_split(np.arange(len(expanded)), self.dp)
            calls = [([expanded[i] for i in c], 1, sampling) for c in chunks]
        import ray

        refs = [(w.generate.remote(*args)) for w, args in zip(self.actor.workers, calls, strict=True) if args[0]]
        return concat(ray.get(refs), self.pad_id)

    def forward_all(self, group: Any, method: str, rows: Rows) -> dict[str, Tensor]:
        """A forward-only pass over equal consecutive shares of the rows; outputs concatenated back in order."""
        keys: tuple[str, ...] = ("prompts", "prompt_mask", "responses", "response_mask")
        keys += ("response_attention_mask",) if "response_attention_mask" in rows else ()
        shards = shard_rows({k: rows[k] for k in keys}, self.dp)
        results: list[dict[str, Tensor]] = group.each(method, [(s,) for s in shards])
        return {k: torch.cat([r[k] for r in results]) for k in results[0]}

    def update(self, group: Any, rows: Rows, keys: tuple[str, ...], role: str) -> dict[str, float]:
        """Split by mini-batch and rank (plan_batches), send each rank its slices and the global token totals."""
        mini_rows = self.spec.batch.ppo_mini_batch_size * self.spec.batch.rollout_n
        keys += ("response_attention_mask",) if "response_attention_mask" in rows else ()
        wanted = {k: rows[k] for k in ("prompts", "prompt_mask", "responses", "response_mask", *keys)}
        totals = [
            {"tokens": float(slice_rows(wanted, s, s + mini_rows)["response_mask"].sum()), "seqs": float(mini_rows)}
            for s in range(0, len(rows["responses"]), mini_rows)
        ]
        per_rank = shard_mini_batches(wanted, mini_batch_rows=mini_rows, dp=self.dp)
        results = group.each("update", [(mbs, totals) for mbs in per_rank])
        return reduce_update_metrics(results, role)

    def score(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
        """One score per response, and the reward function's extra numbers per response (NaN where missing)."""
        if self.agent is not None and self.agent.agent.environment is not None:
            return self.agent.environment_scores(), {}
        texts = (
            self.agent.texts()
            if self.agent is not None
            else self.tokenizer.batch_decode(
                [ids[m.bool()] for ids, m in zip(rows["responses"], rows["response_mask"], strict=True)],
                skip_special_tokens=True,
            )
        )
        if self.reward_model is not None:
            assert self.rm_tokenizer is not None, "set with the reward model"
            full = [
                self.rm_tokenizer.apply_chat_template(
                    [*s.raw_prompt, {"role": "assistant", "content": t}], tokenize=False
                )
                for s, t in zip(samples, texts, strict=True)
            ]
            chunks = [list(c) for c in np.array_split(np.array(full, dtype=object), self.dp)]
            results = self.reward_model.each("score", [(c,) for c in chunks])
            return torch.tensor([x for r in results for x in r], dtype=torch.float32), {}
        inputs = [
            RewardInput(
                s.data_source,
                t,
                s.ground_truth,
                s.extra_info if self.agent is None else {**s.extra_info, "trajectory": self.agent.trajectory_info(i)},
            )
            for i, (s, t) in enumerate(zip(samples, texts, strict=True))
        ]
        assert self.reward_fn is not None, "set unless a reward model scores"
        outputs = score_batch(self.reward_fn, inputs)
        keys = sorted({k for o in outputs for k in o.extra})
        return (
            torch.tensor([o.score for o in outputs], dtype=torch.float32),
            {k: torch.tensor([o.extra.get(k, float("nan")) for o in outputs], dtype=torch.float32) for k in keys},
        )

    # --- validation ------------------------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        n = self.spec.rollout.val.rollout_n
        rows = self.generate([p.input_ids for p in self.val_prompts], n, self.val_sampling())
        samples = [p for p in self.val_prompts for _ in range(n)]
        scores, _ = self.score(samples, rows)
        by_source: dict[str, list[float]] = {}
        for s, score in zip(samples, scores.tolist(), strict=True):
            by_source.setdefault(s.data_source, []).append(score)
        return {f"val-core/{src}/reward/mean@{n}": float(np.mean(v)) for src, v in by_source.items()}

    # --- metrics ---------------------------------------------------------------------------------------------

    def kl_coef(self) -> float | None:
        kl = self.spec.algorithm.kl
        if kl.loss.enabled:
            return kl.loss.coef
        return self.kl_ctrl.value if kl.in_reward else None

    def device_stats(self) -> list[dict[str, float]] | None:
        return self.actor.all("device_stats") if self.spec.cluster.device == "cuda" else None

    def peak_flops(self) -> float | None:
        """Peak FLOP/s of one device, or None when unknown (CPU without KUBERL_PEAK_FLOPS): no MFU then."""
        if os.environ.get("KUBERL_PEAK_FLOPS"):
            return float(os.environ["KUBERL_PEAK_FLOPS"])
        if self.spec.cluster.device != "cuda":
            return None
        if not hasattr(self, "gpu_name"):
            self.gpu_name = self.actor.all("device_name")[0]
        return next((v for k, v in PEAK_FLOPS.items() if k in self.gpu_name), None)

    # --- teardown --------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        import ray

        if hasattr(self, "metrics"):
            self.metrics.close()
        if self.agent is not None:
            self.agent.close()
        if self.stop_code == EXIT_STOPPED:  # the pod is going down: its Ray processes got SIGTERM too
            return
        for group in self.groups:
            with contextlib.suppress(Exception):
                group.kill()
        if getattr(self, "pg", None) is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.pg)
        if self.ray_started_here:
            ray.shutdown()


# --- entry points ----------------------------------------------------------------------------------------------


def run_job(
    name: str,
    spec: RLJobSpec,
    *,
    address: str | None = None,
    run_dir: str | None = None,
    steps: int | None = None,
    namespace: str = "default",
    show_progress: bool = True,
) -> int:
    """Train ``spec``; 0 when done, 130 after SIGINT and 143 after SIGTERM (checkpoint saved), 1 on failure."""
    folder = Path(run_dir) if run_dir else Path("runs") / name
    folder.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(
        name, spec, run_dir=folder, namespace=namespace, address=address, steps=steps, show_progress=show_progress
    )
    started = time.time()
    try:
        trainer.setup()
        code = trainer.fit()
    finally:
        trainer.shutdown()
    print(
        f"run {name}: {trainer.global_step} steps in {time.time() - started:.1f} s; metrics in "
        f"{folder / 'metrics.jsonl'}; last checkpoint {trainer.last_checkpoint}"
    )
    if code == EXIT_STOPPED:  # exit now: Ray's exit hooks would wait a minute for a GCS that SIGTERM stopped
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The entrypoint's flags (kuberl.api.contract.entrypoint writes them); --namespace defaults to the pod's."""
    parser = argparse.ArgumentParser(prog=f"python -m {TRAINER_MODULE}", description=main.__doc__)
    parser.add_argument("--spec-file", required=True, help="the RLJob spec as JSON (or YAML), camelCase")
    parser.add_argument("--name", required=True)
    parser.add_argument("--namespace", default=os.environ.get(ENV_RLJOB_NAMESPACE, "default"))
    parser.add_argument("--address", default="auto", help='Ray address; "auto" joins the cluster this pod is in')
    parser.add_argument("--run-dir")
    parser.add_argument("--steps", type=int)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m kuberl.trainer.run --spec-file spec.json --name NAME --namespace NS`` (the RayJob entrypoint)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    text = Path(args.spec_file).read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        raw = yaml.safe_load(text)
    raw = raw.get("spec", raw) if isinstance(raw, dict) and "apiVersion" in raw else raw
    try:
        spec = parse_spec(raw, source=args.spec_file)
        return run_job(
            args.name,
            spec,
            address=args.address,
            run_dir=args.run_dir,
            steps=args.steps,
            namespace=args.namespace,
            show_progress=False,
        )
    except Exception as exc:  # reported, then: permanent → EXIT_PERMANENT (no retry), transient → raised (exit 1)
        failure = classify(exc)
        reporter = StatusReporter.from_env(args.name, args.namespace)
        if reporter is not None:
            reporter.report_failure(failure)
        if failure.kind != FailureClass.PERMANENT:
            raise
        logging.getLogger(__name__).error("permanent failure, not retried", exc_info=exc)
        print(f"error: {failure.error}: {failure.message}", file=sys.stderr)
        return EXIT_PERMANENT


if __name__ == "__main__":
    sys.exit(main())
