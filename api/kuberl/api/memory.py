"""Per-GPU memory of an RLJob before launch: what `kuberl plan` prints, what the trainer refuses to start with, and
the token budget of `batch.dynamicBatchSize` when `maxTokenLenPerGPU` is left out.

Everything that shares a trainer GPU is counted, as the device reports it (NVML, every process), phase by phase:

- each CUDA process: `PROCESS_GIB` (CUDA context, cuBLAS workspaces: what no allocator counts), plus `NCCL_GIB`
  when the trainer spans several GPUs or broadcasts the weights to engines on GPUs of their own, and `ENGINE_GIB`
  where a vLLM engine lives (its CUDA graphs);
- train (the actor update): FSDP2's shards of fp32 parameters, fp32 gradients and AdamW's two fp32 moments (16 bytes
  per parameter ÷ GPUs; `paramOffload` / `optimizerOffload` move them to the CPU), the reference and critic copies,
  the gathered layers, one micro-batch's activations (the tensors a layer keeps for its backward, ×
  `ACTIVATION_FACTOR`, and an eager layer's float32 norm tensors), the output head's chunk of float32 logits, and the caching
  allocator's reserve: blocks freed by micro-batches of other sizes that it keeps (`allocator_reserve_gib`: a share
  of the activations and the head's chunk: large with a fixed number of rows per micro-batch, small with a token budget,
  where the optimizer step's temporaries are reserved on top: the few freed blocks do not hold them);
- sync, colocated: the trainer's state, the engine's weights woken in the compute dtype and the bucket being sent
  (gathered, then flattened: two copies); the trainer empties its cache before the engine wakes, so no reserve;
- generate, colocated: the trainer's state + vLLM's `gpuMemoryUtilization` × the card (its weights, activations and
  KV cache are inside that share);
- on the `shared` layout (`placement: separate` on a machine with fewer GPUs than trainer + rollout ask, e.g.
  `kuberl run` on one GPU): the engine's share and its process, for the whole run, beside every trainer phase;
  with the rollout on GPUs of its own (`pools`, `disjoint`) the engine is on its card and counted there.

The constants come from NVML peaks measured on one H100 and one H200 (each constant says which); the table in
`tests/bench/test_plan_measured.py` reads every committed measurement the plan is checked against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kuberl.api.batching import plan_batches
from kuberl.api.spec import RLJobSpec

GIB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ADAM_BYTES = 8
"""AdamW's exp_avg and exp_avg_sq in fp32."""
PROCESS_GIB = 1.3
"""One CUDA process beyond its allocators' count: 1.13 GiB (H200, SmolLM2 colocated: 45.25 GiB in use − 42.12 vLLM −
2.0 trainer state), 1.28 GiB each (H200, llama 1.1B on the shared layout: 111.06 − 66.38 trainer reserved − 42.12
vLLM, two processes), 1.17 GiB (H100: the engine process at 0.2, 17.1 GiB − 0.2 × 79.65)."""
ENGINE_GIB = 0.4
"""What a vLLM engine holds beyond its gpuMemoryUtilization share, asleep or awake (its CUDA graphs' pool): H200,
SmolLM2 colocated, 45.25 GiB in use = 42.12 share + 1.5 trainer state + 1.3 process + 0.33."""
NCCL_GIB = 0.5
"""NCCL's buffers in a trainer that spans several GPUs or sends the weights to engines on other GPUs over NCCL (the
`pools` and `disjoint` layouts): an estimate, only one-GPU machines were measured."""
ACTIVATION_FACTOR = 1.05
"""Saved activations of a compiled layer ÷ :func:`layer_activations_bytes` (H200 actor update peaks at 32,768
tokens, bench/results/actor_mfu*.json: Qwen2-0.5B 42.0 GiB, SmolLM2 19.5 GiB)."""
EAGER_EXTRA_HIDDEN = 9.2
"""Elements per token an eager layer keeps beyond the compiled one, in hidden sizes: its RMSNorms' float32 upcast
and normalised input (the same update eager: SmolLM2 28.3 GiB, 8.8 h; Qwen2-0.5B 52.9 GiB, 9.1 h)."""
HEAD_CHUNK_TOKENS = {True: 4096, False: 1024}
"""Response tokens per chunk of the output head (lm_head.COMPILED_CHUNK_TOKENS / CHUNK_TOKENS)."""
HEAD_CHUNK_COPIES = {True: 1.65, False: 4.15}
"""The head's peak in float32 chunks of logits: 3.8 GiB compiled and 2.4 GiB eager at Qwen2's 152k vocabulary
(tests/gpu/test_packed_passes.py on the H200)."""
ALLOCATOR_RESERVE = 1.15
"""Reserved but free ÷ (activations + head) with a fixed number of rows per micro-batch (ppoMicroBatchSizePerGPU):
the caching allocator keeps blocks freed by micro-batches of other lengths. H200, llama 1.1B one step off: 66.4 GiB
reserved for 42.4 GiB allocated, over 21.0 GiB of planned activations (1.10 of activations + head)."""
TOKEN_BUDGET_RESERVE = 0.14
"""The same ratio when micro-batches are cut to a token budget (dynamicBatchSize: every micro-batch about the same
size, so freed blocks mostly fit the next) and the engine runs in a process of its own, on top of the optimizer
step's temporaries (which the few freed blocks do not hold: they are reserved anew). The largest of the benchmark
rows (NVML peaks less the card's use before the run, tests/bench/test_plan_measured.py): llama 1.1B one step off on
an H100, 0.14 (0.58 without the optimizer term, where SmolLM2's rows reserved 0.08–0.14: the term is what the larger
model adds); SmolLM2 one step off and async, 0.05–0.11. Qwen2-0.5B one step off on an H100 needs 0.10 run largest
first and peaked to the MiB as its run by first row had (its micro-batches near equal, the small one last); the llama
1.1B row has not been rerun largest first."""
COLOCATED_TOKEN_BUDGET_RESERVE = 0.035
"""The same with the engine in the trainer's process (its weights and KV cache woken and put to sleep between the
updates). Fitted on the colocated rows whose steps ran their largest micro-batch first (NVML peak above the idle card,
tests/bench/test_plan_measured.py): Qwen2-0.5B at 38,912 tokens on an H100 (54.77 GiB, ratio 0.030), SmolLM2 with
75,319-token micro-batches on an H100 (44.46 GiB, 0.030) and Qwen2-0.5B at 68,608 tokens on an H200 (81.61 GiB, none
needed): one ratio for both head sizes. The same Qwen2-0.5B job run by first row, a 9.8k-token micro-batch before a
38.9k one, reserved 24 GiB more (ratio 0.62): the order, not the head, set the ratio the plan took before the trainer
ran the largest first (docs/performance.md)."""
CPU_TOKEN_BUDGET = 16384
"""The token budget where no GPU memory bounds it (CPU runs) or the GPU is unknown (maxTokenLenPerGPU's default
before it was planned)."""
AUTO_HEADROOM = 0.9
"""A budget the trainer chooses peaks at no more than this share of the card, by the plan: the plan's own tolerance
(within 10% of the measured peak, never below) stays free."""
BUDGET_STEP = 1024
"""A chosen token budget is a multiple of this (or the one-sequence minimum)."""

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
GPU_LABELS = (GPU_PRODUCT_LABEL, "cloud.google.com/gke-accelerator")
"""Node labels that name the GPU model: NVIDIA's GPU feature discovery (`NVIDIA-H100-80GB-HBM3`), GKE's
(`nvidia-h200-141gb`, `nvidia-tesla-a100`)."""
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
INSTANCE_GPUS: dict[str, str] = {
    "p5.": "H100-80GB",  # AWS
    "p5e.": "H200",
    "p5en.": "H200",
    "p4d.": "A100-40GB",
    "p4de.": "A100-80GB",
    "g6e.": "L40S",
    "g6.": "L4",
    "g5.": "A10G",
    "a3-highgpu": "H100-80GB",  # GCP
    "a3-megagpu": "H100-80GB",
    "a3-ultragpu": "H200",
    "a2-highgpu": "A100-40GB",
    "a2-ultragpu": "A100-80GB",
    "g2-standard": "L4",
}
"""Instance types (their prefix) whose GPUs are of one model, for node selectors on the instance type."""
GPU_LABEL_ALIASES = {"NVIDIA-TESLA-A100": "A100-40GB", "NVIDIA-H100-MEGA-80GB": "H100-80GB"}
"""GKE's names that carry no size (`nvidia-tesla-a100` is the 40 GB A100)."""

Layout = Literal["colocated", "shared", "disjoint", "pools"]
"""Where the rollout runs (kuberl.trainer.plan.layout decides it): in the trainer's process, in its own process
on the trainer's GPU, or on GPUs of its own."""


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


def config_shape(config: dict[str, Any]) -> ModelShape:
    """From a Hugging Face config.json (Llama, Qwen2/3, Mistral, Gemma-style keys), or model.shape's fields."""
    text = config.get("text_config", config)
    heads = int(text["num_attention_heads"])
    return ModelShape(
        vocab=int(text["vocab_size"]),
        hidden=int(text["hidden_size"]),
        layers=int(text["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        intermediate=int(text["intermediate_size"]),
        tie_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        qkv_bias=bool(text.get("attention_bias", text.get("model_type") == "qwen2")),
        head_dim=int(text.get("head_dim") or 0),
    )


def declared_shape(spec: RLJobSpec) -> ModelShape | None:
    """The shape model.shape declares, if it does."""
    declared = spec.model.shape
    return None if declared is None else config_shape(declared.model_dump())


@dataclass(frozen=True)
class GPU:
    name: str
    total_gib: float


def gpu_named(name: str) -> GPU:
    """A GPU by table name, node-label product (`NVIDIA-H100-80GB-HBM3`) or size (`80GiB`, `80`)."""
    text = name.strip()
    number = text.removesuffix("GiB").removesuffix("Gi")
    try:
        return GPU(f"{float(number):g} GiB", float(number))
    except ValueError:
        pass
    upper = text.upper().replace(" ", "-")
    for known in sorted(GPUS_MIB, key=len, reverse=True):
        family = known.split("-")[0]
        size = known.split("-")[1] if "-" in known else ""
        if family in upper and size in upper:
            return GPU(known, GPUS_MIB[known] / 1024)
    raise ValueError(f"unknown GPU {name!r}; give one of {', '.join(GPUS_MIB)} or a size like 80GiB")


def gpu_of(spec: RLJobSpec, pool: str = "trainer") -> GPU | None:
    """The GPU the pool's node selector names, if it does: a GPU label, or an instance type of one GPU model."""
    node_pool = spec.cluster.rollout if pool == "rollout" and spec.cluster.rollout else spec.cluster.trainer
    selector = node_pool.node_selector
    for label in GPU_LABELS:
        if label in selector:
            product = selector[label]
            return gpu_named(GPU_LABEL_ALIASES.get(product.upper(), product))
    for label in INSTANCE_TYPE_LABELS:
        instance = selector.get(label, "")
        known = next((gpu for prefix, gpu in INSTANCE_GPUS.items() if instance.startswith(prefix)), None)
        if known is not None:
            return gpu_named(known)
    return None


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
    model_params: int
    trainer_gpus: int
    placement: str
    layout: Layout
    micro_batch: str
    """`4 responses × 1024 tokens` or `token budget 16384`."""
    token_budget: int | None
    """The micro-batch token budget the trainer uses (dynamic batching; chosen here when left out), else None."""
    token_budget_chosen: bool
    """The budget was left out and is the largest that fits (:func:`largest_token_budget`)."""
    roles: list[Role]
    compiled: bool
    gradient_checkpointing: bool
    process_gib: float
    """CUDA context and friends of the trainer's process (and NCCL's buffers with several GPUs)."""
    activations_gib: float
    activations_with_checkpointing_gib: float
    activations_without_checkpointing_gib: float
    gathered_layers_gib: float
    head_gib: float
    """The output head's peak: its chunk of float32 logits and their gradient."""
    allocator_reserve_gib: float
    train_allocated_gib: float
    """What PyTorch's allocator holds at the update's peak: compare with the trainer's perf/max_memory_allocated_gb."""
    vllm_total_gib: float
    """gpuMemoryUtilization × the rollout GPU."""
    vllm_weights_gib: float
    vllm_activations_gib: float
    vllm_kv_cache_gib: float
    vllm_kv_tokens: int
    vllm_sequences: int
    """Full-length sequences the KV cache holds at once."""
    engine_on_trainer_gpu_gib: float
    """The engine's share and process on a trainer GPU for the whole run (the shared layout), else 0."""
    phases_gib: dict[str, float]
    """Device memory of a trainer GPU by phase: train, sync, generate (those the layout has)."""
    rollout_gpu_gib: float | None
    """The engine's card, when it has GPUs of its own."""
    peak_gib: float
    fits: bool
    largest_micro_batch: int | None
    """Without dynamic batching: the largest per-GPU micro-batch (a divisor of the rows per GPU per mini-batch) that
    fits; None if none does."""
    largest_token_budget: int | None
    """With dynamic batching: the largest token budget that fits; None if not even one sequence does."""
    advice: list[str] = field(default_factory=list)
    """What to change when it does not fit, each with its numbers."""

    def as_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result["roles"] = [{**asdict(r), "resident": r.resident} for r in self.roles]
        return result

    @property
    def train_phase_gib(self) -> float:
        return self.phases_gib["train"]


def _gib(num_bytes: float) -> float:
    return num_bytes / GIB


def layer_activations_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> float:
    """Tensors one layer keeps for backward: norm inputs, q/k/v, attention output, o-proj and MLP inputs,
    gate, up and their product (flash attention: no T×T scores)."""
    q, kv = shape.heads * shape.dim, shape.kv_heads * shape.dim
    per_token = 4 * shape.hidden + q + 2 * kv + q + 3 * shape.intermediate
    return tokens * per_token * dtype_bytes


def activations_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    """Counted saved tensors of a micro-batch of ``tokens``: every layer's (without checkpointing), or every layer's
    input and one layer recomputed in full (with)."""
    if checkpointing:
        return shape.layers * tokens * shape.hidden * dtype_bytes + layer_activations_bytes(shape, tokens, dtype_bytes)
    return shape.layers * layer_activations_bytes(shape, tokens, dtype_bytes)


def saved_activations_bytes(
    shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool, compiled: bool
) -> float:
    """What a micro-batch's layers really keep: :func:`activations_bytes` × :data:`ACTIVATION_FACTOR`, and the eager
    layer's float32 norm tensors (:data:`EAGER_EXTRA_HIDDEN`) for each layer kept in full."""
    counted = ACTIVATION_FACTOR * activations_bytes(shape, tokens, dtype_bytes, checkpointing)
    full_layers = 1 if checkpointing else shape.layers
    eager = 0.0 if compiled else full_layers * EAGER_EXTRA_HIDDEN * shape.hidden * tokens * dtype_bytes
    return counted + eager


def head_bytes(shape: ModelShape, response_tokens: int, compiled: bool) -> float:
    """The output head's peak: its chunk of float32 logits (response tokens only, :data:`HEAD_CHUNK_TOKENS` at a
    time) with what its backward writes, :data:`HEAD_CHUNK_COPIES` chunks."""
    chunk = min(response_tokens, HEAD_CHUNK_TOKENS[compiled])
    return HEAD_CHUNK_COPIES[compiled] * chunk * shape.vocab * 4


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


@dataclass(frozen=True)
class _Update:
    """One micro-batch of the actor update, GiB."""

    activations: float
    head: float
    gathered: float
    reserve: float
    allocated: float


def allocator_reserve_gib(spec: RLJobSpec, layout: Layout, activations_gib: float, optimizer_step_gib: float) -> float:
    """Reserved but free GiB around a micro-batch's ``activations_gib`` (its head's included) under
    ``spec``'s micro-batching on ``layout``; a token budget's also holds the optimizer step's temporaries (a fixed row
    count's 1.15 x held them in both models measured)."""
    if not spec.batch.dynamic_batch_size.enabled:
        return ALLOCATOR_RESERVE * activations_gib
    ratio = COLOCATED_TOKEN_BUDGET_RESERVE if layout == "colocated" else TOKEN_BUDGET_RESERVE
    return ratio * activations_gib + optimizer_step_gib


def _update(
    spec: RLJobSpec,
    shape: ModelShape,
    roles: list[Role],
    tokens: int,
    rows: int,
    checkpointing: bool,
    layout: Layout,
) -> _Update:
    dtype_bytes = DTYPE_BYTES[spec.model.dtype]
    compiled = spec.model.compile
    activations = _gib(saved_activations_bytes(shape, tokens, dtype_bytes, checkpointing, compiled))
    head = _gib(head_bytes(shape, rows * spec.data.max_response_length, compiled))
    if spec.actor.fsdp.reshard_after_forward:  # one layer gathered, the next prefetched
        gathered = _gib(2 * shape.layer_params * dtype_bytes)
    else:  # the whole model stays gathered, and the backward's float32 gradients wait for their reduce-scatter
        gathered = _gib(shape.params * (dtype_bytes + 4))
    actor = roles[0]
    state = actor.params + actor.grads + max(actor.optimizer, actor.optimizer_step)
    others = sum(r.resident for r in roles[1:])
    allocated = state + others + activations + head + gathered
    reserve = allocator_reserve_gib(spec, layout, activations + head, actor.optimizer_step)
    return _Update(activations, head, gathered, reserve, allocated)


def _layout(spec: RLJobSpec, layout: Layout | None) -> Layout:
    if spec.rollout_pool is None:
        return "colocated"
    return layout or "pools"


def plan_memory(
    spec: RLJobSpec,
    shape: ModelShape,
    gpu: GPU,
    rollout_gpu: GPU | None = None,
    *,
    layout: Layout | None = None,
) -> MemoryPlan:
    """Per-GPU memory of every role and phase. ``layout``: the rollout's layout where the job runs (the trainer's
    :func:`~kuberl.trainer.rollout.layout.plan_rollout_layout`; default: colocated, or GPUs of its own when
    separate); ``rollout_gpu``: the rollout pool's GPU (default ``gpu``)."""
    batches = plan_batches(spec)
    dp = batches.trainer_gpus
    dtype_bytes = DTYPE_BYTES[spec.model.dtype]
    seq = spec.data.max_prompt_length + spec.data.max_response_length
    dynamic = spec.batch.dynamic_batch_size
    roles = _roles(spec, shape, dp)
    kind = _layout(spec, layout)
    rollout_gpu = rollout_gpu or gpu
    checkpointing = spec.model.gradient_checkpointing

    tp = spec.rollout.tensor_parallel_size
    engine_gpu = gpu if kind in ("colocated", "shared") else rollout_gpu
    vllm_total = spec.rollout.gpu_memory_utilization * engine_gpu.total_gib
    vllm_weights = _gib(shape.params * dtype_bytes / tp)
    vllm_activations = _gib(
        spec.rollout.max_num_batched_tokens * (4 * shape.hidden + 2 * shape.intermediate) * dtype_bytes / tp
        + spec.rollout.max_num_seqs * shape.vocab * 4
    )
    kv_cache = max(0.0, vllm_total - vllm_weights - vllm_activations)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.dim * dtype_bytes / tp
    kv_tokens = int(kv_cache * GIB // kv_per_token)

    nccl = dp > 1 or kind in ("pools", "disjoint")  # collectives among the ranks, or the weights' broadcast
    process = PROCESS_GIB + (NCCL_GIB if nccl else 0.0) + (ENGINE_GIB if kind == "colocated" else 0.0)
    engine_beside = vllm_total + PROCESS_GIB + ENGINE_GIB if kind == "shared" else 0.0
    resident = sum(r.resident for r in roles)
    bucket = _gib(min(512 * 2**20, shape.params * dtype_bytes))  # weight_sync.DEFAULT_BUCKET_MB

    def phases(update: _Update) -> dict[str, float]:
        train = process + update.allocated + update.reserve + engine_beside
        if kind == "colocated":
            return {
                "train": train,
                "sync": process + resident + vllm_weights + 2 * bucket,
                "generate": process + resident + vllm_total,
            }
        return {"train": train, "sync": process + resident + 2 * bucket + engine_beside}

    def update_at(tokens: int) -> _Update:
        rows = max(1, tokens // seq) if dynamic.enabled else tokens // seq
        return _update(spec, shape, roles, tokens, rows, checkpointing, kind)

    def fits_at(tokens: int, with_checkpointing: bool = checkpointing, share: float = 1.0) -> bool:
        rows = max(1, tokens // seq) if dynamic.enabled else tokens // seq
        update = _update(spec, shape, roles, tokens, rows, with_checkpointing, kind)
        return max(phases(update).values()) <= share * gpu.total_gib

    rows_per_gpu = batches.rows_per_gpu_per_mini_batch
    largest_budget = largest_token_budget(fits_at, seq, rows_per_gpu * seq) if dynamic.enabled else None
    largest_rows = None
    if not dynamic.enabled:
        largest_rows = next((d for d in sorted(_divisors(rows_per_gpu), reverse=True) if fits_at(d * seq)), None)

    chosen = dynamic.enabled and dynamic.max_token_len_per_gpu is None
    if dynamic.enabled:
        roomy = largest_token_budget(lambda t: fits_at(t, share=AUTO_HEADROOM), seq, rows_per_gpu * seq)
        budget = dynamic.max_token_len_per_gpu or roomy or largest_budget or seq
        note = f" (chosen: the largest that peaks under {AUTO_HEADROOM:.0%} of the card)" if chosen else ""
        tokens, label = budget, f"token budget {budget}{note}"
    else:
        micro = batches.micro_batch_size_per_gpu or 1
        tokens, label = micro * seq, f"{micro} × {seq} tokens"
    update = update_at(tokens)
    by_phase = phases(update)
    peak = max(by_phase.values())
    rollout_card = vllm_total + PROCESS_GIB + ENGINE_GIB if kind in ("disjoint", "pools") else None
    rollout_fits = kv_tokens >= seq and (rollout_card is None or rollout_card <= rollout_gpu.total_gib)
    plan = MemoryPlan(
        gpu=gpu.name,
        gpu_gib=round(gpu.total_gib, 2),
        model_params=shape.params,
        trainer_gpus=dp,
        placement=spec.rollout.placement,
        layout=kind,
        micro_batch=label,
        token_budget=tokens if dynamic.enabled else None,
        token_budget_chosen=chosen,
        roles=roles,
        compiled=spec.model.compile,
        gradient_checkpointing=checkpointing,
        process_gib=process,
        activations_gib=update.activations,
        activations_with_checkpointing_gib=_update(spec, shape, roles, tokens, 1, True, kind).activations,
        activations_without_checkpointing_gib=_update(spec, shape, roles, tokens, 1, False, kind).activations,
        gathered_layers_gib=update.gathered,
        head_gib=update.head,
        allocator_reserve_gib=update.reserve,
        train_allocated_gib=update.allocated,
        vllm_total_gib=vllm_total,
        vllm_weights_gib=vllm_weights,
        vllm_activations_gib=vllm_activations,
        vllm_kv_cache_gib=kv_cache,
        vllm_kv_tokens=kv_tokens,
        vllm_sequences=kv_tokens // seq,
        engine_on_trainer_gpu_gib=engine_beside,
        phases_gib=by_phase,
        rollout_gpu_gib=rollout_card,
        peak_gib=peak,
        fits=peak <= gpu.total_gib and rollout_fits,
        largest_micro_batch=largest_rows,
        largest_token_budget=largest_budget,
    )
    plan.advice = _advice(spec, plan, seq, fits_at)
    return plan


def largest_token_budget(fits: Callable[[int], bool], seq: int, most: int) -> int | None:
    """The largest budget in [seq, most] that ``fits`` (a multiple of :data:`BUDGET_STEP`, or ``seq`` itself);
    None if ``seq`` does not fit. Memory grows with the budget, so a bisection finds it."""
    if not fits(seq):
        return None
    most = max(seq, most)
    if fits(most):
        return most
    low, high = seq, most  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return max(seq, low // BUDGET_STEP * BUDGET_STEP) if low >= BUDGET_STEP else low


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _advice(spec: RLJobSpec, plan: MemoryPlan, seq: int, fits_at: Callable[..., bool]) -> list[str]:
    """What to change when the plan does not fit, each with the numbers that make it fit."""
    if plan.fits:
        return []
    advice = []
    total = plan.gpu_gib
    for phase, gib in plan.phases_gib.items():
        if gib > total:
            advice.append(f"the {phase} phase needs {gib:.1f} GiB of the {total:.1f} GiB card ({gib - total:.1f} over)")
    dynamic = spec.batch.dynamic_batch_size
    train_over = plan.phases_gib["train"] > total
    if train_over and dynamic.enabled and plan.largest_token_budget:
        advice.append(
            f"batch.dynamicBatchSize.maxTokenLenPerGPU: {plan.largest_token_budget} fits"
            + (" (or leave it out: the trainer takes the largest that fits)" if not plan.token_budget_chosen else "")
        )
    if train_over and not dynamic.enabled and plan.largest_micro_batch:
        advice.append(f"batch.ppoMicroBatchSizePerGPU: {plan.largest_micro_batch} fits")
    if train_over and not plan.gradient_checkpointing:
        fewer = plan.activations_without_checkpointing_gib - plan.activations_with_checkpointing_gib
        saved = fewer + allocator_reserve_gib(spec, plan.layout, fewer, 0.0)
        works = fits_at(plan.token_budget or seq, True)
        advice.append(f"model.gradientCheckpointing: true saves {saved:.1f} GiB" + (" and fits" if works else ""))
    actor = plan.roles[0]
    if train_over and not spec.actor.fsdp.optimizer_offload and actor.optimizer:
        advice.append(f"actor.fsdp.optimizerOffload: true saves {actor.optimizer:.1f} GiB outside the optimizer step")
    if train_over and not spec.actor.fsdp.param_offload and actor.params:
        advice.append(f"actor.fsdp.paramOffload: true saves {actor.params + actor.grads:.1f} GiB")
    over = plan.peak_gib - total
    if plan.layout in ("colocated", "shared") and over > 0:
        share = spec.rollout.gpu_memory_utilization
        if plan.layout == "shared" or plan.phases_gib.get("generate", 0.0) > total:
            lower = share - over / total
            advice.append(
                f"rollout.gpuMemoryUtilization: {lower:.2f} fits (from {share})"
                if lower > 0.05
                else "the engine's share cannot shrink enough: give the rollout GPUs of its own (cluster.rollout)"
            )
    if train_over and not plan.largest_micro_batch and not plan.largest_token_budget:
        advice.append("not one sequence fits a micro-batch: offload, or add trainer GPUs (cluster.trainer.nodes)")
    if plan.vllm_kv_tokens < seq:
        advice.append(
            f"vLLM's KV cache holds {plan.vllm_kv_tokens} tokens, less than one {seq}-token sequence: raise "
            "rollout.gpuMemoryUtilization or rollout.tensorParallelSize"
        )
    if plan.rollout_gpu_gib is not None and plan.rollout_gpu_gib > total:
        advice.append(f"the engine needs {plan.rollout_gpu_gib:.1f} GiB on its GPU: lower rollout.gpuMemoryUtilization")
    return advice


def token_budget(spec: RLJobSpec, shape: ModelShape | None, gpu: GPU | None, layout: Layout | None) -> int | None:
    """The micro-batch token budget a run uses: None without dynamic batching; the spec's when given; else the
    largest the plan fits on ``gpu`` (:data:`CPU_TOKEN_BUDGET` when there is no GPU to plan for)."""
    dynamic = spec.batch.dynamic_batch_size
    if not dynamic.enabled:
        return None
    if dynamic.max_token_len_per_gpu is not None:
        return dynamic.max_token_len_per_gpu
    if gpu is None or shape is None:
        return CPU_TOKEN_BUDGET
    plan = plan_memory(spec, shape, gpu, layout=layout)
    return plan.token_budget


def format_plan(name: str, plan: MemoryPlan) -> str:
    """The plan as `kuberl plan` prints it (and the trainer's refusal quotes it)."""
    verdict = "fits" if plan.fits else "does NOT fit"
    on_off = {True: "on", False: "off"}
    lines = [
        f"RLJob{' ' + name if name else ''} on {plan.trainer_gpus} × {plan.gpu} ({plan.gpu_gib:.1f} GiB), rollout "
        f"{plan.layout}: "
        f"{verdict}, peak {plan.peak_gib:.1f} GiB per GPU",
        f"  model: {plan.model_params / 1e6:,.1f} M parameters; micro-batch {plan.micro_batch}; "
        f"compiled layers {on_off[plan.compiled]}",
        "  per GPU (GiB)       params   grads  optimizer (step)",
    ]
    for role in plan.roles:
        lines.append(
            f"  {role.name:<18}{role.params:8.2f}{role.grads:8.2f}{role.optimizer:8.2f} ({role.optimizer_step:.2f})"
        )
    lines += [
        f"  process             {plan.process_gib:.2f} (CUDA context, workspaces, graphs"
        + (", NCCL buffers)" if plan.trainer_gpus > 1 else ")"),
        f"  activations         {plan.activations_gib:.2f} (gradient checkpointing "
        f"{on_off[plan.gradient_checkpointing]}; {plan.activations_with_checkpointing_gib:.2f} with, "
        f"{plan.activations_without_checkpointing_gib:.2f} without)",
        f"  output head         {plan.head_gib:.2f}",
        f"  gathered layers     {plan.gathered_layers_gib:.2f}",
        f"  allocator reserve   {plan.allocator_reserve_gib:.2f} (freed blocks PyTorch's cache keeps)",
        f"  vLLM                {plan.vllm_total_gib:.2f}: weights {plan.vllm_weights_gib:.2f}, activations "
        f"{plan.vllm_activations_gib:.2f}, KV cache {plan.vllm_kv_cache_gib:.2f} ({plan.vllm_kv_tokens:,} tokens, "
        f"{plan.vllm_sequences} sequences)"
        + (", on the trainer's GPU in its own process" if plan.layout == "shared" else ""),
    ]
    for phase, gib in plan.phases_gib.items():
        note = f" (PyTorch allocated {plan.train_allocated_gib:.2f})" if phase == "train" else ""
        lines.append(f"  phase: {phase:<12} {gib:.2f}{note}")
    if plan.rollout_gpu_gib is not None:
        lines.append(f"  rollout GPU         {plan.rollout_gpu_gib:.2f}")
    if plan.token_budget is not None:
        lines.append(f"  largest token budget that fits: {plan.largest_token_budget or 'none (not one sequence)'}")
    else:
        lines.append(f"  largest micro-batch that fits: {plan.largest_micro_batch or 'none'}")
    lines += [f"  - {line}" for line in plan.advice]
    return "\n".join(lines)


def does_not_fit(name: str, plan: MemoryPlan) -> str:
    """The refusal of a job whose plan does not fit: the verdict, what to change, and the plan."""
    fixes = "; ".join(plan.advice) or "see the plan"
    return (
        f"RLJob{' ' + name if name else ''} does not fit one {plan.gpu} ({plan.peak_gib:.1f} of {plan.gpu_gib:.1f} "
        "GiB at its peak): "
        f"{fixes}\n{format_plan(name, plan)}"
    )
