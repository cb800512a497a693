"""Prompts in, responses out: single-turn, or the agent loop over single turns (``rollout.agent``); each turn on the
separate engines (``rollout.placement: separate``, the prompts split over the engines) or on the engines the actor
ranks hold (colocated, the prompts split over the ranks by the ``generate`` method's dispatch mode). Which one is
decided once, from what the cluster started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kuberl.trainer.model.microbatch import Rows, concat
from kuberl.trainer.plan.execution import Sampling

if TYPE_CHECKING:
    from kuberl.trainer.rollout.agent import AgentLoop
    from kuberl.trainer.rollout.engine_pool import EnginePool
    from kuberl.trainer.workers.group import WorkerGroup


class Generation:
    def __init__(self, *, actor: WorkerGroup, engines: EnginePool | None, agent: AgentLoop | None, pad_id: int) -> None:
        self.actor = actor
        self.engines = engines
        self.agent = agent
        self.pad_id = pad_id

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling) -> Rows:
        """``n`` responses per prompt, ``rolloutN`` consecutive rows per prompt."""
        if self.agent is None:
            return self.turn(prompts, n, sampling)
        return self.agent.generate(
            prompts,
            n,
            lambda contexts, budget, stop: self.turn(
                contexts, 1, Sampling(sampling.temperature, sampling.top_p, sampling.top_k, budget, stop)
            ),
        )

    def turn(self, prompts: list[list[int]], n: int, sampling: Sampling) -> Rows:
        if self.engines is not None:
            return self.engines.generate(prompts, n, **sampling.kwargs()).as_rows()
        return concat(self.actor.call("generate", prompts, n, sampling.kwargs()), self.pad_id)
