"""One step's training batch: generate → score → overlong penalty, repeated by dynamic sampling, plus ReMax's
greedy baselines.

A generation round samples ``rolloutN`` responses for each prompt of a loader batch and scores them; DAPO's
overlong penalty (``reward.overlongBuffer``) is added to the scores right away, so every metric and filter sees
the shaped reward. With ``algorithm.filterGroups`` the rounds repeat, a new prompt batch from the loader each time,
until a :class:`~kuberl.trainer.algorithms.dapo.DynamicSampler` holds ``trainBatchSize`` groups whose filter metric varies;
the step then trains on exactly those ``trainBatchSize × rolloutN`` rows. For ``remax`` each round also scores one
greedy response per prompt, the baseline of its sampled responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from kuberl.api import RLJobSpec
from kuberl.trainer.algorithms.dapo import DynamicSampler, overlong_penalty
from kuberl.trainer.algorithms.kl import KLController, apply_kl_in_reward
from kuberl.trainer.data.prompts import Prompt, PromptLoader
from kuberl.trainer.model.microbatch import Rows
from kuberl.trainer.observe.metrics import Timer

OVERLONG_KEY = "overlong_penalty"
"""The reward extra holding each response's overlong penalty (already part of its score)."""


class Driver(Protocol):
    """What collecting needs of the trainer's driver (:class:`kuberl.trainer.run.Trainer` is one)."""

    spec: RLJobSpec
    loader: PromptLoader
    kl_ctrl: KLController

    @property
    def actor(self) -> Any: ...

    @property
    def pad_id(self) -> int: ...

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> Rows: ...

    def train_sampling(self) -> dict[str, Any]: ...

    def score(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]: ...

    def forward_all(self, group: Any, method: str, rows: Rows) -> dict[str, Tensor]: ...


@dataclass
class Rollouts:
    """Scored responses, ``B`` of them: ``rolloutN`` consecutive rows per prompt, ``group_ids`` 0..G−1."""

    rows: Rows
    samples: list[Prompt]
    group_ids: Tensor
    scores: Tensor
    """``(B,)`` reward scores, overlong penalty included."""
    extra: dict[str, Tensor]
    """``(B,)`` per key: the reward function's extra numbers (NaN where a response lacks the key), and
    ``overlong_penalty`` when shaping is on."""
    reward_baselines: Tensor | None = None
    """``(B,)`` the score of the prompt's greedy response (remax only)."""
    metrics: dict[str, float] = field(default_factory=dict)

    def extra_metrics(self) -> dict[str, float]:
        return {f"reward_extra/{k}/mean": float(v.nanmean()) for k, v in self.extra.items()}


@dataclass
class Response:
    """One response's per-row values, carried through the dynamic sampler alongside its rows."""

    sample: Prompt
    score: float
    extra: dict[str, float]
    baseline: float | None


def collect_batch(driver: Driver, prompts: list[Prompt], timer: Timer) -> Rollouts:
    """The step's scored responses: one round, or dynamic sampling's rounds until ``trainBatchSize`` groups vary."""
    filter_groups = driver.spec.algorithm.filter_groups
    first = generate_round(driver, prompts, timer)
    if not filter_groups.enabled:
        return first
    sampler = DynamicSampler[Response](
        target_groups=len(prompts), max_rounds=filter_groups.max_num_gen_batches, pad_id=driver.pad_id
    )
    generated: list[Tensor] = []
    part = first
    while True:
        generated.append(part.scores)
        sampler.add(part.rows, responses(part), part.group_ids, filter_metric(driver, part, filter_groups.metric))
        if sampler.full:
            break
        part = generate_round(driver, driver.loader.next_batch(), timer)
    rows, kept, group_ids = sampler.batch()
    return Rollouts(
        rows=rows,
        samples=[r.sample for r in kept],
        group_ids=group_ids,
        scores=torch.tensor([r.score for r in kept], dtype=torch.float32),
        extra={
            k: torch.tensor([r.extra.get(k, float("nan")) for r in kept], dtype=torch.float32)
            for k in sorted({k for r in kept for k in r.extra})
        },
        reward_baselines=(
            torch.tensor([r.baseline for r in kept], dtype=torch.float32)
            if first.reward_baselines is not None
            else None
        ),
        metrics={
            **sampler.metrics(),
            # the mean over every generated response: unlike critic/score/mean it is not raised by the filter
            "dynamic_sampling/generated_score/mean": float(torch.cat(generated).mean()),
        },
    )


def generate_round(driver: Driver, prompts: list[Prompt], timer: Timer) -> Rollouts:
    """``rolloutN`` sampled responses per prompt, scored (and their greedy baselines for remax)."""
    n = driver.spec.batch.rollout_n
    with timer("gen"):
        rows = driver.generate([p.input_ids for p in prompts], n, driver.train_sampling())
    samples = [p for p in prompts for _ in range(n)]
    with timer("reward"):
        scores, extra = shaped_scores(driver, samples, rows)
    baselines = None
    if driver.spec.algorithm.advantage_estimator == "remax":
        with timer("gen_max"):
            greedy = driver.generate([p.input_ids for p in prompts], 1, {**driver.train_sampling(), "temperature": 0.0})
        with timer("reward"):
            baselines = shaped_scores(driver, prompts, greedy)[0].repeat_interleave(n)
    group_ids = torch.arange(len(prompts)).repeat_interleave(n)
    return Rollouts(rows, samples, group_ids, scores, extra, baselines)


def shaped_scores(driver: Driver, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
    """The reward scores with DAPO's overlong penalty added (and recorded as an extra) when it is configured."""
    scores, extra = driver.score(samples, rows)
    buffer = driver.spec.reward.overlong_buffer
    if buffer is None:
        return scores, extra
    penalty = overlong_penalty(
        rows["response_mask"].sum(-1),
        max_response_length=driver.spec.data.max_response_length,
        buffer_length=buffer.length,
        penalty_factor=buffer.penalty_factor,
    )
    return scores + penalty, {**extra, OVERLONG_KEY: penalty}


def filter_metric(driver: Driver, part: Rollouts, metric: str) -> Tensor:
    """The per-response value dynamic sampling compares within each group (``algorithm.filterGroups.metric``).

    ``seq_final_reward`` with ``kl.inReward`` needs this round's old and reference log-probs: they are computed
    here for the filter only, with the KL coefficient in use now (the controller moves once per step, later).
    """
    if metric == "seq_reward":
        return part.scores
    if metric == "seq_final_reward":
        kl = driver.spec.algorithm.kl
        if not kl.in_reward:
            return part.scores
        mask = part.rows["response_mask"].float()
        old = driver.forward_all(driver.actor, "compute_log_probs", part.rows)["log_probs"]
        ref = driver.forward_all(driver.actor, "compute_ref_log_probs", part.rows)["ref_log_probs"]
        token_rewards, _ = apply_kl_in_reward(
            place_at_last_token(part.scores, part.rows["response_mask"]),
            old,
            ref,
            mask,
            coef=driver.kl_ctrl.value,
            kind=kl.type,
        )
        return (token_rewards * mask).sum(-1)
    values = part.extra.get(metric)
    if values is None or bool(values.isnan().any()):
        known = ", ".join(["seq_reward", "seq_final_reward", *sorted(part.extra)])
        raise ValueError(
            f"algorithm.filterGroups.metric {metric!r} is not a number the reward returns for every response; "
            f"known here: {known} (a reward function's dict output adds its numeric keys)"
        )
    return values


def responses(part: Rollouts) -> list[Response]:
    extra = {k: v.tolist() for k, v in part.extra.items()}
    baselines = part.reward_baselines.tolist() if part.reward_baselines is not None else None
    return [
        Response(
            sample,
            score,
            {k: v[i] for k, v in extra.items()},
            baselines[i] if baselines is not None else None,
        )
        for i, (sample, score) in enumerate(zip(part.samples, part.scores.tolist(), strict=True))
    ]


def place_at_last_token(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Sequence scores as token rewards on each response's last valid token, ``(B, R)`` (verl's placement)."""
    token_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    positions = torch.arange(1, response_mask.shape[1] + 1)
    last = ((response_mask > 0) * positions).argmax(-1)  # the last policy token, also with tool outputs after it
    token_scores[torch.arange(len(scores)), last] = scores
    return token_scores
