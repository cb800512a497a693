"""The experience stage: the driver's loop asks it for one step's :class:`~kuberl.trainer.experience.batch.Experience`
and never reaches into how it is made (OpenRLHF's experience maker, verl's ``fit`` up to the update).

:meth:`ExperienceStage.take` draws a prompt batch and has it generated and scored (:mod:`.rounds`), or, with
``rollout.overlap: oneStepOffPolicy``, returns the batch generated during the last step and starts the next one
(:mod:`.overlap`); :meth:`~ExperienceStage.complete` adds the trainer's passes (old log-probs, reference log-probs,
values), the token rewards (less the KL penalty with ``algorithm.kl.inReward``, which moves the KL controller) and
the advantages; :meth:`~ExperienceStage.settle` waits for a generation still running before the weights change.
With ``rollout.overlap: async`` the engines generate continuously from :meth:`~ExperienceStage.start` on and
:meth:`~ExperienceStage.take` takes the groups that are ready (:mod:`.stream`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from kuberl.api import RLJobSpec
from kuberl.trainer.algorithms.advantages import compute_advantages
from kuberl.trainer.algorithms.kl import apply_kl_in_reward, make_kl_controller
from kuberl.trainer.data.prompts import Prompt, PromptLoader
from kuberl.trainer.experience.batch import Experience, Scored, pass_rows, place_at_last_token
from kuberl.trainer.experience.generation import Generation
from kuberl.trainer.experience.metrics import data_metrics, staleness_metrics
from kuberl.trainer.experience.overlap import AheadGeneration, Generated, draw, overlap_seconds
from kuberl.trainer.experience.rounds import Rounds
from kuberl.trainer.experience.scoring import Scorer
from kuberl.trainer.experience.stream import GroupStream
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.plan.execution import ExecutionPlan
from kuberl.trainer.rewards.functions import NonFiniteRewardError

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.rollout.engine_pool import EnginePool
    from kuberl.trainer.workers.group import WorkerGroup


@dataclass(frozen=True)
class Taken:
    """A step's scored batch, the epoch it was drawn in, and the timings of work done for it ahead of the step."""

    scored: Scored
    epoch: int
    ahead_timings: dict[str, float]


class ExperienceStage:
    def __init__(
        self,
        spec: RLJobSpec,
        plan: ExecutionPlan,
        *,
        loader: PromptLoader,
        scorer: Scorer,
        actor: WorkerGroup,
        critic: WorkerGroup | None,
        engines: EnginePool | None,
        agent: AgentLoop | None,
        pad_id: int,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.loader = loader
        self.scorer = scorer
        self.actor = actor
        self.critic = critic
        self.agent = agent
        kl = spec.algorithm.kl
        self.kl_ctrl = make_kl_controller(kl.control, kl.coef, kl.target, kl.horizon)
        self.generation = Generation(actor=actor, engines=engines, agent=agent, pad_id=pad_id)
        self.rounds = Rounds(
            spec,
            generation=self.generation,
            scorer=scorer,
            loader=loader,
            sampling=plan.train_sampling,
            final_rewards=self.final_rewards,
        )
        self.ahead: AheadGeneration | None = (
            AheadGeneration(self.rounds.collect) if spec.rollout.overlap == "oneStepOffPolicy" else None
        )
        """The background generation of the next batch (rollout.overlap oneStepOffPolicy); None when off."""
        self.pending: Generated | None = None
        """The batch generated ahead of its step, not trained yet."""
        self.stream: GroupStream | None = None
        """The continuous generation of rollout.overlap async; None otherwise."""
        if spec.rollout.overlap == "async":
            assert engines is not None, "async generation runs on separate engines"
            self.stream = GroupStream(
                pool=engines,
                loader=loader,
                scorer=scorer,
                sampling=plan.train_sampling,
                rollout_n=spec.batch.rollout_n,
                max_staleness=spec.rollout.staleness_limit,
                pad_id=pad_id,
            )

    def start(self, step: int, total_steps: int) -> None:
        """The run trains steps ``step + 1 … total_steps`` from here (the engines hold the weights of ``step``):
        asynchronous generation starts now."""
        if self.stream is not None:
            self.stream.start(step, total_steps)

    # --- one step's batch ------------------------------------------------------------------------------------------

    def take(self, timer: Timer, *, generate_next: bool) -> Taken:
        """This step's scored batch. Overlapped: the batch generated ahead (waited for at the first step of a run
        or a resume, ``timing_s/gen_wait``), and the next one starts with the weights the engines hold when
        ``generate_next``; ``gen`` and ``reward`` are then the trained batch's timings. Asynchronous: the groups
        ready first (waited for: ``timing_s/gen_wait``)."""
        if self.stream is not None:
            scored, epoch = self.stream.take(timer, generate_next=generate_next)
            return Taken(scored, epoch, {})
        if self.ahead is None:
            drawn = draw(self.loader)
            return Taken(self.rounds.collect(drawn.prompts, timer), drawn.epoch, {})
        if self.pending is None:
            self.ahead.submit(draw(self.loader))
            with timer("gen_wait"):
                self.pending = self.ahead.wait(self.admit_engines)
        current, self.pending = self.pending, None
        if generate_next:
            self.ahead.submit(draw(self.loader))  # with the weights the engines hold: one step behind
        self.passes_started = time.monotonic()
        return Taken(current.scored, current.drawn.epoch, current.timer.metrics())

    def settle(self, timer: Timer) -> dict[str, float]:
        """Wait for a batch generating ahead: the weights may change only after it. ``timing_s/overlap``: how long
        its generation ran alongside this step's passes (since :meth:`take`)."""
        if self.ahead is None:
            return {}
        end, overlap = time.monotonic(), 0.0
        if self.ahead.busy:
            with timer("gen_wait"):
                self.pending = self.ahead.wait(self.admit_engines)
            overlap = overlap_seconds(self.pending, self.passes_started, end)
        return {"timing_s/overlap": overlap}

    def admit_engines(self) -> None:
        """While the driver waits for a generation ahead: engines that joined an empty pool get the weights (only
        the driver's main thread may send them)."""
        if self.generation.engines is not None:
            self.generation.engines.admit_if_empty()

    def resume_position(self) -> dict[str, Any] | None:
        """The loader position a checkpoint keeps when a batch was drawn ahead but not trained: the one before it,
        so a resumed run generates it again (with the weights of the checkpoint). None: the loader's own."""
        if self.stream is not None:
            return self.stream.resume_position()
        return self.pending.drawn.position if self.pending else None

    # --- the trainer's passes and the advantages -------------------------------------------------------------------

    def complete(self, scored: Scored, timer: Timer) -> Experience:
        rows = scored.rows
        plan, algo = self.plan, self.spec.algorithm
        metrics = {**scored.metrics, **(self.agent.metrics() if self.agent is not None else {})}
        old_log_probs = entropy = ref_log_probs = values = None
        if not plan.old_log_probs_from_update:
            with timer("old_log_prob"):
                out = self.actor.call("compute_log_probs", pass_rows(rows))
                old_log_probs, entropy = out["log_probs"], out.get("entropy")
        if plan.uses_reference:
            with timer("ref"):
                ref_log_probs = self.actor.call("compute_ref_log_probs", pass_rows(rows))["ref_log_probs"]
        if self.critic is not None:
            with timer("values"):
                values = self.critic.call("compute_values", pass_rows(rows))["values"]
        with timer("adv"):
            mask = rows["response_mask"].float()
            token_rewards, mean_kl = self.token_rewards(scored, old_log_probs, ref_log_probs)
            if mean_kl is not None:
                metrics["actor/reward_kl_penalty"] = mean_kl
                metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
                self.kl_ctrl.update(mean_kl, len(scored.samples))
            advantages, returns = compute_advantages(
                algo.advantage_estimator,
                token_rewards,
                mask,
                values=values,
                group_ids=scored.group_ids,
                gamma=algo.gamma,
                lam=algo.lam,
                norm_adv_by_std=algo.norm_adv_by_std,
                reward_baselines=scored.reward_baselines,
            )
            check_finite_advantages(advantages, mask, scored.scores, algo.advantage_estimator)
        return Experience(
            prompts=rows["prompts"],
            prompt_mask=rows["prompt_mask"],
            responses=rows["responses"],
            response_mask=rows["response_mask"],
            response_attention_mask=rows.get("response_attention_mask"),
            rollout_log_probs=rows.get("rollout_log_probs"),
            weight_version=rows.get("weight_version"),
            samples=scored.samples,
            group_ids=scored.group_ids,
            scores=scored.scores,
            token_rewards=token_rewards,
            advantages=advantages,
            returns=returns,
            old_log_probs=old_log_probs,
            entropy=entropy,
            ref_log_probs=ref_log_probs,
            values=values,
            metrics={**metrics, **scored.extra_metrics()},
        )

    def token_rewards(
        self, scored: Scored, old_log_probs: Tensor | None, ref_log_probs: Tensor | None
    ) -> tuple[Tensor, float | None]:
        """The scores on each response's last token, less β·KL(old ‖ reference) per token with
        ``algorithm.kl.inReward`` (β the controller's value now), and that batch KL (None without)."""
        kl = self.spec.algorithm.kl
        response_mask = scored.rows["response_mask"]
        token_scores = place_at_last_token(scored.scores, response_mask)
        if not kl.in_reward:
            return token_scores, None
        assert old_log_probs is not None and ref_log_probs is not None, "the plan computes both with kl.inReward"
        return apply_kl_in_reward(
            token_scores, old_log_probs, ref_log_probs, response_mask.float(), coef=self.kl_ctrl.value, kind=kl.type
        )

    def final_rewards(self, part: Scored) -> Tensor:
        """A generation round's sequence rewards after the KL penalty, for dynamic sampling's ``seq_final_reward``:
        with ``kl.inReward`` this round's old and reference log-probs are computed for the filter only (the
        controller moves once per step, in :meth:`complete`)."""
        if not self.spec.algorithm.kl.in_reward:
            return part.scores
        rows = pass_rows(part.rows)
        old = self.actor.call("compute_log_probs", rows)["log_probs"]
        ref = self.actor.call("compute_ref_log_probs", rows)["ref_log_probs"]
        token_rewards, _ = self.token_rewards(part, old, ref)
        return (token_rewards * part.rows["response_mask"].float()).sum(-1)

    # --- what the step reports -------------------------------------------------------------------------------------

    def metrics(self, exp: Experience, *, policy_version: int) -> dict[str, float]:
        """The experience's data metrics (scores, rewards, lengths, entropy, KL) and its staleness: how many steps
        behind ``policy_version`` (the step whose weights the update started from) its generating weights were."""
        correction = self.spec.algorithm.rollout_correction
        data = data_metrics(
            exp,
            max_response_length=self.spec.data.max_response_length,
            kl_coef=self.kl_coef(),
            rollout_is_threshold=correction.threshold if correction.enabled else None,
        )
        staleness = staleness_metrics(exp.weight_version, policy_version=policy_version)
        if self.generation.engines is not None:
            staleness["rollout/engines"] = float(self.generation.engines.size)
        allowed = self.spec.rollout.staleness_limit
        if "rollout/staleness" in staleness and not 0 <= staleness["rollout/staleness"] <= allowed:
            raise RuntimeError(  # the loop's order rules it out: weights reached the engines out of step
                f"step {policy_version + 1} trained on a batch generated by weights of step "
                f"{staleness['rollout/weight_version']:.0f}, {staleness['rollout/staleness']:.0f} step(s) behind "
                f"the policy (at most {allowed} with rollout.overlap {self.spec.rollout.overlap})"
            )
        return {**data, **staleness}

    def kl_coef(self) -> float | None:
        kl = self.spec.algorithm.kl
        if kl.loss.enabled:
            return kl.loss.coef
        return self.kl_ctrl.value if kl.in_reward else None

    def validate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Mean score per data source of ``rollout.val.rolloutN`` responses per validation prompt."""
        n = self.spec.rollout.val.rollout_n
        rows = self.generation.generate([p.input_ids for p in prompts], n, self.plan.val_sampling)
        samples = [p for p in prompts for _ in range(n)]
        scores, _ = self.scorer.raw_scores(samples, rows)  # validation reports the reward unshaped
        by_source: dict[str, list[float]] = {}
        for s, score in zip(samples, scores.tolist(), strict=True):
            by_source.setdefault(s.data_source, []).append(score)
        return {f"val-core/{src}/reward/mean@{n}": float(np.mean(v)) for src, v in by_source.items()}

    def close(self) -> None:
        """Wait for a generation still running ahead (it holds Ray calls on the engines)."""
        if self.ahead is not None:
            self.ahead.close()
        if self.stream is not None:
            self.stream.close()


def check_finite_advantages(advantages: Tensor, mask: Tensor, scores: Tensor, estimator: str) -> None:
    """Raise :class:`NonFiniteRewardError` when a response's advantages (``(batch, response_len)``, where ``mask``
    is 1) are not finite: scores within MAX_ABS_SCORE keep them finite; values (gae) or the KL penalty may not."""
    bad = ~torch.isfinite(advantages.masked_fill(mask == 0, 0)).all(-1)
    if bad.any():
        raise NonFiniteRewardError(
            f"the {estimator} advantages of {int(bad.sum())} of {len(bad)} responses are not finite (first: response "
            f"{int(bad.nonzero()[0])}, scored {scores[bad][0].item()}); the step would train on NaN"
        )
