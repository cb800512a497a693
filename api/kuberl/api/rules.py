"""The one rules table: cross-field admission rules for an RLJob.

Each rule is a CEL expression that must hold. The same text becomes the CRD's
`x-kubernetes-validations` (checked by the apiserver at `kubectl apply`) and is evaluated
in Python by `kuberl validate`, the operator and the trainer; `docs/api.md` lists it.

Rules on `spec` see the spec as `self`; rules on the object root see the whole RLJob and,
for transition rules, the stored object as `oldSelf`. Messages are templates whose
`${expr}` parts are CEL evaluated on the same `self`, so the apiserver and Python print
the same numbers. Upper-case words in rules and messages are macros (see `MACROS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

from kuberl.api.contract import CHECKPOINT_MOUNT, MAX_NAME_LENGTH
from kuberl.api.engines import ENGINE_SETS, ENGINES, EngineCapabilities, engines_where
from kuberl.api.spec import AGENT_BUILTIN_TOOLS, SANDBOXED_REWARDS, SANDBOXED_TOOLS, NodePool, SpecModel
from kuberl.api.status import ACTIVE_PHASES

MACROS: dict[str, str] = {
    "DP": "(self.cluster.trainer.nodes * self.cluster.trainer.gpusPerNode)",
    "RESPONSES": "(self.batch.trainBatchSize * self.batch.rolloutN)",
    "MINI_RESPONSES": "(self.batch.ppoMiniBatchSize * self.batch.rolloutN)",
    "ROLLOUT_GPUS": (
        "(self.rollout.placement == 'separate' && has(self.cluster.rollout)"
        " ? self.cluster.rollout.nodes * self.cluster.rollout.gpusPerNode"
        " : self.cluster.trainer.nodes * self.cluster.trainer.gpusPerNode)"
    ),
    "DYNAMIC": "self.batch.dynamicBatchSize.enabled",
    "SEQ_LEN": "(self.data.maxPromptLength + self.data.maxResponseLength)",
    "ACTIVE_PHASES": "[" + ", ".join(f"'{p}'" for p in sorted(ACTIVE_PHASES)) + "]",
    "AGENT_BUILTIN_TOOLS": "[" + ", ".join(f"'{t}'" for t in AGENT_BUILTIN_TOOLS) + "]",
    "SANDBOXED_REWARDS": "[" + ", ".join(f"'{t}'" for t in SANDBOXED_REWARDS) + "]",
    "SANDBOXED_TOOLS": "[" + ", ".join(f"'{t}'" for t in SANDBOXED_TOOLS) + "]",
    # environment variable names that hold credentials (matched case-insensitively, anywhere in the name)
    "CREDENTIAL_NAME": "'(?i)(PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)'",
    # checkpoint storage: pods of the RayJob (the head, the trainer pool, a separate rollout pool)
    "PODS": (
        "(1 + self.cluster.trainer.nodes + (self.rollout.placement == 'separate' && has(self.cluster.rollout)"
        " ? self.cluster.rollout.nodes : 0))"
    ),
    "ON_CLAIM": "(has(self.storage.claimName) || has(self.storage.claim))",
    "CKPT_DIR": "self.trainer.checkpointDir",
    # runPolicy.backoffLimit of a job without a claim (its default is 0 there: kuberl.api.spec.backoff_limit)
    "RETRIES_OFF_CLAIM": "(has(self.runPolicy.backoffLimit) ? self.runPolicy.backoffLimit : 0)",
}

# The literal env values of one RLJob, all together: with every other field bounded by its schema, the spec stays
# far below the annotation and object limits that kopf's bookkeeping and the ConfigMap copy of the spec live under.
MAX_LITERAL_ENV_BYTES = 16384

# The checks of verl's that rules mirror (`Rule.verl` names one), with where verl makes them. B: data.train_batch_size,
# n: rollout.n, M: ppo_mini_batch_size, m: ppo_micro_batch_size_per_gpu, G: GPUs, dp: data-parallel ranks.
VERL_CHECKS: dict[str, str] = {
    "R1": "`(B·n) % G == 0` (`verl/utils/config.py::validate_config`; `DataProto.chunk` asserts it at run time)",
    "R3": "`B >= ppo_mini_batch_size` (`verl/workers/config/actor.py`, `critic.py`: `validate`)",
    "R4": "a micro-batch size is set unless `use_dynamic_bsz` (`verl/workers/config/actor.py::__post_init__`)",
    "R6": "`M·n // dp > 0` and `(M·n // dp) % m == 0`; the division floors silently (`verl/workers/fsdp_workers.py`)",
    "R8": "`clip_ratio_c > 1.0` (`verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla`)",
    "R10": "token budget `>= max_prompt_length + max_response_length` (`verl/utils/seqlen_balancing.py`)",
    "R11": "rollout GPUs divisible by the engine's TP·DP·PP (`verl/workers/fsdp_workers.py::_build_rollout`)",
    "R14": "`val_kwargs.do_sample` needs `temperature > 0` (`verl/utils/config.py`)",
    "R15": "LoRA rank within vLLM's largest (`verl/workers/rollout/vllm_rollout/utils.py::get_vllm_max_lora_rank`)",
    "R16": "adaptive KL control needs `horizon > 0` (`verl/trainer/ppo/core_algos.py::get_kl_controller`)",
    "R18": "a non-empty validation loader (`verl/trainer/ppo/ray_trainer.py`)",
    "R19": "a resume path contains `global_step_` (`verl/trainer/ppo/ray_trainer.py`)",
}


@dataclass(frozen=True)
class Rule:
    id: str
    field: str
    """Path of the field the error is reported on, relative to the rule's scope."""
    rule: str
    message: str
    verl: str
    """The key in VERL_CHECKS of the verl check it mirrors, or "ours"."""
    scope: Literal["spec", "root"] = "spec"

    @property
    def cel(self) -> str:
        """Expanded on every read (cached per state of the table): the engine macros follow the engine table
        (kuberl.api.engines)."""
        return expand(self.rule)

    @property
    def message_expression(self) -> str:
        return message_to_cel(self.message)

    @property
    def static_message(self) -> str:
        """The message with each `${expr}` shown as `<expr>`: the apiserver's fallback text."""
        return _TEMPLATE.sub(lambda m: "<" + m.group(1).replace("self.", "") + ">", self.message)

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule

    @property
    def path(self) -> str:
        """The reported field as a path from the object root."""
        return f"spec.{self.field}" if self.scope == "spec" else self.field


def engine_macros() -> dict[str, str]:
    """The engine table (kuberl.api.engines) as CEL, as it stands now: each engine set as a list (``ENGINES_ON_CPU``)
    and as the text of a message (``ENGINES_ON_CPU_NAMES``), and ``LORA_RANK_LIMITS``, a map of the engines that
    limit LoRA's rank."""
    out: dict[str, str] = {}
    for name in ENGINE_SETS:
        engines = engines_where(name)
        out[name] = "[" + ", ".join(f"'{e}'" for e in engines) + "]"
        out[f"{name}_NAMES"] = "'" + (", ".join(engines) or "none") + "'"
    limits = {name: caps.max_lora_rank for name, caps in ENGINES.items() if caps.max_lora_rank is not None}
    out["LORA_RANK_LIMITS"] = "{" + ", ".join(f"'{e}': {rank}" for e, rank in limits.items()) + "}"
    return out


_ENGINE_MACROS = [*ENGINE_SETS, *(f"{name}_NAMES" for name in ENGINE_SETS), "LORA_RANK_LIMITS"]
_MACRO = re.compile(r"\b(" + "|".join([*MACROS, *_ENGINE_MACROS]) + r")\b")
_TEMPLATE = re.compile(r"\$\{(.+?)\}")


def expand(expr: str) -> str:
    """``expr`` with its macros written out, the engine macros as the engine table stands now."""
    return _expand(expr, tuple(ENGINES.items()))


@cache
def _expand(expr: str, engines: tuple[tuple[str, EngineCapabilities], ...]) -> str:
    """Cached per expression and state of the engine table (``engines``, the state :func:`engine_macros` reads):
    validation expands every rule of every document it checks."""
    macros = {**MACROS, **engine_macros()}
    return _MACRO.sub(lambda m: macros[m.group(1)], expr)


def message_to_cel(template: str) -> str:
    """`"a ${x} b ${y}"` → `'a %s b %s'.format([x, y])` (see kuberl.api.celfuncs for why format)."""
    literal = _TEMPLATE.sub("\x00", template).replace("%", "%%").replace("\x00", "%s")
    args = [expand(m.group(1)) for m in _TEMPLATE.finditer(template)]
    text = _cel_string(literal)
    return f"{text}.format([{', '.join(args)}])" if args else text


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- remote sources (issue 19) ---
# What the trainer can load (kuberl.trainer.data.sources): local paths, hf:// through the hub cache, s3:// through
# fsspec; tiny:// test models for model paths. Any other URL, and a bare hub id (ORG/NAME, which would be read
# as a relative folder and fail on the cluster), is refused here, offline and at admission.
URL_SCHEME = "^[A-Za-z][A-Za-z0-9+.-]*://"
MODEL_SOURCE = "^(tiny://|hf://[^/@]+/[^/@]+(@.+)?$|s3://[^/]+/.)"
DATA_SOURCE = "^(hf://datasets/[^/@]+/[^/@]+(@[^/]+)?/.|s3://[^/]+/.)"
HUB_ID = "^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$"
MODEL_SOURCES_HELP = (
    "use a local path (absolute, or ./ for a relative folder), hf://ORG/NAME[@REVISION] (Hugging Face hub through "
    "its cache; HF_HUB_OFFLINE honoured), s3://BUCKET/PREFIX, a .gguf file, smollm2 or tiny://"
)
DATA_SOURCES_HELP = "use a local path, s3://BUCKET/KEY or hf://datasets/ORG/NAME[@REVISION]/FILE"


def model_source_ok(value: str) -> str:
    """CEL: the string expression ``value`` names a model source the trainer loads."""
    return (
        f"({value}.matches('{MODEL_SOURCE}') || (!{value}.matches('{URL_SCHEME}')"
        f" && ({value}.endsWith('.gguf') || !{value}.matches('{HUB_ID}'))))"
    )


def data_source_ok(value: str) -> str:
    """CEL: the string expression ``value`` names a data file the trainer reads."""
    return f"({value}.matches('{DATA_SOURCE}') || !{value}.matches('{URL_SCHEME}'))"


def model_source_rule(field: str, guard: str = "") -> Rule:
    value = f"self.{field}"
    return Rule(
        id=f"{field.replace('.', '-').lower()}-source",
        field=field,
        rule=f"{guard}{model_source_ok(value)}",
        message=f"{field} ${{{value}}} is not a source the trainer can load: {MODEL_SOURCES_HELP}"
        f"${{{value}.matches('{HUB_ID}') ? '; for the hub model write hf://' + {value} : ''}}",
        verl="ours",
    )


def data_files_rule(field: str) -> Rule:
    files = f"self.{field}"
    return Rule(
        id=f"{field.replace('.', '-').lower()}-source",
        field=field,
        rule=f"{files}.all(f, {data_source_ok('f')})",
        message=f"{field} entry ${{{files}.filter(f, !{data_source_ok('f')})[0]}} is not a file the trainer can "
        f"read: {DATA_SOURCES_HELP}",
        verl="ours",
    )


STORAGE_RULES: tuple[Rule, ...] = (
    Rule(
        id="storage-one-source",
        field="storage",
        rule="!(has(self.storage.claimName) && has(self.storage.claim))",
        message="storage.claimName and storage.claim are exclusive: name an existing claim or give a template for "
        "the operator to create, not both",
        verl="ours",
    ),
    Rule(
        id="claim-shared-by-pods",
        field="storage.claim.accessMode",
        rule="!has(self.storage.claim) || PODS <= 1 || self.storage.claim.accessMode == 'ReadWriteMany'",
        message="storage.claim.accessMode = ${self.storage.claim.accessMode} but ${PODS} pods (the Ray head and "
        "every worker) write checkpoints: use ReadWriteMany (and a storage class that offers it)",
        verl="ours",
    ),
    Rule(
        id="checkpoint-dir-on-claim",
        field="trainer.checkpointDir",
        rule=f"!ON_CLAIM || !CKPT_DIR.startsWith('/') || CKPT_DIR == '{CHECKPOINT_MOUNT}'"
        f" || CKPT_DIR.startsWith('{CHECKPOINT_MOUNT}/')",
        message=f"trainer.checkpointDir = ${{CKPT_DIR}} is outside the checkpoint claim mounted at {CHECKPOINT_MOUNT}: "
        "use a relative path (it is resolved on the claim)",
        verl="ours",
    ),
    Rule(
        id="checkpoints-survive-pods",
        field="trainer.checkpointDir",
        rule="ON_CLAIM || (PODS <= 1 && RETRIES_OFF_CLAIM == 0) || (CKPT_DIR.startsWith('/')"
        " && self.cluster.volumeMounts.exists(m, !m.readOnly"
        " && (CKPT_DIR == m.mountPath || CKPT_DIR.startsWith(m.mountPath + '/'))))",
        message="trainer.checkpointDir = ${CKPT_DIR} is on no volume every pod mounts, so checkpoints die with the "
        "pod (${PODS} pods, runPolicy.backoffLimit = ${RETRIES_OFF_CLAIM}): set storage.claim (a claim "
        "the operator creates) or storage.claimName, or mount a shared writable volume there (cluster.volumes, "
        "cluster.volumeMounts)",
        verl="ours",
    ),
)


def unchanged_but(new: str, old: str, model: type[SpecModel], field: str) -> str:
    """CEL: the objects `new` and `old` of type `model` are equal in every field but `field` (an optional field
    absent from both counts as equal)."""
    checks = []
    for name, info in model.model_fields.items():
        if name == field:
            continue
        key = info.alias or name
        if info.default is None:
            checks.append(f"has({new}.{key}) == has({old}.{key}) && (!has({new}.{key}) || {new}.{key} == {old}.{key})")
        else:
            checks.append(f"{new}.{key} == {old}.{key}")
    return " && ".join(f"({check})" for check in checks)


# spec fields a running trainer cannot honour: what it trains (model, data, reward), where its checkpoints are and
# the pools its Ray cluster was built with
RUN_FIELDS = ("model", "data", "reward", "storage")
# ... but the size of the separate rollout pool: the operator resizes the running Ray cluster's rollout worker group
# and the trainer takes engines in and out as their pods come and go (docs/operator.md, Resizing the rollout pool).
ELASTIC_POOL_FIELD = "nodes"
RUN_RULES: tuple[Rule, ...] = (
    Rule(
        id="run-fields-immutable-while-active",
        field="spec",
        rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ACTIVE_PHASES) || ("
        + " && ".join(f"self.spec.{f} == oldSelf.spec.{f}" for f in RUN_FIELDS)
        + " && self.spec.cluster.trainer == oldSelf.spec.cluster.trainer"
        " && has(self.spec.cluster.rollout) == has(oldSelf.spec.cluster.rollout)"
        " && (!has(self.spec.cluster.rollout) || "
        + unchanged_but("self.spec.cluster.rollout", "oldSelf.spec.cluster.rollout", NodePool, ELASTIC_POOL_FIELD)
        + "))",
        message="spec.model, data, reward, storage, cluster.trainer and cluster.rollout (all but its nodes, the size of "
        "the rollout pool, which is resized in place) cannot change while the job is ${oldSelf.status.phase}: the "
        "running trainer and its pods would not follow; suspend it first (runPolicy.suspend: true)",
        verl="ours",
        scope="root",
    ),
)

# failures and stalls (issue 14): a stalled job is flagged before it is ended
STALL_RULES: tuple[Rule, ...] = (
    Rule(
        id="stall-deadline-after-timeout",
        field="runPolicy.stallDeadlineSeconds",
        rule="!has(self.runPolicy.stallDeadlineSeconds)"
        " || self.runPolicy.stallDeadlineSeconds >= self.runPolicy.stallTimeoutSeconds",
        message="runPolicy.stallDeadlineSeconds = ${self.runPolicy.stallDeadlineSeconds} is shorter than "
        "runPolicy.stallTimeoutSeconds = ${self.runPolicy.stallTimeoutSeconds}: a job is flagged Stalled before it "
        "is ended",
        verl="ours",
    ),
)

POD_RULES = frozenset(rule.id for rule in STORAGE_RULES)
"""Rules about the pods of a RayJob: the apiserver, the operator and `kuberl validate` apply them; a trainer on
one machine (`kuberl run`) has one filesystem and skips them."""

RULES: tuple[Rule, ...] = (
    Rule(
        id="responses-divisible-by-dp",
        field="batch.trainBatchSize",
        rule="RESPONSES % DP == 0",
        message="batch.trainBatchSize × rolloutN = ${RESPONSES} responses per step is not divisible by "
        "${DP} trainer GPUs (cluster.trainer.nodes × gpusPerNode)",
        verl="R1",
    ),
    Rule(
        id="mini-batch-within-train-batch",
        field="batch.ppoMiniBatchSize",
        rule="self.batch.ppoMiniBatchSize <= self.batch.trainBatchSize",
        message="batch.ppoMiniBatchSize = ${self.batch.ppoMiniBatchSize} prompts exceeds "
        "batch.trainBatchSize = ${self.batch.trainBatchSize} prompts per step",
        verl="R3",
    ),
    Rule(
        id="mini-batches-whole",
        field="batch.ppoMiniBatchSize",
        rule="self.batch.ppoMiniBatchSize > self.batch.trainBatchSize"
        " || self.batch.trainBatchSize % self.batch.ppoMiniBatchSize == 0",
        message="batch.trainBatchSize = ${self.batch.trainBatchSize} is not a multiple of batch.ppoMiniBatchSize = "
        "${self.batch.ppoMiniBatchSize}: verl would run a smaller last mini-batch",
        verl="ours",
    ),
    Rule(
        id="mini-batch-divisible-by-dp",
        field="batch.ppoMiniBatchSize",
        rule="MINI_RESPONSES % DP == 0",
        message="batch.ppoMiniBatchSize × rolloutN = ${MINI_RESPONSES} is not divisible by ${DP} trainer GPUs "
        "(verl floors it to ${MINI_RESPONSES / DP} per GPU)",
        verl="R6",
    ),
    Rule(
        id="micro-batch-required",
        field="batch.ppoMicroBatchSizePerGPU",
        rule="DYNAMIC || has(self.batch.ppoMicroBatchSizePerGPU)",
        message="batch.ppoMicroBatchSizePerGPU is required unless batch.dynamicBatchSize.enabled is true",
        verl="R4",
    ),
    Rule(
        id="micro-batch-divides-mini-batch",
        field="batch.ppoMicroBatchSizePerGPU",
        rule="DYNAMIC || !has(self.batch.ppoMicroBatchSizePerGPU) || MINI_RESPONSES % DP != 0"
        " || (MINI_RESPONSES / DP) % self.batch.ppoMicroBatchSizePerGPU == 0",
        message="per-GPU mini-batch of ${MINI_RESPONSES / DP} responses (ppoMiniBatchSize × rolloutN / ${DP} GPUs) "
        "is not divisible by batch.ppoMicroBatchSizePerGPU = ${self.batch.ppoMicroBatchSizePerGPU}",
        verl="R6",
    ),
    Rule(
        id="critic-micro-batch-divides-mini-batch",
        field="critic.ppoMicroBatchSizePerGPU",
        rule="!has(self.critic) || !has(self.critic.ppoMicroBatchSizePerGPU) || DYNAMIC || MINI_RESPONSES % DP != 0"
        " || (MINI_RESPONSES / DP) % self.critic.ppoMicroBatchSizePerGPU == 0",
        message="per-GPU mini-batch of ${MINI_RESPONSES / DP} responses is not divisible by "
        "critic.ppoMicroBatchSizePerGPU = ${self.critic.ppoMicroBatchSizePerGPU}",
        verl="R6",
    ),
    Rule(
        id="token-budget-fits-sequence",
        field="batch.dynamicBatchSize.maxTokenLenPerGPU",
        rule="!DYNAMIC || !has(self.batch.dynamicBatchSize.maxTokenLenPerGPU)"
        " || self.batch.dynamicBatchSize.maxTokenLenPerGPU >= SEQ_LEN",
        message="batch.dynamicBatchSize.maxTokenLenPerGPU = ${self.batch.dynamicBatchSize.maxTokenLenPerGPU} is below "
        "data.maxPromptLength + maxResponseLength = ${SEQ_LEN}: one sequence would not fit a micro-batch",
        verl="R10",
    ),
    Rule(
        id="rollout-gpus-divisible-by-tp",
        field="rollout.tensorParallelSize",
        rule="ROLLOUT_GPUS % self.rollout.tensorParallelSize == 0",
        message="${ROLLOUT_GPUS} rollout GPUs are not divisible by rollout.tensorParallelSize = "
        "${self.rollout.tensorParallelSize}",
        verl="R11",
    ),
    Rule(
        id="dual-clip-above-one",
        field="algorithm.clipRatioC",
        rule="self.algorithm.clipRatioC > 1.0",
        message="algorithm.clipRatioC = ${self.algorithm.clipRatioC} must be greater than 1 (dual-clip lower bound)",
        verl="R8",
    ),
    Rule(
        id="val-sampling-needs-temperature",
        field="rollout.val.temperature",
        rule="!self.rollout.val.doSample || self.rollout.val.temperature > 0.0",
        message="rollout.val.doSample is true but rollout.val.temperature is ${self.rollout.val.temperature}; "
        "sampling needs a temperature above 0",
        verl="R14",
    ),
    Rule(
        id="adaptive-kl-needs-target",
        field="algorithm.kl",
        rule="self.algorithm.kl.control != 'adaptive' || (self.algorithm.kl.target > 0.0 && self.algorithm.kl.horizon > 0)",
        message="algorithm.kl.control is adaptive but target = ${self.algorithm.kl.target} and horizon = "
        "${self.algorithm.kl.horizon}; both must be above 0",
        verl="R16",
    ),
    Rule(
        id="group-estimator-needs-group",
        field="batch.rolloutN",
        rule="!(self.algorithm.advantageEstimator in ['grpo', 'rloo']) || self.batch.rolloutN >= 2",
        message="algorithm.advantageEstimator ${self.algorithm.advantageEstimator} compares responses within a group "
        "but batch.rolloutN = ${self.batch.rolloutN}; use rolloutN ≥ 2 (verl silently degrades)",
        verl="ours",
    ),
    Rule(
        id="group-needs-sampling",
        field="rollout.temperature",
        rule="self.batch.rolloutN == 1 || self.rollout.temperature > 0.0",
        message="batch.rolloutN = ${self.batch.rolloutN} responses per prompt at rollout.temperature 0 are identical; "
        "set a temperature above 0",
        verl="ours",
    ),
    Rule(
        id="gae-needs-critic",
        field="critic",
        rule="self.algorithm.advantageEstimator != 'gae' || has(self.critic)",
        message="algorithm.advantageEstimator gae needs a value model: add critic (critic: {} uses model.path)",
        verl="ours",
    ),
    Rule(
        id="separate-placement-needs-rollout-pool",
        field="cluster.rollout",
        rule="(self.rollout.placement == 'separate') == has(self.cluster.rollout)",
        message="${self.rollout.placement == 'separate' ? 'rollout.placement is separate but cluster.rollout is missing; "
        "add the rollout node pool' : 'cluster.rollout is set but rollout.placement is colocated; "
        "remove cluster.rollout or set rollout.placement: separate'}",
        verl="ours",
    ),
    # --- what the engine can do (kuberl.api.engines) ---
    Rule(
        id="engine-runs-on-device",
        field="rollout.engine",
        rule="self.rollout.engine in (self.cluster.device == 'cuda' ? ENGINES_ON_CUDA : ENGINES_ON_CPU)",
        message="rollout.engine ${self.rollout.engine} does not run on cluster.device ${self.cluster.device}; engines "
        "that do: ${self.cluster.device == 'cuda' ? ENGINES_ON_CUDA_NAMES : ENGINES_ON_CPU_NAMES}",
        verl="ours",
    ),
    Rule(
        id="engine-placement",
        field="rollout.engine",
        rule="self.rollout.placement == 'colocated' ? self.rollout.engine in COLOCATED_ENGINES"
        " : self.rollout.engine in (self.cluster.device == 'cuda' ? SEPARATE_ENGINES_ON_CUDA : SEPARATE_ENGINES_ON_CPU)",
        message="rollout.engine ${self.rollout.engine} cannot run ${self.rollout.placement} on cluster.device "
        "${self.cluster.device}; engines that can: ${self.rollout.placement == 'colocated' ? COLOCATED_ENGINES_NAMES "
        ": (self.cluster.device == 'cuda' ? SEPARATE_ENGINES_ON_CUDA_NAMES : SEPARATE_ENGINES_ON_CPU_NAMES)}",
        verl="ours",
    ),
    Rule(
        id="engine-tensor-parallel",
        field="rollout.tensorParallelSize",
        rule="self.rollout.tensorParallelSize == 1 || self.rollout.engine in TENSOR_PARALLEL_ENGINES",
        message="rollout.tensorParallelSize = ${self.rollout.tensorParallelSize} but rollout.engine "
        "${self.rollout.engine} runs one unsharded copy of the policy per engine; use 1, or an engine that shards "
        "it over GPUs: ${TENSOR_PARALLEL_ENGINES_NAMES}",
        verl="ours",
    ),
    Rule(
        id="engine-log-probs",
        field="rollout.calculateLogProbs",
        rule="!self.rollout.calculateLogProbs || self.rollout.engine in LOG_PROB_ENGINES",
        message="rollout.calculateLogProbs is true but rollout.engine ${self.rollout.engine} does not return the "
        "log-probs of the tokens it samples; engines that do: ${LOG_PROB_ENGINES_NAMES}",
        verl="ours",
    ),
    Rule(
        id="engine-overlap",
        field="rollout.overlap",
        rule="self.rollout.overlap == 'none' || self.rollout.engine in OVERLAP_ENGINES",
        message="rollout.overlap ${self.rollout.overlap} needs engines that generate while the trainer updates, "
        "which rollout.engine ${self.rollout.engine} cannot; engines that can: ${OVERLAP_ENGINES_NAMES}",
        verl="ours",
    ),
    Rule(
        id="top-k-valid",
        field="rollout.topK",
        rule="self.rollout.topK == -1 || self.rollout.topK >= 1",
        message="rollout.topK = ${self.rollout.topK}; use -1 (disabled) or a value ≥ 1",
        verl="ours",
    ),
    Rule(
        id="lora-rank-fits-engine",
        field="model.lora.rank",
        rule="!has(self.model.lora) || !(self.rollout.engine in LORA_RANK_LIMITS)"
        " || self.model.lora.rank <= LORA_RANK_LIMITS[self.rollout.engine]",
        message="model.lora.rank = ${self.model.lora.rank} exceeds the largest LoRA rank rollout.engine "
        "${self.rollout.engine} takes, ${LORA_RANK_LIMITS[self.rollout.engine]}",
        verl="R15",
    ),
    Rule(
        id="reward-model-reads-whole-sequence",
        field="reward.model.maxLength",
        rule="!has(self.reward.model) || self.reward.model.maxLength >= SEQ_LEN",
        message="reward.model.maxLength = ${self.reward.model.maxLength} is below data.maxPromptLength + "
        "maxResponseLength = ${SEQ_LEN}: the reward model would score truncated responses",
        verl="ours",
    ),
    Rule(
        id="periodic-validation-needs-files",
        field="trainer.testFreq",
        rule="self.trainer.testFreq <= 0 || size(self.data.valFiles) > 0",
        message="trainer.testFreq = ${self.trainer.testFreq} but data.valFiles is empty",
        verl="R18",
    ),
    Rule(
        id="resume-path",
        field="trainer.resume",
        rule="self.trainer.resume in ['auto', 'disable'] || self.trainer.resume.contains('global_step_')",
        message="trainer.resume = ${self.trainer.resume}; use auto, disable or a path to a global_step_N checkpoint",
        verl="R19",
    ),
    Rule(
        id="volume-mounts-name-volumes",
        field="cluster.volumeMounts",
        rule="self.cluster.volumeMounts.all(m, self.cluster.volumes.exists(v, v.name == m.name))",
        message="every cluster.volumeMounts[].name must name a volume in cluster.volumes",
        verl="ours",
    ),
    # --- policy losses, estimators and DAPO (issue 18) ---
    Rule(
        id="group-baseline-needs-group",
        field="batch.rolloutN",
        rule="!(self.algorithm.advantageEstimator in ['reinforce_plus_plus_baseline', 'opo', 'gpg', 'grpo_passk'])"
        " || self.batch.rolloutN >= 2",
        message="algorithm.advantageEstimator ${self.algorithm.advantageEstimator} takes its baseline from the other "
        "responses to the same prompt (grpo_passk: best minus second best) but batch.rolloutN = ${self.batch.rolloutN}; "
        "use rolloutN ≥ 2 (verl raises for grpo_passk and silently drops the baseline for the others)",
        verl="ours",
    ),
    Rule(
        id="filter-groups-needs-group",
        field="algorithm.filterGroups.enabled",
        rule="!self.algorithm.filterGroups.enabled || self.batch.rolloutN >= 2",
        message="algorithm.filterGroups drops groups whose responses all score the same, but batch.rolloutN = "
        "${self.batch.rolloutN} makes every group a single response; use rolloutN ≥ 2",
        verl="ours",
    ),
    Rule(
        id="filter-groups-metric-available",
        field="algorithm.filterGroups.metric",
        rule="!self.algorithm.filterGroups.enabled || !has(self.reward.model)"
        " || self.algorithm.filterGroups.metric in ['seq_reward', 'seq_final_reward']",
        message="algorithm.filterGroups.metric ${self.algorithm.filterGroups.metric} is read from the reward "
        "function's dict output, but reward.model scores without one; use seq_reward or seq_final_reward",
        verl="ours",
    ),
    Rule(
        id="overlong-buffer-within-response",
        field="reward.overlongBuffer.length",
        rule="!has(self.reward.overlongBuffer) || self.reward.overlongBuffer.length < self.data.maxResponseLength",
        message="reward.overlongBuffer.length = ${self.reward.overlongBuffer.length} must be below "
        "data.maxResponseLength = ${self.data.maxResponseLength}: the penalty ramps over the last length tokens",
        verl="ours",
    ),
    Rule(
        id="clip-cov-bounds-ordered",
        field="algorithm.policyLoss.clipCovLb",
        rule="self.algorithm.policyLoss.lossMode != 'clip_cov'"
        " || self.algorithm.policyLoss.clipCovLb < self.algorithm.policyLoss.clipCovUb",
        message="algorithm.policyLoss.clipCovLb = ${self.algorithm.policyLoss.clipCovLb} must be below clipCovUb = "
        "${self.algorithm.policyLoss.clipCovUb}: no token could be detached",
        verl="ours",
    ),
    # --- rollout correction (issue 17) ---
    Rule(
        id="rollout-correction-needs-rollout-log-probs",
        field="algorithm.rolloutCorrection.enabled",
        rule="!self.algorithm.rolloutCorrection.enabled || self.rollout.calculateLogProbs",
        message="algorithm.rolloutCorrection weighs each token by the trainer's over the rollout engine's "
        "probability, but rollout.calculateLogProbs is false; set it to true",
        verl="ours",
    ),
    Rule(
        id="rollout-correction-token-loss",
        field="algorithm.rolloutCorrection.enabled",
        rule="!self.algorithm.rolloutCorrection.enabled || self.algorithm.policyLoss.lossMode != 'geo_mean'",
        message="algorithm.rolloutCorrection weighs per-token losses, but algorithm.policyLoss.lossMode geo_mean "
        "has one loss per sequence; use another loss or disable the correction",
        verl="ours",
    ),
    # --- generation overlapped with training (issue 17) ---
    Rule(
        id="overlap-needs-separate-placement",
        field="rollout.overlap",
        rule="self.rollout.overlap == 'none' || self.rollout.placement == 'separate'",
        message="rollout.overlap ${self.rollout.overlap} generates the next batch while the trainer updates, but a "
        "colocated engine shares the trainer's devices and sleeps while training runs; set rollout.placement "
        "separate (with cluster.rollout) or rollout.overlap none",
        verl="ours",
    ),
    Rule(
        id="overlap-without-dynamic-sampling",
        field="rollout.overlap",
        rule="self.rollout.overlap == 'none' || !self.algorithm.filterGroups.enabled",
        message="rollout.overlap ${self.rollout.overlap} is not supported with algorithm.filterGroups: dynamic "
        "sampling draws extra prompt batches (and, for seq_final_reward, runs trainer passes) in the middle of a step, "
        "which the overlapped generation of the next batch would race; disable one of them",
        verl="ours",
    ),
    Rule(
        id="overlap-without-agent",
        field="rollout.overlap",
        rule="self.rollout.overlap == 'none' || !has(self.rollout.agent)",
        message="rollout.overlap ${self.rollout.overlap} is not supported with rollout.agent: the agent loop keeps "
        "one batch's trajectories on the driver until they are scored, so two batches cannot be in flight; set "
        "rollout.overlap none",
        verl="ours",
    ),
    Rule(
        id="max-staleness-needs-async",
        field="rollout.maxStaleness",
        rule="!has(self.rollout.maxStaleness) || self.rollout.overlap == 'async'",
        message="rollout.maxStaleness = ${self.rollout.maxStaleness} bounds the staleness of rollout.overlap async, "
        "but rollout.overlap is ${self.rollout.overlap}, whose staleness is fixed (${self.rollout.overlap == 'none' "
        "? '0' : 'exactly 1'}); set rollout.overlap async or remove rollout.maxStaleness",
        verl="ours",
    ),
    Rule(
        id="partial-rollouts-need-async",
        field="rollout.partialRollouts",
        rule="!self.rollout.partialRollouts || self.rollout.overlap == 'async'",
        message="rollout.partialRollouts continues generations in flight across a weight update, but with "
        "rollout.overlap ${self.rollout.overlap} no generation is in flight while the weights change; set "
        "rollout.overlap async or rollout.partialRollouts false",
        verl="ours",
    ),
    Rule(
        id="engine-partial-rollouts",
        field="rollout.partialRollouts",
        rule="!self.rollout.partialRollouts || self.rollout.engine in PARTIAL_ROLLOUT_ENGINES",
        message="rollout.partialRollouts continues a generation interrupted by a weight update with the new "
        "weights, which rollout.engine ${self.rollout.engine} cannot; engines that can: "
        "${PARTIAL_ROLLOUT_ENGINES_NAMES}",
        verl="ours",
    ),
    Rule(
        id="async-without-remax",
        field="rollout.overlap",
        rule="self.rollout.overlap != 'async' || self.algorithm.advantageEstimator != 'remax'",
        message="rollout.overlap async generates group by group, but algorithm.advantageEstimator remax needs each "
        "group's greedy baseline generated with the same weights as its samples; use rollout.overlap "
        "oneStepOffPolicy or another estimator (grpo, rloo)",
        verl="ours",
    ),
    # --- security (docs/security.md): secrets are referenced, never copied; the spec stays small -----------------
    Rule(
        id="no-literal-credentials",
        field="cluster.env",
        rule="!self.cluster.env.exists(e, has(e.value) && size(e.value) > 0 && e.name.matches(CREDENTIAL_NAME))",
        message="cluster.env ${self.cluster.env.filter(e, has(e.value) && size(e.value) > 0 && "
        "e.name.matches(CREDENTIAL_NAME))[0].name} looks like a credential given as a literal value: reference "
        "a Secret with valueFrom.secretKeyRef (or envFrom) instead; literal values are stored in the RLJob, its "
        "ConfigMap and the RayJob",
        verl="ours",
    ),
    Rule(
        id="literal-env-bounded",
        field="cluster.env",
        rule=f"self.cluster.env.map(e, has(e.value) ? size(e.value) : 0).sum() <= {MAX_LITERAL_ENV_BYTES}",
        message=f"cluster.env literal values total ${{self.cluster.env.map(e, has(e.value) ? size(e.value) : 0)"
        f".sum()}} characters, more than {MAX_LITERAL_ENV_BYTES}; put large values in a ConfigMap (valueFrom)",
        verl="ours",
    ),
    # --- pod settings and Kueue (issue 20) ---
    Rule(
        id="head-pod-labels-not-reserved",
        field="cluster.head.pod.labels",
        rule="self.cluster.head.pod.labels.all(k, !k.startsWith('kuberl.io/') && !k.startsWith('ray.io/'))",
        message="cluster.head.pod.labels sets a kuberl.io/ or ray.io/ label; those are the operator's and KubeRay's "
        "(kuberl.io/rljob, kuberl.io/pool, ray.io/cluster, ...): choose another key",
        verl="ours",
    ),
    Rule(
        id="head-extra-resources-are-extended",
        field="cluster.head.pod.extraResources",
        rule="self.cluster.head.pod.extraResources.all(k, k.contains('/') && k != 'nvidia.com/gpu')",
        message="cluster.head.pod.extraResources takes extended resources (domain/name, e.g. rdma/ib or "
        "vpc.amazonaws.com/efa); cpu and memory come from cluster.head.cpu/memory, GPUs from gpusPerNode",
        verl="ours",
    ),
    Rule(
        id="trainer-pod-labels-not-reserved",
        field="cluster.trainer.pod.labels",
        rule="self.cluster.trainer.pod.labels.all(k, !k.startsWith('kuberl.io/') && !k.startsWith('ray.io/'))",
        message="cluster.trainer.pod.labels sets a kuberl.io/ or ray.io/ label; those are the operator's and KubeRay's "
        "(kuberl.io/rljob, kuberl.io/pool, ray.io/cluster, ...): choose another key",
        verl="ours",
    ),
    Rule(
        id="trainer-extra-resources-are-extended",
        field="cluster.trainer.pod.extraResources",
        rule="self.cluster.trainer.pod.extraResources.all(k, k.contains('/') && k != 'nvidia.com/gpu')",
        message="cluster.trainer.pod.extraResources takes extended resources (domain/name, e.g. rdma/ib or "
        "vpc.amazonaws.com/efa); cpu and memory come from cluster.trainer.cpu/memory, GPUs from gpusPerNode",
        verl="ours",
    ),
    Rule(
        id="rollout-pod-labels-not-reserved",
        field="cluster.rollout.pod.labels",
        rule="!has(self.cluster.rollout) || self.cluster.rollout.pod.labels.all(k, !k.startsWith('kuberl.io/') && !k.startsWith('ray.io/'))",
        message="cluster.rollout.pod.labels sets a kuberl.io/ or ray.io/ label; those are the operator's and KubeRay's "
        "(kuberl.io/rljob, kuberl.io/pool, ray.io/cluster, ...): choose another key",
        verl="ours",
    ),
    Rule(
        id="rollout-extra-resources-are-extended",
        field="cluster.rollout.pod.extraResources",
        rule="!has(self.cluster.rollout) || self.cluster.rollout.pod.extraResources.all(k, k.contains('/') && k != 'nvidia.com/gpu')",
        message="cluster.rollout.pod.extraResources takes extended resources (domain/name, e.g. rdma/ib or "
        "vpc.amazonaws.com/efa); cpu and memory come from cluster.rollout.cpu/memory, GPUs from gpusPerNode",
        verl="ours",
    ),
    Rule(
        id="ib-hca-needs-ib",
        field="cluster.network.ibHca",
        rule="!has(self.cluster.network.ibHca) || !self.cluster.network.disableIB",
        message="cluster.network.ibHca names InfiniBand devices but cluster.network.disableIB is true; "
        "remove one of them",
        verl="ours",
    ),
    Rule(
        id="multikueue-needs-queue",
        field="cluster.managedBy",
        rule="!has(self.cluster.managedBy) || self.cluster.managedBy != 'kueue.x-k8s.io/multikueue'"
        " || has(self.cluster.queueName)",
        message="cluster.managedBy kueue.x-k8s.io/multikueue needs cluster.queueName: MultiKueue dispatches only "
        "RayJobs admitted through a LocalQueue",
        verl="ours",
    ),
    # --- remote sources (issue 19) ---
    model_source_rule("model.path"),
    model_source_rule("model.tokenizerPath", "!has(self.model.tokenizerPath) || "),
    model_source_rule("critic.modelPath", "!has(self.critic) || !has(self.critic.modelPath) || "),
    model_source_rule("reward.model.path", "!has(self.reward.model) || "),
    data_files_rule("data.trainFiles"),
    data_files_rule("data.valFiles"),
    # --- multi-turn agent rollouts (issue 21) ---
    Rule(
        id="agent-tools-or-environment",
        field="rollout.agent",
        rule="!has(self.rollout.agent) || (size(self.rollout.agent.tools) > 0) != has(self.rollout.agent.environment)",
        message="rollout.agent needs exactly one of tools (the policy calls them) and environment (it answers every "
        "turn); it has ${size(self.rollout.agent.tools)} tool(s) and "
        "${has(self.rollout.agent.environment) ? 'an' : 'no'} environment",
        verl="ours",
    ),
    Rule(
        id="agent-tool-names-unique",
        field="rollout.agent.tools",
        rule="!has(self.rollout.agent)"
        " || self.rollout.agent.tools.all(t, self.rollout.agent.tools.exists_one(u, u.name == t.name))",
        message="rollout.agent.tools names a tool twice (${self.rollout.agent.tools.filter(t, "
        "self.rollout.agent.tools.filter(u, u.name == t.name).size() > 1)[0].name}); the policy calls tools by name",
        verl="ours",
    ),
    Rule(
        id="agent-tool-function-resolvable",
        field="rollout.agent.tools",
        # the function's form (a builtin or module:function) is the field's pattern: a regex in CEL over 16 tools
        # exceeds the apiserver's cost budget
        rule="!has(self.rollout.agent) || self.rollout.agent.tools.all(t, has(t.function) || t.name in AGENT_BUILTIN_TOOLS)",
        message="rollout.agent.tools ${self.rollout.agent.tools.filter(t, !has(t.function) && !(t.name in "
        "AGENT_BUILTIN_TOOLS))[0].name} has no function and is not a builtin (calculator, python_expr, python): set "
        "function to a builtin or 'module:function' / 'file.py:function'",
        verl="ours",
    ),
    # --- rewards and numerics (issue 14) ---
    Rule(
        id="mlflow-needs-a-server",
        field="trainer.tracking",
        rule="!('mlflow' in self.trainer.loggers) || has(self.trainer.tracking.mlflowTrackingURI)",
        message="trainer.loggers names mlflow but trainer.tracking.mlflowTrackingURI is not set: give the tracking "
        "server's URL (http://mlflow.mlflow.svc:5000)",
        verl="ours",
    ),
    Rule(
        id="reward-on-error-needs-function",
        field="reward.onError",
        rule="self.reward.onError == 'fail' || !has(self.reward.model)",
        message="reward.onError ${self.reward.onError} scores the samples a reward function raised on as 0, but "
        "reward.model scores every sample or fails the step; use onError fail with a reward model",
        verl="ours",
    ),
    # --- sandboxes (issue 40) ---
    Rule(
        id="reward-sandbox-needs-function",
        field="reward.sandbox",
        rule="!has(self.reward.sandbox) || !has(self.reward.model)",
        message="reward.sandbox runs the policy's programs for a reward function, but reward.model scores with a "
        "model; remove one of them",
        verl="ours",
    ),
    Rule(
        id="sandboxed-reward-needs-pool",
        field="reward.sandbox",
        rule="!(self.reward.function in SANDBOXED_REWARDS) || has(self.reward.sandbox)",
        message="reward.function ${self.reward.function} runs the responses' programs in the job's sandbox pool, but "
        "reward.sandbox is not set: add it (reward.sandbox: {replicas: 1})",
        verl="ours",
    ),
    Rule(
        id="sandboxed-tool-needs-pool",
        field="rollout.agent.sandbox",
        rule="!has(self.rollout.agent) || has(self.rollout.agent.sandbox) || !self.rollout.agent.tools.exists(t, "
        "(has(t.function) ? t.function : t.name) in SANDBOXED_TOOLS)",
        message="rollout.agent.tools ${self.rollout.agent.tools.filter(t, (has(t.function) ? t.function : t.name) in "
        "SANDBOXED_TOOLS)[0].name} runs the policy's programs in the job's sandbox pool, but rollout.agent.sandbox is "
        "not set: add it (rollout.agent.sandbox: {replicas: 1})",
        verl="ours",
    ),
    Rule(
        id="name-fits-kuberay",
        field="metadata.name",
        rule=f"size(self.metadata.name) <= {MAX_NAME_LENGTH}"
        " && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        message="metadata.name ${self.metadata.name} must be at most "
        f"{MAX_NAME_LENGTH} characters of lower-case letters, digits "
        "and '-', starting with a letter (KubeRay's RayJob name limit)",
        verl="ours",
        scope="root",
    ),
    Rule(
        id="batch-algorithm-immutable-while-active",
        field="spec",
        rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ACTIVE_PHASES)"
        " || (self.spec.batch == oldSelf.spec.batch && self.spec.algorithm == oldSelf.spec.algorithm)",
        message="spec.batch and spec.algorithm cannot change while the job is ${oldSelf.status.phase}; "
        "suspend it first (runPolicy.suspend: true)",
        verl="ours",
        scope="root",
    ),
    *STORAGE_RULES,
    *RUN_RULES,
    *STALL_RULES,
)
