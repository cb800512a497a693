"""The single controller: one driver runs the RL loop and drives SPMD worker groups on Ray.

One step, top to bottom (:meth:`Trainer.train_step`): take the step's experience from the
:class:`~kuberl.trainer.experience.stage.ExperienceStage` (generate, score, old and reference log-probs, values,
advantages) → critic update → actor update → weight sync → metrics. Validation, checkpoints and reports wrap it in
:meth:`Trainer.fit`. What runs on Ray is started and stopped by :class:`~kuberl.trainer.driver.cluster.Cluster`,
checkpoints are saved and resumed by :class:`~kuberl.trainer.checkpoint.checkpointer.Checkpointer`, metrics and
status go out through :class:`~kuberl.trainer.observe.reporting.Reporting`.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kuberl.api import RLJobSpec
from kuberl.api.contract import EXIT_INTERRUPTED, EXIT_STOPPED
from kuberl.trainer.checkpoint.checkpointer import Checkpointer, ResumePoint, select_resume
from kuberl.trainer.checkpoint.folder import CheckpointFolder
from kuberl.trainer.data.prompts import RunPrompts
from kuberl.trainer.driver.cluster import Cluster
from kuberl.trainer.experience.batch import Experience
from kuberl.trainer.experience.scoring import Scorer
from kuberl.trainer.experience.stage import ExperienceStage
from kuberl.trainer.model.loading import load_tokenizer
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.observe.reporting import Reporting, progress_bar, write
from kuberl.trainer.plan.execution import describe_run, plan_execution, token_budget_line
from kuberl.trainer.workers.base import reduce_update_metrics
from kuberl.trainer.workers.group import WorkerGroup

STOP_SIGNALS = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_STOPPED}


class Trainer:
    """The driver of one RLJob: :meth:`setup`, then the loop (:meth:`fit`) of steps (:meth:`train_step`)."""

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
        self.steps_override = steps
        self.show_progress = show_progress
        self.global_step = 0
        self.stop_requested = False
        self.stop_code = 0
        """EXIT_INTERRUPTED or EXIT_STOPPED once a stop signal arrived."""
        self.cluster = Cluster(spec, address=address, write=write)
        self.reporting: Reporting
        self.start: ResumePoint
        """Both made in :meth:`setup` before Ray starts."""
        self.experience: ExperienceStage
        self.checkpoints: Checkpointer
        """Both made in :meth:`setup` once the workers are up; never when the run has nothing left to train."""

    def setup(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.data.seed)
        np.random.seed(spec.data.seed)
        tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path)
        self.prompts = RunPrompts.load(spec.data, tokenizer, batch_size=spec.batch.train_batch_size)
        loader = self.prompts.loader
        self.total_steps = self.steps_override or spec.trainer.total_steps or spec.trainer.total_epochs * len(loader)
        write(describe_run(self.name, spec, self.total_steps, self.prompts.summary()))
        self.folder = CheckpointFolder(spec, rljob=self.name)
        self.folder.take()  # before Ray starts: a folder this run cannot own or write fails at once
        self.reporting = Reporting(
            spec, rljob=self.name, namespace=self.namespace, run_dir=self.run_dir, total_steps=self.total_steps
        )
        self.start = select_resume(spec, self.folder, self.reporting)
        self.global_step = self.start.step
        if self.global_step >= self.total_steps:
            return  # nothing to train: no worker starts
        self.scorer = Scorer(spec, tokenizer=tokenizer)  # a reward function that does not load fails before Ray starts
        cluster = self.cluster
        cluster.start_ray()
        facts = cluster.facts()
        self.plan = plan_execution(spec, facts)  # every derived decision, before any worker starts
        if (budget := token_budget_line(spec, self.plan, facts.gpu)) is not None:
            write(budget)
        cluster.start_workers(
            self.plan,
            total_steps=self.total_steps,
            tokenizer=tokenizer,
            agent_prompts=[*loader.dataset.prompts, *self.prompts.validation],
        )
        self.scorer.connect(agent=cluster.agent, reward_model=cluster.reward_model)
        self.experience = ExperienceStage(
            spec,
            self.plan,
            loader=loader,
            scorer=self.scorer,
            actor=cluster.actor,
            critic=cluster.critic,
            engines=cluster.rollout,
            agent=cluster.agent,
            pad_id=cluster.pad_id,
        )
        self.checkpoints = Checkpointer(
            spec,
            folder=self.folder,
            roles=cluster.checkpointed_roles(),
            ranks=self.plan.ranks,
            params=cluster.params,
            loader=loader,
            kl_ctrl=self.experience.kl_ctrl,
            total_steps=self.total_steps,
            reporting=self.reporting,
        )
        self.checkpoints.resume(self.start)
        if cluster.rollout is not None:
            cluster.rollout.on_change = self.reporting.rollout_engines
        self.experience.start(self.global_step, self.total_steps)

    @property
    def last_checkpoint(self) -> str | None:
        """The newest checkpoint this run saved or resumed from: what the run's last line names."""
        if hasattr(self, "checkpoints"):
            return self.checkpoints.last
        return str(self.start.folder) if self.start.folder is not None else None

    # --- the loop --------------------------------------------------------------------------------------------

    def fit(self) -> int:
        spec = self.spec.trainer
        validation = self.prompts.validation
        previous = {signum: signal.signal(signum, self._on_stop_signal) for signum in STOP_SIGNALS}
        bar = progress_bar(self.name, total=self.total_steps, initial=self.global_step, show=self.show_progress)
        try:
            if spec.val_before_train and validation and self.global_step == 0:
                self.reporting.log(0, self.experience.validate(validation))
            saved_at, metrics = -1, dict[str, float]()
            while self.global_step < self.total_steps and not self.stop_requested:
                metrics, epoch = self.train_step()
                self.global_step += 1
                last = self.global_step >= self.total_steps
                timer = Timer()
                if spec.test_freq > 0 and validation and (self.global_step % spec.test_freq == 0 or last):
                    with timer("testing"):
                        metrics.update(self.experience.validate(validation))
                if (spec.save_freq > 0 and self.global_step % spec.save_freq == 0) or last or self.stop_requested:
                    with timer("save_checkpoint"):
                        self.save_checkpoint()
                    saved_at = self.global_step
                metrics.update(timer.metrics())
                metrics["training/global_step"] = self.global_step
                metrics["training/epoch"] = epoch
                self.reporting.log(self.global_step, metrics)
                # a stop's checkpoint is reported at once: the pod may be gone before the next report
                stopping = last or self.stop_requested
                self.reporting.progress(
                    self.global_step, metrics, last_checkpoint=self.checkpoints.last, force=stopping
                )
                bar.update(1)
            if self.stop_requested:
                if saved_at != self.global_step:
                    self.save_checkpoint()
                    self.reporting.progress(
                        self.global_step, metrics, last_checkpoint=self.checkpoints.last, force=True
                    )
                write(f"interrupted: checkpoint saved at step {self.global_step} in {self.checkpoints.last}")
                return self.stop_code
            return 0
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def train_step(self) -> tuple[dict[str, float], int]:
        """take experience → update → sync → metrics; returns the metrics and the epoch of the batch trained."""
        timer = Timer()
        with timer("step"):
            more = self.global_step + 1 < self.total_steps and not self.stop_requested
            taken = self.experience.take(timer, generate_next=more)
            exp = self.experience.complete(taken.scored, timer)
            metrics = {**exp.metrics, **self.update(exp, timer)}
            overlap = self.experience.settle(timer)
            with timer("update_weights"):  # the updated weights, version global_step + 1 (this step's result)
                self.cluster.sync_weights(self.global_step + 1)
        metrics.update(taken.ahead_timings)
        metrics.update(timer.metrics())
        metrics.update(overlap)
        metrics.update(self.experience.metrics(exp, policy_version=self.global_step))
        metrics.update(self.cluster.perf_metrics(exp.num_tokens, timer))
        return metrics, taken.epoch

    def update(self, exp: Experience, timer: Timer) -> dict[str, float]:
        """The critic's update, then the actor's; with the plan's old_log_probs_from_update the old log-probs and
        entropy come back from the actor's update into ``exp``."""
        metrics: dict[str, float] = {}
        critic, actor = self.cluster.critic, self.cluster.actor
        if critic is not None:
            with timer("update_critic"):
                metrics.update(self.update_role(critic, exp, self.plan.critic_update_fields))
        with timer("update_actor"):
            metrics.update(self.update_role(actor, exp, self.plan.actor_update_fields))
            if self.plan.old_log_probs_from_update:  # rows in rank order, as the update received them
                parts = actor.call("update_outputs")
                exp.old_log_probs = torch.cat([r["log_probs"] for r in parts])
                exp.entropy = torch.cat([r["entropy"] for r in parts])
        return metrics

    def update_role(self, group: WorkerGroup, exp: Experience, fields: tuple[str, ...]) -> dict[str, float]:
        results = group.call("update", exp.rows(fields), self.plan.batch.responses_per_mini_batch)
        metrics = reduce_update_metrics(results, group.role)
        skipped = metrics[f"{group.role}/skipped_steps"]
        if skipped:
            self.reporting.warn(
                "NonFiniteStepsSkipped",
                f"step {self.global_step + 1}: {skipped:.0f} {group.role} optimizer step(s) skipped for a non-finite "
                "gradient norm",
            )
        return metrics

    def save_checkpoint(self) -> None:
        """A checkpoint of this step; a batch generated ahead is not in it (see ExperienceStage.resume_position)."""
        self.checkpoints.save(self.global_step, dataloader=self.experience.resume_position())

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        """SIGINT (Ctrl-C) and SIGTERM (how Kubernetes and Ray stop a pod): finish the step, save, exit 128+signal.
        The pod's terminationGracePeriodSeconds must cover the rest of the step plus a save."""
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        self.stop_code = STOP_SIGNALS[signal.Signals(signum)]
        write(
            f"{signal.Signals(signum).name}: finishing this step, saving a checkpoint and exiting "
            "(a second signal aborts)"
        )

    def shutdown(self) -> None:
        if hasattr(self, "experience"):
            self.experience.close()
        if hasattr(self, "reporting"):
            self.reporting.close()
        if hasattr(self, "scorer"):
            self.scorer.close()
        self.cluster.shutdown(pod_stopping=self.stop_code == EXIT_STOPPED)
        if hasattr(self, "folder"):
            self.folder.release()
