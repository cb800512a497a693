"""Rollout backends behind one interface: ``hf`` (transformers generate, CPU and tests); ``vllm`` plugs in later."""

from kuberl.trainer.rollout.base import Rollout, RolloutBatch, make_rollout

__all__ = ["Rollout", "RolloutBatch", "make_rollout"]
