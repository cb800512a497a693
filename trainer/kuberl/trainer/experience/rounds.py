"""One step's scored responses: generate → score, repeated by dynamic sampling, plus ReMax's greedy baselines.

A generation round samples ``rolloutN`` responses for each prompt of a loader batch and scores them. With
``algorithm.filterGroups`` the rounds repeat, a new prompt batch from the loader each time, until a
:class:`~kuberl.trainer.algorithms.dapo.DynamicSampler` holds ``trainBatchSize`` groups whose filter metric varies;
the step then trains on exactly those ``trainBatchSize × rolloutN`` rows. For ``remax`` each round also scores one
greedy response per prompt, the baseline of its sampled responses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from kuberl.api import RLJobSpec
from kuberl.trainer.algorithms.dapo import DynamicSampler
from kuberl.trainer.data.prompts import Prompt, PromptLoader
from kuberl.trainer.experience.batch import Scored
from kuberl.trainer.experience.generation import Generation
from kuberl.trainer.experience.scoring import Scorer
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.plan.execution import Sampling

FinalRewards = Callable[[Scored], Tensor]
"""A round's sequence rewards after the KL penalty (``filterGroups.metric: seq_final_reward``)."""


@dataclass
class Response:
    """One response's per-row values, carried through the dynamic sampler alongside its rows."""

    sample: Prompt
    score: float
    extra: dict[str, float]
    baseline: float | None


class Rounds:
    def __init__(
        self,
        spec: RLJobSpec,
        *,
        generation: Generation,
        scorer: Scorer,
        loader: PromptLoader,
        sampling: Sampling,
        final_rewards: FinalRewards,
    ) -> None:
        self.spec = spec
        self.generation = generation
        self.scorer = scorer
        self.loader = loader
        self.sampling = sampling
        self.final_rewards = final_rewards

    def collect(self, prompts: list[Prompt], timer: Timer) -> Scored:
        """One round, or dynamic sampling's rounds until ``trainBatchSize`` groups vary."""
        filter_groups = self.spec.algorithm.filter_groups
        first = self.round(prompts, timer)
        if not filter_groups.enabled:
            return first
        sampler = DynamicSampler[Response](
            target_groups=len(prompts), max_rounds=filter_groups.max_num_gen_batches, pad_id=self.generation.pad_id
        )
        generated: list[Tensor] = []
        part = first
        while True:
            generated.append(part.scores)
            sampler.add(part.rows, responses(part), part.group_ids, self.filter_metric(part, filter_groups.metric))
            if sampler.full:
                break
            part = self.round(self.loader.next_batch(), timer)
        rows, kept, group_ids = sampler.batch()
        return Scored(
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

    def round(self, prompts: list[Prompt], timer: Timer) -> Scored:
        """``rolloutN`` sampled responses per prompt, scored (and their greedy baselines for remax)."""
        n = self.spec.batch.rollout_n
        ids = [p.input_ids for p in prompts]
        with timer("gen"):
            rows = self.generation.generate(ids, n, self.sampling)
        samples = [p for p in prompts for _ in range(n)]
        with timer("reward"):
            scores, extra = self.scorer.score(samples, rows)
        baselines = None
        if self.spec.algorithm.advantage_estimator == "remax":
            with timer("gen_max"):
                greedy = self.generation.generate(ids, 1, replace(self.sampling, temperature=0.0))
            with timer("reward"):
                baselines = self.scorer.score(prompts, greedy)[0].repeat_interleave(n)
        group_ids = torch.arange(len(prompts)).repeat_interleave(n)
        return Scored(rows, samples, group_ids, scores, extra, baselines)

    def filter_metric(self, part: Scored, metric: str) -> Tensor:
        """The per-response value dynamic sampling compares within each group (``algorithm.filterGroups.metric``)."""
        if metric == "seq_reward":
            return part.scores
        if metric == "seq_final_reward":
            return self.final_rewards(part)
        values = part.extra.get(metric)
        if values is None or bool(values.isnan().any()):
            known = ", ".join(["seq_reward", "seq_final_reward", *sorted(part.extra)])
            raise ValueError(
                f"algorithm.filterGroups.metric {metric!r} is not a number the reward returns for every response; "
                f"known here: {known} (a reward function's dict output adds its numeric keys)"
            )
        return values


def responses(part: Scored) -> list[Response]:
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
