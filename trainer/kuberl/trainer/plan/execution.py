"""The execution plan: every derived decision of a run, made once on the driver, after Ray is up and before any
worker starts, and handed to the cluster, the workers and the engines.

The API's :class:`~kuberl.api.batching.BatchPlan` holds what the spec alone decides (rows, ranks, optimizer steps);
this adds how each role cuts its rows into micro-batches, where the rollout runs (which needs the Ray cluster), the
engine's arguments, each role's share of a rank's resources, threads per rank, sampling, and which experience
fields each update reads. Nothing re-derives them from the spec (torchtitan's ``ParallelDims`` habit; verl
re-normalises its config inside every worker). ``docs/architecture.md`` lists each derived value and where it is
computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kuberl.api.batching import BatchPlan, plan_batches
from kuberl.api.memory import GIB, GPU, gpu_of, plan_memory, token_budget
from kuberl.api.memory_admission import plan_refusal
from kuberl.api.spec import RLJobSpec
from kuberl.trainer.algorithms.losses import PolicyLossConfig
from kuberl.trainer.plan.layout import ClusterFacts, PlacementError, RolloutLayout, plan_rollout_layout


@dataclass(frozen=True)
class MicroBatching:
    """How one rank cuts its rows for one role: ``size`` rows per micro-batch, or, with dynamic batching
    (``size`` None), micro-batches of at most ``max_tokens`` prompt + response tokens."""

    size: int | None
    max_tokens: int | None


@dataclass(frozen=True)
class EngineArgs:
    """The rollout engine's arguments, the same for a colocated engine and every separate one; each engine reads
    those it takes (``hf``: the path, the seed, ``max_num_seqs`` as its batch size, ``calculate_log_probs``)."""

    name: str
    """rollout.engine: its entry in ``kuberl.trainer.rollout.registry``."""
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
    partial_rollouts: bool = False
    """rollout.partialRollouts: a separate engine stops its generation when new weights arrive (engines whose
    capabilities say they can; vLLM's do not, so its keyword arguments leave it out)."""
    load_format: str = "dummy"
    """The trainer sends the weights before the first rollout: no checkpoint read."""

    def kwargs(self) -> dict[str, Any]:
        """Everything but the name, ``model_path`` and ``partial_rollouts``, as keyword arguments of the vLLM engine
        classes."""
        out = asdict(self)
        del out["name"], out["model_path"], out["partial_rollouts"]
        return out


@dataclass(frozen=True)
class RoleShares:
    """The share of a trainer rank's placement-group bundle each role's Ray actor requests: the roles of rank ``r``
    share bundle ``r`` and take turns (verl's colocated roles); Ray only needs them to fit in one bundle together.
    A separate engine sharing a trainer GPU takes ``rollout``."""

    actor: float = 0.4
    critic: float = 0.25
    reward_model: float = 0.15
    rollout: float = 0.2

    def of(self, role: str) -> float:
        share: float = getattr(self, role)
        return share


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
    ranks: int
    """Trainer ranks: one per trainer GPU (or CPU process), each in one bundle of the trainer's placement group."""
    rank_bundle: dict[str, float]
    """Ray resources of one trainer rank's bundle: one CPU, and one GPU on CUDA."""
    threads: int
    """torch threads per process of a rank: the pool's CPUs per GPU on a joined cluster, else the machine's CPUs
    over the ranks."""
    shares: RoleShares
    actor_update: MicroBatching
    """The policy's update (batch.ppoMicroBatchSizePerGPU)."""
    log_prob: MicroBatching
    """Forward-only passes of the policy and the reference (batch.logProbMicroBatchSizePerGPU)."""
    critic_update: MicroBatching
    """The value model's update (critic.ppoMicroBatchSizePerGPU, else the actor's)."""
    critic_forward: MicroBatching
    """Forward-only values (batch.logProbMicroBatchSizePerGPU, else the critic's update size)."""
    rollout: RolloutLayout
    engine: EngineArgs
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
    policy_loss: PolicyLossConfig
    """The registered policy loss and its knobs (algorithm, algorithm.policyLoss)."""
    old_log_probs_from_update: bool
    """Each batch meets the policy exactly once (one mini-batch, one epoch) and nothing before the update reads the
    old log-probs (no KL in the reward): they are then the update's own forward, detached (the ratio is 1 by
    construction), instead of a separate forward pass over the same weights."""


def plan_execution(spec: RLJobSpec, cluster: ClusterFacts | None = None) -> ExecutionPlan:
    """The plan of ``spec`` on the Ray cluster ``cluster`` describes (None: a machine of its own, as for a worker
    group driven alone in a test). Where the trainer GPU is known, its memory plan must fit it and chooses the token
    budget the spec leaves out. Assumes ``spec`` passed validation."""
    cluster = cluster or ClusterFacts()
    batch = plan_batches(spec)
    dynamic = spec.batch.dynamic_batch_size
    layout = plan_rollout_layout(spec, batch, cluster)
    tokens = checked_token_budget(spec, layout, cluster.gpu)
    critic_size = None
    if not dynamic.enabled:
        own = spec.critic.ppo_micro_batch_size_per_gpu if spec.critic else None
        critic_size = own or batch.micro_batch_size_per_gpu
    forward_size = None if dynamic.enabled else spec.batch.log_prob_micro_batch_size_per_gpu
    r, algo, pool = spec.rollout, spec.algorithm, spec.cluster.trainer
    old_log_probs_from_update = batch.optimizer_steps_per_step == 1 and not algo.kl.in_reward
    sample_val = r.val.do_sample
    if cluster.joined:
        threads = max(1, int(parse_cpu(pool.cpu)) // pool.gpus_per_node)
    else:
        threads = max(1, cluster.local_cpus // batch.trainer_gpus)
    return ExecutionPlan(
        batch=batch,
        ranks=batch.trainer_gpus,
        rank_bundle={"CPU": 1.0, "GPU": 1.0} if spec.cluster.device == "cuda" else {"CPU": 1.0},
        threads=threads,
        shares=RoleShares(),
        actor_update=MicroBatching(batch.micro_batch_size_per_gpu, tokens),
        log_prob=MicroBatching(batch.log_prob_micro_batch_size_per_gpu, tokens),
        critic_update=MicroBatching(critic_size, tokens),
        critic_forward=MicroBatching(forward_size or critic_size, tokens),
        rollout=layout,
        engine=EngineArgs(
            name=r.engine,
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
            partial_rollouts=r.partial_rollouts,
        ),
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
        policy_loss=PolicyLossConfig.from_spec(algo),
        old_log_probs_from_update=old_log_probs_from_update,
    )


def checked_token_budget(spec: RLJobSpec, layout: RolloutLayout, gpu: GPU | None) -> int | None:
    """The micro-batch token budget (None without dynamic batching), chosen from the memory plan when the spec leaves
    it out; a job whose plan does not fit ``gpu`` is refused here, with the plan, before anything is loaded."""
    if gpu is None or spec.cluster.device != "cuda":
        return token_budget(spec, None, None, None)
    from kuberl.trainer.model.shape import checked_model_shape

    plan = plan_memory(spec, checked_model_shape(spec), gpu, layout=layout.kind)
    refusal = plan_refusal(plan)
    if refusal is not None:
        raise PlacementError(refusal)
    return plan.token_budget


def describe_run(name: str, spec: RLJobSpec, total_steps: int, data: str) -> str:
    """The run's first line: its ranks, rows and micro-batching as the spec decides them (:func:`plan_batches`),
    its steps, and ``data`` (what :meth:`~kuberl.trainer.data.prompts.RunPrompts.summary` says of the prompts)."""
    p = plan_batches(spec)
    accumulated = f" × {p.gradient_accumulation_steps} accumulated" if p.gradient_accumulation_steps else ""
    return (
        f"RLJob {name}: {p.trainer_gpus} {spec.cluster.device} trainer rank(s), {p.responses_per_step} responses/step, "
        f"{p.optimizer_steps_per_step} optimizer step(s)/step, micro-batch "
        f"{p.micro_batch_size_per_gpu or 'by token budget'}{accumulated}; {total_steps} steps, {data}"
    )


def token_budget_line(spec: RLJobSpec, plan: ExecutionPlan, gpu: GPU | None) -> str | None:
    """What the run says about the micro-batch token budget the plan chose because the spec left it out."""
    budget = plan.actor_update.max_tokens
    if budget is None or spec.batch.dynamic_batch_size.max_token_len_per_gpu is not None:
        return None
    chosen = f"the largest the memory plan fits on {gpu.name}" if gpu else "the GPU is unknown, the default"
    return f"micro-batch token budget {budget}: {chosen} (batch.dynamicBatchSize.maxTokenLenPerGPU left out)"


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


def parse_cpu(quantity: str) -> float:
    """A Kubernetes CPU quantity (``"8"``, ``"500m"``) in CPUs."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
