"""Rollout backends behind one interface: ``hf`` (transformers generate, CPU and tests) and ``vllm`` (GPU; colocated
with the actor or separate, see :mod:`kuberl.trainer.plan.layout`)."""

from kuberl.trainer.rollout.base import ColocatedRollout, Rollout, RolloutBatch, make_rollout

__all__ = ["ColocatedRollout", "Rollout", "RolloutBatch", "make_rollout"]
