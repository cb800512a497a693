"""A rank that scores texts with a sequence-classification reward model (``reward.model``)."""

from __future__ import annotations

import torch

from kuberl.api.spec import RLJobSpec
from kuberl.trainer.model import fsdp
from kuberl.trainer.plan.execution import ExecutionPlan
from kuberl.trainer.workers.dispatch import Dispatch, dispatch


class RewardModelWorker:
    """Scores ``prompt + response`` texts with ``reward.model`` (one per rank; the driver splits the texts)."""

    def __init__(self, spec: RLJobSpec, plan: ExecutionPlan, rank: int) -> None:
        from kuberl.trainer.rewards.model import RewardModelScorer

        torch.set_num_threads(plan.threads)
        rm = spec.reward.model
        assert rm is not None
        device = "cuda" if spec.cluster.device == "cuda" else "cpu"
        self.scorer = RewardModelScorer(
            rm.path,
            micro_batch_size=rm.micro_batch_size_per_gpu,
            dtype=fsdp.compute_dtype(spec.model.dtype, device),
            max_length=rm.max_length,
            device=device,
        )
        self.rank = rank

    def init_distributed(self, address: str, port: int) -> None:
        """Scoring is embarrassingly parallel: no process group."""

    def rendezvous(self) -> tuple[str, int]:
        return "", 0

    @dispatch(Dispatch.ITEMS)
    def score(self, texts: list[str]) -> list[float]:
        return self.scorer.score(texts)
