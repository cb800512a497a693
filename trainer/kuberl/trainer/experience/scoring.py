"""One score per response, by the one reward path the spec chose (decided once, at construction):

- the agent loop's environment (``rollout.agent.environment``): its reward per trajectory;
- a reward model (``reward.model``): the reward-model ranks score ``prompt + response`` in the model's chat template;
- a reward function (``reward.function``, builtin or the user's in its own process): the decoded response, with the
  trajectory under ``extra_info["trajectory"]`` for multi-turn rows.

DAPO's overlong penalty (``reward.overlongBuffer``) is added to every score and recorded as the extra
:data:`OVERLONG_KEY`, so that every metric and filter sees the shaped reward.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from kuberl.api import RLJobSpec
from kuberl.trainer.algorithms.dapo import overlong_penalty
from kuberl.trainer.data.prompts import Prompt
from kuberl.trainer.model.loading import load_tokenizer
from kuberl.trainer.model.microbatch import Rows
from kuberl.trainer.rewards.functions import SCORE_DTYPE, RewardInput, RewardTimeoutError
from kuberl.trainer.rewards.process import RewardScorer, make_scorer
from kuberl.trainer.rewards.scoring import RewardPolicy, check_finite

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.workers.group import WorkerGroup

OVERLONG_KEY = "overlong_penalty"
"""The reward extra holding each response's overlong penalty (already part of its score)."""


class Scorer:
    """Scores generated rows; :meth:`close` stops a reward function's process.

    Made before the workers start, so that a reward function that does not load fails the run at once;
    :meth:`connect` then hands it the agent loop and the reward-model ranks.
    """

    def __init__(self, spec: RLJobSpec, *, tokenizer: Any) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.agent: AgentLoop | None = None
        self.reward_model: WorkerGroup | None = None
        reward = spec.reward
        self.rm_tokenizer = load_tokenizer(reward.model.path) if reward.model else None
        policy = RewardPolicy(reward.timeout_seconds, reward.on_error, reward.max_error_fraction)
        self.reward_fn: RewardScorer | None = None if reward.model else make_scorer(reward.function, policy)
        self.lock = threading.Lock()

    def connect(self, *, agent: AgentLoop | None, reward_model: WorkerGroup | None) -> None:
        self.agent = agent
        self.reward_model = reward_model

    def score(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
        """One score per response (overlong penalty included), and the reward's extra numbers per response (NaN
        where missing)."""
        scores, extra = self.raw_scores(samples, rows)
        buffer = self.spec.reward.overlong_buffer
        if buffer is None:
            return scores, extra
        penalty = overlong_penalty(
            rows["response_mask"].sum(-1),
            max_response_length=self.spec.data.max_response_length,
            buffer_length=buffer.length,
            penalty_factor=buffer.penalty_factor,
        )
        return scores + penalty, {**extra, OVERLONG_KEY: penalty}

    def raw_scores(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
        with self.lock:  # asynchronous generation scores on its own thread, validation on the driver's
            return self._raw_scores(samples, rows)

    def _raw_scores(self, samples: list[Prompt], rows: Rows) -> tuple[Tensor, dict[str, Tensor]]:
        sources = [s.data_source for s in samples]
        agent = self.agent
        if agent is not None and agent.agent.environment is not None:
            scores = agent.environment_scores().to(SCORE_DTYPE)
            check_finite(scores, sources, f"rollout.agent.environment {agent.agent.environment.class_path}")
            return scores, {}
        texts = (
            agent.texts()
            if agent is not None
            else self.tokenizer.batch_decode(
                [ids[m.bool()] for ids, m in zip(rows["responses"], rows["response_mask"], strict=True)],
                skip_special_tokens=True,
            )
        )
        if self.reward_model is not None:
            return self.reward_model_scores(samples, texts, sources), {}
        inputs = [
            RewardInput(
                s.data_source,
                t,
                s.ground_truth,
                s.extra_info if agent is None else {**s.extra_info, "trajectory": agent.trajectory_info(i)},
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

    def reward_model_scores(self, samples: list[Prompt], texts: list[str], sources: list[str]) -> Tensor:
        """The reward model's scores within reward.timeoutSeconds: a reward model that hangs (or is far too slow)
        ends the job as a permanent failure instead of holding the GPUs."""
        import ray

        model = self.spec.reward.model
        assert self.reward_model is not None and self.rm_tokenizer is not None and model is not None
        full = [
            self.rm_tokenizer.apply_chat_template([*s.raw_prompt, {"role": "assistant", "content": t}], tokenize=False)
            for s, t in zip(samples, texts, strict=True)
        ]
        timeout = self.spec.reward.timeout_seconds
        try:
            results: list[float] = self.reward_model.call("score", full, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RewardTimeoutError(
                f"reward.model {model.path} did not score {len(full)} responses within {timeout:g} s "
                "(reward.timeoutSeconds): a hung or far too slow reward model. Raise reward.timeoutSeconds if it is "
                "only slow"
            ) from None
        scores = torch.tensor(results, dtype=SCORE_DTYPE)
        check_finite(scores, sources, f"reward.model {model.path}")
        return scores

    def close(self) -> None:
        if self.reward_fn is not None:
            self.reward_fn.close()
