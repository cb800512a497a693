"""The execution plan: every derived decision of a run, made once on the driver and handed to the workers.

The API's :class:`~kuberl.api.batching.BatchPlan` holds what the spec alone decides (rows, ranks, optimizer steps);
this adds how each role cuts its rows into micro-batches, where the rollout runs (which needs the Ray cluster) and
the vLLM engine's arguments. Workers and rollouts read these and never derive them from the spec again
(torchtitan's ``ParallelDims`` habit; verl re-normalises its config inside every worker).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kuberl.api.batching import BatchPlan, plan_batches
from kuberl.api.memory import GIB, GPU, does_not_fit, gpu_of, plan_memory, token_budget
from kuberl.api.spec import RLJobSpec
from kuberl.trainer.plan.layout import PlacementError, RolloutLayout, plan_rollout_layout


@dataclass(frozen=True)
class MicroBatching:
    """How one rank cuts its rows for one role: ``size`` rows per micro-batch, or, with dynamic batching
    (``size`` None), micro-batches of at most ``max_tokens`` prompt + response tokens."""

    size: int | None
    max_tokens: int | None


@dataclass(frozen=True)
class EngineArgs:
    """The vLLM engine's arguments, the same for a colocated engine and every separate one."""

    model_path: str
    dtype: str
    seed: int
    """Engine ``i`` (separate) or rank ``r`` (colocated) adds its index."""
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    calculate_log_probs: bool
    load_format: str = "dummy"
    """The trainer sends the weights before the first rollout: no checkpoint read."""

    def kwargs(self) -> dict[str, Any]:
        """Everything but ``model_path``, as keyword arguments of the engine classes."""
        out = asdict(self)
        del out["model_path"]
        return out


@dataclass(frozen=True)
class Sampling:
    """How a generation samples: ``temperature`` 0 is greedy, ``top_k`` −1 disables top-k; ``stop``: strings
    after which an engine may end a response early (the agent loop's tool-call end)."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: tuple[str, ...] = ()

    def kwargs(self) -> dict[str, Any]:
        """As the keyword arguments of :meth:`kuberl.trainer.rollout.base.Rollout.generate`."""
        return asdict(self)


@dataclass(frozen=True)
class ExecutionPlan:
    batch: BatchPlan
    actor_update: MicroBatching
    """The policy's update (batch.ppoMicroBatchSizePerGPU)."""
    log_prob: MicroBatching
    """Forward-only passes of the policy and the reference (batch.logProbMicroBatchSizePerGPU)."""
    critic_update: MicroBatching
    """The value model's update (critic.ppoMicroBatchSizePerGPU, else the actor's)."""
    critic_forward: MicroBatching
    """Forward-only values (batch.logProbMicroBatchSizePerGPU, else the critic's update size)."""
    rollout: RolloutLayout
    engine: EngineArgs | None
    """None with ``rollout.engine: hf``."""
    uses_reference: bool
    """A frozen reference policy is needed (KL in the reward or in the loss)."""
    uses_critic: bool
    """A value model is trained (the gae estimator)."""
    train_sampling: Sampling
    """rollout.temperature, topP, topK; data.maxResponseLength new tokens."""
    val_sampling: Sampling
    """rollout.val's sampling (greedy unless rollout.val.doSample)."""
    actor_update_fields: tuple[str, ...]
    """The :class:`~kuberl.trainer.experience.batch.Experience` fields the actor's update reads besides the rows:
    advantages, the old log-probs (unless from the update), the reference's (KL loss), the engine's (rollout
    correction)."""
    critic_update_fields: tuple[str, ...]
    """What the critic's update reads besides the rows: the old values and the returns."""
    old_log_probs_from_update: bool
    """Each batch meets the policy exactly once (one mini-batch, one epoch) and nothing before the update reads the
    old log-probs (no KL in the reward): they are then the update's own forward, detached (the ratio is 1 by
    construction), instead of a separate forward pass over the same weights."""


def plan_execution(
    spec: RLJobSpec, *, cluster_gpus: float = 0.0, rollout_pool_labelled: bool = False, gpu: GPU | None = None
) -> ExecutionPlan:
    """The plan of ``spec`` on a Ray cluster with ``cluster_gpus`` GPUs (whose rollout pool is labelled or not; see
    :func:`~kuberl.trainer.plan.layout.plan_rollout_layout`) and trainer GPUs ``gpu`` (when known: the memory
    plan must fit it, and chooses the token budget the spec leaves out). Assumes ``spec`` passed validation."""
    batch = plan_batches(spec)
    dynamic = spec.batch.dynamic_batch_size
    layout = plan_rollout_layout(spec, cluster_gpus=cluster_gpus, rollout_pool_labelled=rollout_pool_labelled)
    tokens = checked_token_budget(spec, layout, gpu)
    critic_size = None
    if not dynamic.enabled:
        own = spec.critic.ppo_micro_batch_size_per_gpu if spec.critic else None
        critic_size = own or batch.micro_batch_size_per_gpu
    forward_size = None if dynamic.enabled else spec.batch.log_prob_micro_batch_size_per_gpu
    r = spec.rollout
    algo = spec.algorithm
    old_log_probs_from_update = batch.optimizer_steps_per_step == 1 and not algo.kl.in_reward
    sample_val = r.val.do_sample
    engine = None
    if r.engine == "vllm":
        engine = EngineArgs(
            model_path=spec.model.path,
            dtype=spec.model.dtype,
            seed=spec.data.seed,
            tensor_parallel_size=r.tensor_parallel_size,
            gpu_memory_utilization=r.gpu_memory_utilization,
            max_model_len=spec.data.max_prompt_length + spec.data.max_response_length,
            max_num_batched_tokens=r.max_num_batched_tokens,
            max_num_seqs=r.max_num_seqs,
            enforce_eager=r.enforce_eager,
            calculate_log_probs=r.calculate_log_probs,
        )
    return ExecutionPlan(
        batch=batch,
        actor_update=MicroBatching(batch.micro_batch_size_per_gpu, tokens),
        log_prob=MicroBatching(batch.log_prob_micro_batch_size_per_gpu, tokens),
        critic_update=MicroBatching(critic_size, tokens),
        critic_forward=MicroBatching(forward_size or critic_size, tokens),
        rollout=layout,
        engine=engine,
        uses_reference=algo.kl.in_reward or algo.kl.loss.enabled,
        uses_critic=algo.advantage_estimator == "gae",
        train_sampling=Sampling(r.temperature, r.top_p, r.top_k, spec.data.max_response_length),
        val_sampling=Sampling(
            r.val.temperature if sample_val else 0.0,
            r.val.top_p if sample_val else 1.0,
            r.top_k,
            spec.data.max_response_length,
        ),
        actor_update_fields=(
            "advantages",
            *(() if old_log_probs_from_update else ("old_log_probs",)),
            *(("ref_log_probs",) if algo.kl.loss.enabled else ()),
            *(("rollout_log_probs",) if algo.rollout_correction.enabled else ()),
        ),
        critic_update_fields=("values", "returns"),
        old_log_probs_from_update=old_log_probs_from_update,
    )


def checked_token_budget(spec: RLJobSpec, layout: RolloutLayout, gpu: GPU | None) -> int | None:
    """The micro-batch token budget (None without dynamic batching), chosen from the memory plan when the spec leaves
    it out; a job whose plan does not fit ``gpu`` is refused here, with the plan, before anything is loaded."""
    if gpu is None or spec.cluster.device != "cuda":
        return token_budget(spec, None, None, None)
    from kuberl.trainer.model.shape import model_shape

    plan = plan_memory(spec, model_shape(spec.model.path), gpu, layout=layout.kind)
    if not plan.fits:
        raise PlacementError(does_not_fit("", plan))
    return plan.token_budget


def trainer_gpu(spec: RLJobSpec, *, local: bool) -> GPU | None:
    """The trainer's GPU: the one the pool's node selector names, else (``local``: the Ray cluster is this machine,
    as with ``kuberl run``) this machine's first GPU as NVML reports it; None when neither tells."""
    named = gpu_of(spec)
    if named is not None or not local or spec.cluster.device != "cuda":
        return named
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    except Exception:  # no NVML here: the budget falls back to its old default
        return None
    return GPU(name.decode() if isinstance(name, bytes) else str(name), total / GIB)
