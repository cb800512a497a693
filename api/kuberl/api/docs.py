"""Generate docs/api.md: every field with type, default and meaning, the rules table, and name mappings."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

from kuberl.api.contract import API_VERSION
from kuberl.api.crd import field_default
from kuberl.api.rules import RULES, VERL_CHECKS
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import RLJobStatus

# verl key → RLJob field. Where verl's name or a popular blog's name misleads, the note says how.
VERL_KEYS: list[tuple[str, str, str]] = [
    ("data.train_batch_size", "batch.trainBatchSize", "prompts per step, global"),
    ("actor_rollout_ref.rollout.n", "batch.rolloutN", "responses per prompt"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "batch.ppoMiniBatchSize", "prompts per optimizer step, global"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "batch.ppoMicroBatchSizePerGPU", "responses, per GPU"),
    (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "batch.logProbMicroBatchSizePerGPU",
        "responses, per GPU",
    ),
    ("actor_rollout_ref.actor.ppo_epochs", "batch.ppoEpochs", ""),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "batch.dynamicBatchSize.enabled", ""),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "batch.dynamicBatchSize.maxTokenLenPerGPU", ""),
    ("algorithm.adv_estimator", "algorithm.advantageEstimator", ""),
    ("algorithm.norm_adv_by_std_in_grpo", "algorithm.normAdvByStd", ""),
    ("algorithm.use_kl_in_reward / kl_ctrl.*", "algorithm.kl.inReward / coef / control / target / horizon", ""),
    (
        "actor.use_kl_loss / kl_loss_coef / kl_loss_type",
        "algorithm.kl.loss.enabled / coef / type",
        "verl's low_var_kl is k3, mse is k2",
    ),
    (
        "actor.clip_ratio_low / clip_ratio_high / clip_ratio_c",
        "algorithm.clipRatioLow / clipRatioHigh / clipRatioC",
        "",
    ),
    ("actor.loss_agg_mode", "algorithm.lossAggMode", "always normalised over the global mini-batch"),
    ("actor.entropy_coeff", "algorithm.entropyCoef", ""),
    ("critic.cliprange_value", "critic.cliprangeValue", ""),
    ("data.max_prompt_length / max_response_length", "data.maxPromptLength / maxResponseLength", ""),
    ("rollout.name", "rollout.engine", "vllm or hf"),
    ("rollout.tensor_model_parallel_size", "rollout.tensorParallelSize", "default 1 here, 2 in verl"),
    ("rollout.gpu_memory_utilization", "rollout.gpuMemoryUtilization", "fraction of total GPU memory"),
    (
        "rollout.val_kwargs.*",
        "rollout.val.*",
        "val_kwargs.n is rollout.val.rolloutN (a bare `n:` key is a boolean in YAML 1.1)",
    ),
    ("trainer.nnodes × n_gpus_per_node", "cluster.trainer.nodes × gpusPerNode", ""),
    ("trainer.save_freq / test_freq", "trainer.saveFreq / testFreq", "in steps, not epochs"),
    ("trainer.resume_mode / resume_from_path", "trainer.resume", "auto, disable, or the path"),
    ("trainer.max_actor_ckpt_to_keep", "trainer.maxCheckpoints", ""),
    ("custom_reward_function.path + name", "reward.function", '"file.py:function"'),
]

BLOG_NAMES: list[tuple[str, str, str]] = [
    (
        "rollout_batch_size",
        "batch.trainBatchSize × batch.rolloutN",
        "responses per step; verl has no such key, and there is one rollout per step",
    ),
    (
        "micro_batch_size",
        "batch.ppoMicroBatchSizePerGPU (and logProbMicroBatchSizePerGPU)",
        "per GPU and counted in responses, not global",
    ),
    (
        "gradient_accumulation_steps",
        "derived: ppoMiniBatchSize × rolloutN / GPUs / ppoMicroBatchSizePerGPU",
        "never configured; `kuberl validate` prints it",
    ),
    (
        "num_rollout_workers",
        "derived: rollout GPUs / rollout.tensorParallelSize engines",
        "unrelated to CPU cores or disk I/O",
    ),
    ("init_kl_coef", "algorithm.kl.coef (or algorithm.kl.loss.coef)", "verl's default is 0.001, not 0.1"),
    (
        "train_batch_size (as samples per PPO update)",
        "batch.ppoMiniBatchSize × rolloutN",
        "in verl train_batch_size counts prompts per step; the update uses mini-batches of it",
    ),
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args if a is not type(None))
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model inside `X`, `X | None` or `list[X]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        inner = _nested(arg)
        if inner:
            return inner
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        nested = _nested(field.annotation)
        if field.is_required():
            default = "required"
        else:
            value = field_default(field)
            default = "—" if value is None or nested else f"`{json.dumps(value, ensure_ascii=False)}`"
        description = _cell(field.description or "")
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {default} | {description} |")
        if nested and nested.model_fields:
            is_list = typing.get_origin(field.annotation) is list
            rows += _rows(nested, path + ("[]." if is_list else "."))
    return rows


def api_markdown() -> str:
    rule_rows = [f"| `{r.id}` | `{r.path}` | {r.verl} | `{_cell(r.rule)}` | {_cell(r.static_message)} |" for r in RULES]
    return "\n".join(
        [
            "<!-- Generated by `kuberl docs` from kuberl.api (spec models + rules table). Do not edit. -->",
            f"# RLJob API reference (`{API_VERSION}`)",
            "",
            "An RLJob declares one RL post-training run. Batch semantics are verl's: `trainBatchSize` prompts per "
            "step (global), `rolloutN` responses per prompt, `ppoMiniBatchSize` prompts per optimizer step (global), "
            "micro-batches per GPU counted in responses. Gradient accumulation is derived, never configured: "
            "`kuberl validate FILE` prints it with the other derived quantities.",
            "",
            "## Spec",
            "",
            "| field | type | default | meaning |",
            "|---|---|---|---|",
            *_rows(RLJobSpec, "spec."),
            "",
            "## Admission rules",
            "",
            "Checked by the apiserver (CEL `x-kubernetes-validations` in `crds/rljob.yaml`) and, with the same "
            "expressions and messages, by `kuberl validate`, the operator and the trainer. In rules, `DP` is "
            "`cluster.trainer.nodes × gpusPerNode`, `RESPONSES` is `trainBatchSize × rolloutN`, `MINI_RESPONSES` is "
            "`ppoMiniBatchSize × rolloutN`, `ROLLOUT_GPUS` the GPUs of the rollout pool (the trainer's when colocated). "
            "The verl column names the check of verl's it mirrors (listed below the table); where verl floors "
            "silently (R6) or only fails at run time, kuberl refuses at admission.",
            "",
            "| id | field | verl | rule | message |",
            "|---|---|---|---|---|",
            *rule_rows,
            "",
            "| verl | what verl checks, and where |",
            "|---|---|",
            *(f"| {key} | {_cell(check)} |" for key, check in VERL_CHECKS.items()),
            "",
            "## Status",
            "",
            "| field | type | default | meaning |",
            "|---|---|---|---|",
            *_rows(RLJobStatus, "status."),
            "",
            "## From verl's keys",
            "",
            "| verl | RLJob | note |",
            "|---|---|---|",
            *[f"| `{a}` | `{b}` | {c} |" for a, b, c in VERL_KEYS],
            "",
            "## From names used in popular blog posts",
            "",
            "These names are not verl keys; several mislead.",
            "",
            "| name | RLJob | where it misleads |",
            "|---|---|---|",
            *[f"| `{a}` | {b} | {c} |" for a, b, c in BLOG_NAMES],
            "",
        ]
    )
