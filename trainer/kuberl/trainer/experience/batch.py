"""What the experience stage hands on: :class:`Scored` (generated and scored responses, what a generation round and
dynamic sampling produce, and what the overlapped loop generates ahead) and :class:`Experience` (one step's
complete training batch, every value the update and the metrics read, by name).

Shapes: ``B`` rows (``rolloutN`` consecutive rows per prompt), ``P`` prompt and ``R`` response columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from kuberl.trainer.data.prompts import Prompt
from kuberl.trainer.model.microbatch import Rows

PASS_FIELDS = ("prompts", "prompt_mask", "responses", "response_mask", "response_attention_mask")
"""What a forward-only pass and every update reads of the rows (the last one only for multi-turn rows)."""


@dataclass
class Scored:
    """Generated responses with their scores: ``rows`` as the engines returned them (``prompts``, ``prompt_mask``,
    ``responses``, ``response_mask``, and where present ``response_attention_mask``, ``rollout_log_probs``,
    ``weight_version``), ``group_ids`` 0..G−1."""

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
class Experience:
    """One step's training batch. The fields an update reads are named by :attr:`ExecutionPlan.actor_update_fields`
    and :attr:`~kuberl.trainer.plan.execution.ExecutionPlan.critic_update_fields`; :meth:`rows` gathers them."""

    prompts: Tensor
    """``(B, P)`` prompt ids, left-padded."""
    prompt_mask: Tensor
    responses: Tensor
    """``(B, R)`` response ids, right-padded."""
    response_mask: Tensor
    """``(B, R)`` 1 on the tokens the policy generated: what the losses see."""
    response_attention_mask: Tensor | None
    """``(B, R)`` 1 on every real response token, tool outputs included (multi-turn rows); None when it equals
    ``response_mask``."""
    rollout_log_probs: Tensor | None
    """``(B, R)`` the engine's log-probs of the sampled tokens (``rollout.calculateLogProbs``)."""
    weight_version: Tensor | None
    """``(B,)`` the trainer step of the weights each row was generated with, where the engines stamp it."""
    samples: list[Prompt]
    group_ids: Tensor
    scores: Tensor
    """``(B,)`` sequence scores."""
    token_rewards: Tensor
    """``(B, R)`` the score on each response's last token, less the KL penalty with ``algorithm.kl.inReward``."""
    advantages: Tensor
    returns: Tensor
    old_log_probs: Tensor | None
    """``(B, R)`` the policy's log-probs before the update; from the update's own forward (read back after it)
    when :attr:`~kuberl.trainer.plan.execution.ExecutionPlan.old_log_probs_from_update`."""
    entropy: Tensor | None
    """``(B, R)`` the policy's entropy, when computed."""
    ref_log_probs: Tensor | None
    values: Tensor | None
    """``(B, R)`` the critic's values (gae)."""
    metrics: dict[str, float]
    """What making it reported: reward extras, the reward's KL penalty, dynamic sampling, the agent loop."""

    def rows(self, fields: tuple[str, ...]) -> Rows:
        """The pass fields and ``fields``, as the rows a worker receives (fields that are None left out)."""
        out: Rows = {}
        for name in (*PASS_FIELDS, *fields):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @property
    def num_tokens(self) -> float:
        """Prompt and response tokens of the batch."""
        return float(self.response_mask.sum() + self.prompt_mask.sum())


def pass_rows(rows: Rows) -> Rows:
    """The fields of generated rows a forward-only pass reads."""
    return {k: rows[k] for k in PASS_FIELDS if k in rows}


def place_at_last_token(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Sequence scores as token rewards on each response's last valid token, ``(B, R)`` (verl's placement)."""
    token_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    positions = torch.arange(1, response_mask.shape[1] + 1)
    last = ((response_mask > 0) * positions).argmax(-1)  # the last policy token, also with tool outputs after it
    token_scores[torch.arange(len(scores)), last] = scores
    return token_scores
