"""Derived batch quantities: what verl's batch settings mean in rows, GPUs and optimizer steps.

The trainer splits its batches by this plan and `kuberl validate` prints it, so users see
the numbers that blog posts tend to confuse (responses vs prompts, global vs per-GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kuberl.api.spec import RLJobSpec


@dataclass(frozen=True)
class BatchPlan:
    trainer_gpus: int
    """Data-parallel ranks of the actor (nodes × gpusPerNode)."""
    rollout_gpus: int
    rollout_engines: int
    """Inference replicas: rollout GPUs / tensorParallelSize."""
    responses_per_step: int
    """trainBatchSize × rolloutN."""
    mini_batches_per_step: int
    optimizer_steps_per_step: int
    """ppoEpochs × mini-batches."""
    responses_per_mini_batch: int
    rows_per_gpu_per_step: int
    rows_per_gpu_per_mini_batch: int
    micro_batch_size_per_gpu: int | None
    """None with dynamic batching (micro-batches cut by maxTokenLenPerGPU)."""
    gradient_accumulation_steps: int | None
    log_prob_micro_batch_size_per_gpu: int | None

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)


def plan_batches(spec: RLJobSpec) -> BatchPlan:
    """Assumes `spec` passed validation (divisibility holds)."""
    batch = spec.batch
    dp = spec.cluster.trainer.nodes * spec.cluster.trainer.gpus_per_node
    pool = spec.rollout_pool or spec.cluster.trainer
    rollout_gpus = pool.nodes * pool.gpus_per_node
    mini_batches = batch.train_batch_size // batch.ppo_mini_batch_size
    rows_per_mini = batch.ppo_mini_batch_size * batch.rollout_n // dp
    dynamic = batch.dynamic_batch_size.enabled
    micro = None if dynamic else batch.ppo_micro_batch_size_per_gpu
    return BatchPlan(
        trainer_gpus=dp,
        rollout_gpus=rollout_gpus,
        rollout_engines=rollout_gpus // spec.rollout.tensor_parallel_size,
        responses_per_step=batch.train_batch_size * batch.rollout_n,
        mini_batches_per_step=mini_batches,
        optimizer_steps_per_step=batch.ppo_epochs * mini_batches,
        responses_per_mini_batch=batch.ppo_mini_batch_size * batch.rollout_n,
        rows_per_gpu_per_step=batch.train_batch_size * batch.rollout_n // dp,
        rows_per_gpu_per_mini_batch=rows_per_mini,
        micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=rows_per_mini // micro if micro else None,
        log_prob_micro_batch_size_per_gpu=None if dynamic else (batch.log_prob_micro_batch_size_per_gpu or micro),
    )
