"""Per-GPU memory of an RLJob before launch: what `kuberl plan` prints.

The trainer's layout, as it is built (kuberl.trainer.workers, fsdp, rollout.vllm):
- FSDP2 shards fp32 parameters, fp32 gradients and AdamW's two fp32 moments over the trainer GPUs (4 + 4 + 8
  bytes per parameter ÷ GPUs); a forward or backward gathers one layer at a time in the compute dtype (twice,
  with the next layer prefetched). `paramOffload` keeps parameters (and so gradients and optimizer state) in
  CPU memory; `optimizerOffload` moves the optimizer state to the GPU only for the optimizer step.
- The reference policy (KL on, no LoRA) is a second fp32 FSDP copy without gradients; a critic is a third copy
  with its own gradients and optimizer.
- Activations at one micro-batch of `b` responses of `S = maxPromptLength + maxResponseLength` tokens (or the
  token budget with dynamic batching): with gradient checkpointing each layer keeps its input (`T·h`) and one
  layer is recomputed in full; without, every layer keeps all of its intermediate tensors. The logits are kept
  for the response tokens only, in the compute dtype, with their gradient, and one row at a time in fp32.
- vLLM takes `gpuMemoryUtilization × GPU memory` for its weights (compute dtype, ÷ tensorParallelSize), its
  activation peak and the KV cache. Colocated, it sleeps (weights and KV released) while the trainer works and
  the trainer's state stays resident while it generates; the peak is the larger of the two phases.

Everything is in GiB (2^30 bytes). `train_phase_gib` counts what PyTorch's allocator holds in the actor update
and is the figure to compare with the trainer's `perf/max_memory_allocated_gb` (vLLM's memory pool and the CUDA
context are outside it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kuberl.api.batching import plan_batches
from kuberl.api.spec import RLJobSpec

GIB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ADAM_BYTES = 8
"""AdamW's exp_avg and exp_avg_sq in fp32."""
CUDA_CONTEXT_GIB = 0.5
"""CUDA context, NCCL buffers and allocator slack outside PyTorch's count: subtracted from the GPU's memory."""

GPUS_MIB: dict[str, int] = {
    "H200": 143771,
    "H100-80GB": 81559,
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "L40S": 46068,
    "L4": 23034,
    "A10G": 23028,
}
"""Total memory as nvidia-smi reports it. Names match the `nvidia.com/gpu.product` node label by substring."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer: enough to count parameters, activations and KV cache."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tie_embeddings: bool = True
    qkv_bias: bool = False
    head_dim: int = 0
    """0: hidden ÷ heads."""

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.dim, self.kv_heads * self.dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    @property
    def critic_params(self) -> int:
        """The same trunk with a one-output value head in place of the language-model head."""
        return self.vocab * self.hidden + self.layers * self.layer_params + self.hidden + self.hidden


@dataclass(frozen=True)
class GPU:
    name: str
    total_gib: float

    @property
    def usable_gib(self) -> float:
        return self.total_gib - CUDA_CONTEXT_GIB


def gpu_named(name: str) -> GPU:
    """A GPU by table name, node-label product (`NVIDIA-H100-80GB-HBM3`) or size (`80GiB`, `80`)."""
    text = name.strip()
    number = text.removesuffix("GiB").removesuffix("Gi")
    try:
        return GPU(f"{float(number):g} GiB", float(number))
    except ValueError:
        pass
    upper = text.upper()
    for known in sorted(GPUS_MIB, key=len, reverse=True):
        family = known.split("-")[0]
        size = known.split("-")[1] if "-" in known else ""
        if family in upper and size in upper:
            return GPU(known, GPUS_MIB[known] / 1024)
    raise ValueError(f"unknown GPU {name!r}; give one of {', '.join(GPUS_MIB)} or a size like 80GiB")


def gpu_of(spec: RLJobSpec, pool: str = "trainer") -> GPU | None:
    """The GPU the spec's node selector names, if it does."""
    node_pool = spec.cluster.rollout if pool == "rollout" and spec.cluster.rollout else spec.cluster.trainer
    product = node_pool.node_selector.get(GPU_PRODUCT_LABEL)
    return gpu_named(product) if product else None


@dataclass(frozen=True)
class Role:
    """One model's resident memory on a trainer GPU, in GiB."""

    name: str
    params: float
    grads: float = 0.0
    optimizer: float = 0.0
    """On the GPU outside the optimizer step (0 with optimizerOffload)."""
    optimizer_step: float = 0.0
    """On the GPU during the optimizer step."""

    @property
    def resident(self) -> float:
        return self.params + self.optimizer


@dataclass
class MemoryPlan:
    gpu: str
    gpu_gib: float
    usable_gib: float
    model_params: int
    trainer_gpus: int
    placement: str
    micro_batch: str
    """`4 responses × 1024 tokens` or `token budget 16384`."""
    roles: list[Role]
    activations_gib: float
    activations_with_checkpointing_gib: float
    activations_without_checkpointing_gib: float
    gradient_checkpointing: bool
    gathered_layers_gib: float
    logits_gib: float
    vllm_weights_gib: float
    vllm_activations_gib: float
    vllm_kv_cache_gib: float
    vllm_kv_tokens: int
    vllm_sequences: int
    """Full-length sequences the KV cache holds at once."""
    generate_phase_gib: float
    """Colocated: trainer state resident while vLLM generates; separate: the rollout GPU."""
    train_phase_gib: float
    """PyTorch-allocated peak of the actor update: compare with perf/max_memory_allocated_gb."""
    peak_gib: float
    fits: bool
    largest_micro_batch: int | None
    """Largest per-GPU micro-batch (a divisor of the rows per GPU per mini-batch) that fits; None if none does."""
    advice: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result["roles"] = [{**asdict(r), "resident": r.resident} for r in self.roles]
        return result


def _gib(num_bytes: float) -> float:
    return num_bytes / GIB


def layer_activations_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> float:
    """Tensors one layer keeps for backward: norm inputs, q/k/v, attention output, o-proj and MLP inputs,
    gate, up and their product (flash attention: no T×T scores)."""
    q, kv = shape.heads * shape.dim, shape.kv_heads * shape.dim
    per_token = 4 * shape.hidden + q + 2 * kv + q + 3 * shape.intermediate
    return tokens * per_token * dtype_bytes


def activations_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    if checkpointing:
        return shape.layers * tokens * shape.hidden * dtype_bytes + layer_activations_bytes(shape, tokens, dtype_bytes)
    return shape.layers * layer_activations_bytes(shape, tokens, dtype_bytes)


def logits_bytes(shape: ModelShape, rows: int, response_tokens: int, dtype_bytes: int) -> float:
    """Response logits and their gradient in the compute dtype, plus one row upcast to fp32 (log-softmax)."""
    return 2 * rows * response_tokens * shape.vocab * dtype_bytes + response_tokens * shape.vocab * 4


def _roles(spec: RLJobSpec, shape: ModelShape, dp: int) -> list[Role]:
    def trained(name: str, params: int, param_offload: bool, optimizer_offload: bool) -> Role:
        if param_offload:
            return Role(name, 0.0)
        shard = params / dp
        optimizer = _gib(ADAM_BYTES * shard)
        return Role(name, _gib(4 * shard), _gib(4 * shard), 0.0 if optimizer_offload else optimizer, optimizer)

    lora = spec.model.lora
    actor = trained("actor", shape.params, spec.actor.fsdp.param_offload, spec.actor.fsdp.optimizer_offload)
    if lora is not None:  # frozen base in fp32 shards; gradients and optimizer only for the adapters
        adapter = lora.rank * shape.layers * (4 * shape.hidden + 2 * shape.intermediate + 2 * shape.hidden)
        trained_adapter = trained("actor", adapter, False, spec.actor.fsdp.optimizer_offload)
        base = 0.0 if spec.actor.fsdp.param_offload else _gib(4 * shape.params / dp)
        actor = Role(
            "actor",
            base + trained_adapter.params,
            trained_adapter.grads,
            trained_adapter.optimizer,
            trained_adapter.optimizer_step,
        )
    roles = [actor]
    kl = spec.algorithm.kl
    if (kl.in_reward or kl.loss.enabled) and lora is None:
        roles.append(Role("reference", 0.0 if spec.actor.fsdp.param_offload else _gib(4 * shape.params / dp)))
    if spec.critic is not None:
        fsdp = spec.critic.fsdp
        roles.append(trained("critic", shape.critic_params, fsdp.param_offload, fsdp.optimizer_offload))
    return roles


def _train_phase(
    spec: RLJobSpec, shape: ModelShape, roles: list[Role], tokens: int, rows: int, checkpointing: bool
) -> tuple[float, float, float, float]:
    """(total, activations, gathered layers, logits) of the actor update, GiB."""
    dtype_bytes = DTYPE_BYTES[spec.model.dtype]
    activations = _gib(activations_bytes(shape, tokens, dtype_bytes, checkpointing))
    gathered = _gib(2 * shape.layer_params * dtype_bytes)
    if not spec.actor.fsdp.reshard_after_forward:
        gathered = _gib(shape.layers * shape.layer_params * dtype_bytes)
    logits = _gib(logits_bytes(shape, rows, spec.data.max_response_length, dtype_bytes))
    actor = roles[0]
    others = sum(r.resident for r in roles[1:])
    state = actor.params + actor.grads + max(actor.optimizer, actor.optimizer_step)
    return state + others + activations + gathered + logits, activations, gathered, logits


def plan_memory(spec: RLJobSpec, shape: ModelShape, gpu: GPU, rollout_gpu: GPU | None = None) -> MemoryPlan:
    """Per-GPU memory of every role and phase; `rollout_gpu` defaults to `gpu` (a separate pool's GPU)."""
    batches = plan_batches(spec)
    dp = batches.trainer_gpus
    dtype_bytes = DTYPE_BYTES[spec.model.dtype]
    seq = spec.data.max_prompt_length + spec.data.max_response_length
    dynamic = spec.batch.dynamic_batch_size
    roles = _roles(spec, shape, dp)

    def train_at(rows: int, checkpointing: bool) -> tuple[float, float, float, float]:
        tokens = dynamic.max_token_len_per_gpu if dynamic.enabled else rows * seq
        rows = max(1, tokens // seq) if dynamic.enabled else rows
        return _train_phase(spec, shape, roles, tokens, rows, checkpointing)

    micro = batches.micro_batch_size_per_gpu or 1
    checkpointing = spec.model.gradient_checkpointing
    train_phase, activations, gathered, logits = train_at(micro, checkpointing)
    with_checkpointing, without_checkpointing = train_at(micro, True)[1], train_at(micro, False)[1]

    rollout_gpu = rollout_gpu or gpu
    tp = spec.rollout.tensor_parallel_size
    vllm_total = spec.rollout.gpu_memory_utilization * rollout_gpu.total_gib
    vllm_weights = _gib(shape.params * dtype_bytes / tp)
    vllm_activations = _gib(
        spec.rollout.max_num_batched_tokens * (4 * shape.hidden + 2 * shape.intermediate) * dtype_bytes / tp
        + spec.rollout.max_num_seqs * shape.vocab * 4
    )
    kv_cache = max(0.0, vllm_total - vllm_weights - vllm_activations)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.dim * dtype_bytes / tp
    kv_tokens = int(kv_cache * GIB // kv_per_token)
    colocated = spec.rollout_pool is None
    resident = sum(r.resident for r in roles)
    generate_phase = (resident if colocated else 0.0) + vllm_total
    peak = max(train_phase, generate_phase) if colocated else train_phase
    rollout_fits = kv_tokens >= seq and (colocated or vllm_total <= rollout_gpu.usable_gib)
    fits = peak <= gpu.usable_gib and rollout_fits

    largest = None
    if not dynamic.enabled:
        for rows in sorted(_divisors(batches.rows_per_gpu_per_mini_batch), reverse=True):
            if train_at(rows, checkpointing)[0] <= gpu.usable_gib:
                largest = rows
                break
    plan = MemoryPlan(
        gpu=gpu.name,
        gpu_gib=round(gpu.total_gib, 2),
        usable_gib=round(gpu.usable_gib, 2),
        model_params=shape.params,
        trainer_gpus=dp,
        placement=spec.rollout.placement,
        micro_batch=f"token budget {dynamic.max_token_len_per_gpu}" if dynamic.enabled else f"{micro} × {seq} tokens",
        roles=roles,
        activations_gib=activations,
        activations_with_checkpointing_gib=with_checkpointing,
        activations_without_checkpointing_gib=without_checkpointing,
        gradient_checkpointing=checkpointing,
        gathered_layers_gib=gathered,
        logits_gib=logits,
        vllm_weights_gib=vllm_weights,
        vllm_activations_gib=vllm_activations,
        vllm_kv_cache_gib=kv_cache,
        vllm_kv_tokens=kv_tokens,
        vllm_sequences=kv_tokens // seq,
        generate_phase_gib=generate_phase,
        train_phase_gib=train_phase,
        peak_gib=peak,
        fits=fits,
        largest_micro_batch=largest,
    )
    plan.advice = _advice(spec, plan, shape, seq)
    return plan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _advice(spec: RLJobSpec, plan: MemoryPlan, shape: ModelShape, seq: int) -> list[str]:
    """What to change, each with the GiB it saves per GPU."""
    advice = []
    usable = plan.usable_gib
    if plan.train_phase_gib > usable:
        over = plan.train_phase_gib - usable
        advice.append(f"the actor update needs {plan.train_phase_gib:.1f} GiB of {usable:.1f} GiB ({over:.1f} over)")
        if not plan.gradient_checkpointing:
            saved = plan.activations_without_checkpointing_gib - plan.activations_with_checkpointing_gib
            advice.append(f"model.gradientCheckpointing: true saves {saved:.1f} GiB")
        actor = plan.roles[0]
        if not spec.actor.fsdp.optimizer_offload and actor.optimizer:
            advice.append(f"actor.fsdp.optimizerOffload: true saves {actor.optimizer:.1f} GiB between steps")
        if not spec.actor.fsdp.param_offload and actor.params:
            advice.append(f"actor.fsdp.paramOffload: true saves {actor.params + actor.grads:.1f} GiB")
        if plan.largest_micro_batch:
            advice.append(f"batch.ppoMicroBatchSizePerGPU: {plan.largest_micro_batch} fits")
        elif not spec.batch.dynamic_batch_size.enabled:
            advice.append("no micro-batch fits: offload, or add trainer GPUs (cluster.trainer.nodes)")
    if spec.rollout_pool is None and plan.generate_phase_gib > usable:
        resident = plan.generate_phase_gib - spec.rollout.gpu_memory_utilization * plan.gpu_gib
        room = (usable - resident) / plan.gpu_gib
        advice.append(
            f"generation needs {plan.generate_phase_gib:.1f} GiB (trainer state {resident:.1f} + vLLM "
            f"{spec.rollout.gpu_memory_utilization} × {plan.gpu_gib:.0f}): "
            + (f"rollout.gpuMemoryUtilization: {room:.2f} fits" if room > 0 else "offload the trainer's state")
        )
    if plan.vllm_kv_tokens < seq:
        advice.append(
            f"vLLM's KV cache holds {plan.vllm_kv_tokens} tokens, less than one {seq}-token sequence: raise "
            "rollout.gpuMemoryUtilization or rollout.tensorParallelSize"
        )
    elif plan.vllm_sequences < spec.rollout.max_num_seqs:
        advice.append(
            f"vLLM's KV cache holds {plan.vllm_sequences} full-length sequences at once "
            f"(rollout.maxNumSeqs {spec.rollout.max_num_seqs}): generation runs in waves"
        )
    return advice
