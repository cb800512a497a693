"""The single controller: one driver runs the RL loop and drives SPMD worker groups on Ray.

``kuberl run rljob.yaml`` starts an embedded local Ray (or joins ``--address``); on Kubernetes the RayJob runs
``python -m kuberl.trainer.run --spec-file /etc/kuberl/spec.json --name NAME --namespace NS`` and joins the
cluster it runs in (``ray.init(address="auto")``).

One step, top to bottom (:meth:`Trainer.train_step`): rollout → reward (:func:`kuberl.trainer.experience.collect.collect_batch`:
overlong shaping, dynamic sampling, ReMax baselines) → old log-probs → reference log-probs →
values → advantages (on the driver) → critic update → actor update → weight sync → metrics. Validation, checkpoints
and metrics wrap it in :meth:`Trainer.fit`. With ``rollout.overlap: oneStepOffPolicy`` the loop runs
:meth:`Trainer.overlapped_step` instead: the next batch is generated while this one trains
(:mod:`kuberl.trainer.experience.overlap`). What runs on Ray is started and stopped by
:class:`~kuberl.trainer.driver.cluster.Cluster`, checkpoints are saved and resumed by
:class:`~kuberl.trainer.checkpoint.checkpointer.Checkpointer`, metrics and status go out through
:class:`~kuberl.trainer.observe.reporting.Reporting`.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from kuberl.api import RLJobSpec, plan_batches
from kuberl.api.contract import (
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
)
from kuberl.trainer.algorithms.advantages import compute_advantages
from kuberl.trainer.algorithms.kl import apply_kl_in_reward, make_kl_controller
from kuberl.trainer.checkpoint.checkpointer import Checkpointer
from kuberl.trainer.data.prompts import Prompt, PromptDataset, PromptLoader, load_rows, load_rows_with_origins
from kuberl.trainer.driver.cluster import Cluster
from kuberl.trainer.experience.collect import Rollouts, collect_batch, place_at_last_token
from kuberl.trainer.experience.metrics import data_metrics, perf_metrics, reduce_update_metrics, staleness_metrics
from kuberl.trainer.experience.overlap import AheadGeneration, Generated, draw, overlap_seconds
from kuberl.trainer.model.microbatch import Rows, concat, shard_mini_batches, shard_rows, slice_rows
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.observe.reporting import Reporting, write
from kuberl.trainer.plan.execution import ExecutionPlan
from kuberl.trainer.rewards.functions import SCORE_DTYPE, NonFiniteRewardError, RewardInput, RewardTimeoutError
from kuberl.trainer.rewards.process import make_scorer
from kuberl.trainer.rewards.scoring import RewardPolicy, check_finite

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.workers.group import WorkerGroup


log = logging.getLogger("kuberl.trainer")

STOP_SIGNALS = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_STOPPED}


class Trainer:
    """The driver of one RLJob: the loop (:meth:`fit`) and the step (:meth:`train_step`). What runs on Ray is its
    :class:`Cluster`, checkpoints are its :class:`Checkpointer`'s, metrics and status go through its
    :class:`Reporting`."""

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
        self.batch_plan = plan_batches(spec)
        self.dp = self.batch_plan.trainer_gpus
        algo = spec.algorithm
        self.kl_ctrl = make_kl_controller(algo.kl.control, algo.kl.coef, algo.kl.target, algo.kl.horizon)
        self.global_step = 0
        self.stop_requested = False
        self.stop_code = 0
        """EXIT_INTERRUPTED or EXIT_STOPPED once a stop signal arrived."""
        self.cluster = Cluster(spec, ranks=self.dp, address=address, write=write)
        self.generation: AheadGeneration | None = None
        """The background generation of the next batch (rollout.overlap oneStepOffPolicy); None when off."""
        self.ahead: Generated | None = None
        """The batch generated ahead of its step, not trained yet."""
        self.reporting: Reporting
        self.checkpoints: Checkpointer
        """Both made in :meth:`setup`, once the workers are up."""

    # --- setup -------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        from kuberl.trainer.model.loading import load_tokenizer, model_family_flops_per_token

        spec = self.spec
        torch.manual_seed(spec.data.seed)
        np.random.seed(spec.data.seed)
        self.tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path)
        rows, origins = load_rows_with_origins(spec.data.train_files, prompt_key=spec.data.prompt_key)
        dataset = PromptDataset(
            rows,
            self.tokenizer,
            prompt_key=spec.data.prompt_key,
            max_prompt_length=spec.data.max_prompt_length,
            filter_overlong=spec.data.filter_overlong_prompts,
            origins=origins,
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
        write(
            f"RLJob {self.name}: {p.trainer_gpus} {spec.cluster.device} trainer rank(s), "
            f"{p.responses_per_step} responses/step, {p.optimizer_steps_per_step} optimizer step(s)/step, "
            f"micro-batch {p.micro_batch_size_per_gpu or 'by token budget'}"
            f"{f' × {p.gradient_accumulation_steps} accumulated' if p.gradient_accumulation_steps else ''}; "
            f"{self.total_steps} steps, {len(self.loader)} per epoch; {len(dataset)} prompts "
            f"({dataset.num_filtered} overlong filtered), {len(self.val_prompts)} validation prompts"
        )
        self.reporting = Reporting(
            spec, rljob=self.name, namespace=self.namespace, run_dir=self.run_dir, total_steps=self.total_steps
        )
        self.checkpoints = Checkpointer(
            spec,
            rljob=self.name,
            cluster=self.cluster,
            loader=self.loader,
            kl_ctrl=self.kl_ctrl,
            total_steps=self.total_steps,
            reporting=self.reporting,
        )
        self.checkpoints.take_folder()  # before Ray starts: a folder this run cannot own or write fails at once
        policy = RewardPolicy(spec.reward.timeout_seconds, spec.reward.on_error, spec.reward.max_error_fraction)
        self.reward_fn = None if spec.reward.model else make_scorer(spec.reward.function, policy)
        self.rm_tokenizer = load_tokenizer(spec.reward.model.path) if spec.reward.model else None
        self.cluster.start(
            total_steps=self.total_steps,
            tokenizer=self.tokenizer,
            agent_prompts=[*self.loader.dataset.prompts, *self.val_prompts],
        )
        self.flops_per_token = model_family_flops_per_token(self.cluster.model_config)
        self.global_step = self.checkpoints.resume()
        if spec.rollout.overlap == "oneStepOffPolicy":
            self.generation = AheadGeneration(lambda prompts, timer: collect_batch(self, prompts, timer))

    # --- what the step drives (started by the cluster) ---------------------------------------------------------

    @property
    def plan(self) -> ExecutionPlan:
        return self.cluster.plan

    @property
    def actor(self) -> WorkerGroup:
        return self.cluster.actor

    @property
    def critic(self) -> WorkerGroup | None:
        return self.cluster.critic

    @property
    def reward_model(self) -> WorkerGroup | None:
        return self.cluster.reward_model

    @property
    def agent(self) -> AgentLoop | None:
        return self.cluster.agent

    @property
    def pad_id(self) -> int:
        return self.cluster.pad_id

    @property
    def last_checkpoint(self) -> str | None:
        return self.checkpoints.last

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
            disable=not (self.show_progress and sys.stderr.isatty()),  # in a log file it interleaves with steps
            file=sys.stderr,
            dynamic_ncols=True,
        )
        try:
            if spec.val_before_train and self.val_prompts and self.global_step == 0:
                val = self.validate()
                self.reporting.log(0, val)
            saved_at, metrics = -1, {}
            while self.global_step < self.total_steps and not self.stop_requested:
                if self.generation is None:
                    drawn = draw(self.loader)
                    metrics, epoch = self.train_step(drawn.prompts), drawn.epoch
                else:
                    metrics, epoch = self.overlapped_step()
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
                self.reporting.log(self.global_step, metrics)
                # a stop's checkpoint is reported at once: the pod may be gone before the next report
                stopping = last or self.stop_requested
                self.reporting.progress(self.global_step, metrics, last_checkpoint=self.last_checkpoint, force=stopping)
                bar.update(1)
            if self.stop_requested:
                if saved_at != self.global_step:
                    self.save_checkpoint()
                    self.reporting.progress(self.global_step, metrics, last_checkpoint=self.last_checkpoint, force=True)
                write(f"interrupted: checkpoint saved at step {self.global_step} in {self.last_checkpoint}")
                return self.stop_code
            return 0
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def save_checkpoint(self) -> None:
        """A checkpoint of this step. A batch generated ahead is not in it: it keeps the loader position before that
        batch, so a resumed run generates it again (with the weights of this step)."""
        self.checkpoints.save(self.global_step, dataloader=self.ahead.drawn.position if self.ahead else None)

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

    # --- one step --------------------------------------------------------------------------------------------

    def train_step(self, prompts: list[Prompt]) -> dict[str, float]:
        """generate → reward → old/reference log-probs, values → advantages → update → sync → metrics."""
        timer = Timer()
        with timer("step"):
            batch = collect_batch(self, prompts, timer)  # generate → reward, dynamic sampling's rounds
            metrics, token_rewards, entropy = self.learn(batch, timer)
            with timer("update_weights"):
                self.sync_weights()
        metrics.update(timer.metrics())
        metrics.update(self.step_metrics(batch, token_rewards, entropy, timer))
        return metrics

    def overlapped_step(self) -> tuple[dict[str, float], int]:
        """One step of ``rollout.overlap: oneStepOffPolicy`` (:mod:`kuberl.trainer.experience.overlap`): train on the batch
        generated during the last step while the engines generate the next one with the weights they hold, then
        wait for that generation and only then sync this step's weights. Returns the metrics and the epoch of the
        batch trained. ``timing_s/gen`` and ``timing_s/reward`` are the trained batch's (generated ahead),
        ``timing_s/gen_wait`` the trainer's idle wait for a generation, ``timing_s/overlap`` how long the next
        batch's generation ran alongside this step's passes."""
        generation = self.generation
        assert generation is not None, "made in setup with rollout.overlap oneStepOffPolicy"
        timer = Timer()
        with timer("step"):
            if self.ahead is None:  # the first step of a run or of a resume: nothing was generated ahead
                generation.submit(draw(self.loader))
                with timer("gen_wait"):
                    self.ahead = generation.wait()
            current, self.ahead = self.ahead, None
            if self.global_step + 1 < self.total_steps and not self.stop_requested:
                generation.submit(draw(self.loader))  # with the weights the engines hold: one step behind
            start = time.monotonic()
            metrics, token_rewards, entropy = self.learn(current.rollouts, timer)
            end = time.monotonic()
            overlap = 0.0
            if generation.busy:
                with timer("gen_wait"):
                    self.ahead = generation.wait()
                overlap = overlap_seconds(self.ahead, start, end)
            with timer("update_weights"):
                self.sync_weights()
        metrics.update(current.timer.metrics())
        metrics.update(timer.metrics())
        metrics["timing_s/overlap"] = overlap
        metrics.update(self.step_metrics(current.rollouts, token_rewards, entropy, timer))
        return metrics, current.drawn.epoch

    def learn(self, batch: Rollouts, timer: Timer) -> tuple[dict[str, float], Tensor, Tensor | None]:
        """old/reference log-probs, values → advantages → critic and actor updates on a generated batch. Returns
        the update's metrics, the token rewards and the entropy (None when not computed)."""
        rows = batch.rows
        metrics = {**batch.metrics, **(self.agent.metrics() if self.agent is not None else {})}
        entropy: Tensor | None = None
        fused = self.plan.old_log_probs_from_update
        if not fused:
            with timer("old_log_prob"):
                out = self.forward_all(self.actor, "compute_log_probs", rows)
                rows["old_log_probs"], entropy = out["log_probs"], out.get("entropy")
        if self.plan.uses_reference:
            with timer("ref"):
                rows["ref_log_probs"] = self.forward_all(self.actor, "compute_ref_log_probs", rows)["ref_log_probs"]
        if self.critic is not None:
            with timer("values"):
                rows["values"] = self.forward_all(self.critic, "compute_values", rows)["values"]
        with timer("adv"):
            token_rewards, kl_metrics = self.advantages(batch)
            metrics.update(kl_metrics)
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self.update(self.critic, rows, ("values", "returns"), "critic"))
        with timer("update_actor"):
            keys = ("advantages",) + (() if fused else ("old_log_probs",))
            keys += ("ref_log_probs",) if self.spec.algorithm.kl.loss.enabled else ()
            keys += ("rollout_log_probs",) if self.spec.algorithm.rollout_correction.enabled else ()
            metrics.update(self.update(self.actor, rows, keys, "actor"))
            if fused:  # the old log-probs and entropy of the update's own forward, rows in rank order
                parts = self.actor.all("update_outputs")
                rows["old_log_probs"] = torch.cat([r["log_probs"] for r in parts])
                entropy = torch.cat([r["entropy"] for r in parts])
        return metrics, token_rewards, entropy

    def sync_weights(self) -> None:
        """The updated weights into the rollout engine(s), as version ``global_step + 1`` (this step's result)."""
        self.actor.all("sync_weights", self.global_step + 1)

    def advantages(self, batch: Rollouts) -> tuple[Tensor, dict[str, float]]:
        """Advantages and returns into the batch's rows. Returns the token rewards they came from (the score at the
        last token, less the KL penalty with ``kl.inReward``, which moves the KL controller) and the penalty's
        metrics."""
        algo, rows = self.spec.algorithm, batch.rows
        mask = rows["response_mask"].float()
        token_scores = place_at_last_token(batch.scores, rows["response_mask"])
        token_rewards, metrics = token_scores, {}
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
        rows["advantages"], rows["returns"] = compute_advantages(
            algo.advantage_estimator,
            token_rewards,
            mask,
            values=rows.get("values"),
            group_ids=batch.group_ids,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std=algo.norm_adv_by_std,
            reward_baselines=batch.reward_baselines,
        )
        bad = ~torch.isfinite(rows["advantages"].masked_fill(mask == 0, 0)).all(-1)
        if bad.any():  # scores within MAX_ABS_SCORE keep them finite; values (gae) or the KL penalty may not
            raise NonFiniteRewardError(
                f"the {algo.advantage_estimator} advantages of {int(bad.sum())} of {len(bad)} responses are not "
                f"finite (first: response {int(bad.nonzero()[0])}, scored {batch.scores[bad][0].item()}); the step "
                "would train on NaN"
            )
        return token_rewards, metrics

    def step_metrics(
        self, batch: Rollouts, token_rewards: Tensor, entropy: Tensor | None, timer: Timer
    ) -> dict[str, float]:
        """The step's data (scores, rewards, lengths, entropy, KL) and throughput (tokens/s, MFU) metrics."""
        correction = self.spec.algorithm.rollout_correction
        data = data_metrics(
            batch.rows,
            batch.scores,
            token_rewards,
            entropy,
            batch.extra_metrics(),
            max_response_length=self.spec.data.max_response_length,
            kl_coef=self.kl_coef(),
            rollout_is_threshold=correction.threshold if correction.enabled else None,
        )
        perf = perf_metrics(
            batch.rows,
            timer,
            ranks=self.dp,
            flops_per_token=self.flops_per_token,
            ppo_epochs=self.spec.batch.ppo_epochs,
            peak_flops=self.cluster.peak_flops(),
            device_stats=self.cluster.device_stats(),
        )
        staleness = staleness_metrics(batch.rows, policy_version=self.global_step)
        allowed = 0 if self.generation is None else 1
        if staleness and not 0 <= staleness["rollout/staleness"] <= allowed:
            raise RuntimeError(  # the loop's order rules it out: weights reached the engines out of step
                f"step {self.global_step + 1} trained on a batch generated by weights of step "
                f"{staleness['rollout/weight_version']:.0f}, {staleness['rollout/staleness']:.0f} step(s) behind "
                f"the policy (at most {allowed} with rollout.overlap {self.spec.rollout.overlap})"
            )
        return {**data, **perf, **staleness}

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
        rollout = self.cluster.rollout
        if rollout is not None:
            return rollout.generate(prompts, n, **sampling).as_rows()
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
        mini_rows = self.batch_plan.responses_per_mini_batch
        keys += ("response_attention_mask",) if "response_attention_mask" in rows else ()
        wanted = {k: rows[k] for k in ("prompts", "prompt_mask", "responses", "response_mask", *keys)}
        totals = [
            {"tokens": float(slice_rows(wanted, s, s + mini_rows)["response_mask"].sum()), "seqs": float(mini_rows)}
            for s in range(0, len(rows["responses"]), mini_rows)
        ]
        per_rank = shard_mini_batches(wanted, mini_batch_rows=mini_rows, dp=self.dp)
        results = group.each("update", [(mbs, totals) for mbs in per_rank])
        metrics = reduce_update_metrics(results, role)
        if metrics[f"{role}/skipped_steps"]:
            self.reporting.warn(
                "NonFiniteStepsSkipped",
                f"step {self.global_step + 1}: {metrics[f'{role}/skipped_steps']:.0f} {role} optimizer step(s) "
                "skipped for a non-finite gradient norm",
            )
        return metrics

    def _reward_model_scores(self, chunks: list[list[str]]) -> list[list[float]]:
        """Each rank's scores of its chunk, within reward.timeoutSeconds: a reward model that hangs (or is far too
        slow) ends the job as a permanent failure instead of holding the GPUs."""
        import ray

        assert self.reward_model is not None and self.spec.reward.model is not None, "called with a reward model"
        timeout = self.spec.reward.timeout_seconds
        try:
            results: list[list[float]] = self.reward_model.each("score", [(c,) for c in chunks], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RewardTimeoutError(
                f"reward.model {self.spec.reward.model.path} did not score {sum(map(len, chunks))} responses within "
                f"{timeout:g} s (reward.timeoutSeconds): a hung or far too slow reward model. Raise "
                "reward.timeoutSeconds if it is only slow"
            ) from None
        return results

    def score(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
        """One score per response, and the reward function's extra numbers per response (NaN where missing)."""
        sources = [s.data_source for s in samples]
        if self.agent is not None and self.agent.agent.environment is not None:
            scores = self.agent.environment_scores().to(SCORE_DTYPE)
            check_finite(scores, sources, f"rollout.agent.environment {self.agent.agent.environment.class_path}")
            return scores, {}
        texts = (
            self.agent.texts()
            if self.agent is not None
            else self.tokenizer.batch_decode(
                [ids[m.bool()] for ids, m in zip(rows["responses"], rows["response_mask"], strict=True)],
                skip_special_tokens=True,
            )
        )
        if self.reward_model is not None:
            assert self.rm_tokenizer is not None and self.spec.reward.model is not None, "set with the reward model"
            full = [
                self.rm_tokenizer.apply_chat_template(
                    [*s.raw_prompt, {"role": "assistant", "content": t}], tokenize=False
                )
                for s, t in zip(samples, texts, strict=True)
            ]
            chunks = [list(c) for c in np.array_split(np.array(full, dtype=object), self.dp)]
            results = self._reward_model_scores(chunks)
            scores = torch.tensor([x for r in results for x in r], dtype=SCORE_DTYPE)
            check_finite(scores, sources, f"reward.model {self.spec.reward.model.path}")
            return scores, {}
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
        outputs = self.reward_fn.score(inputs)
        keys = sorted({k for o in outputs for k in o.extra})
        return (
            torch.tensor([o.score for o in outputs], dtype=SCORE_DTYPE),
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

    # --- teardown --------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        if self.generation is not None:
            self.generation.close()
        if hasattr(self, "reporting"):
            self.reporting.close()
        reward_fn = getattr(self, "reward_fn", None)  # None before setup got to it, or with a reward model
        if reward_fn is not None:
            reward_fn.close()
        self.cluster.shutdown(pod_stopping=self.stop_code == EXIT_STOPPED)
        if hasattr(self, "checkpoints"):
            self.checkpoints.release()


# --- entry points ----------------------------------------------------------------------------------------------
