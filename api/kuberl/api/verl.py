"""verl's configuration keys and the RLJob fields they become: the one mapping table.

`kuberl import-verl` reads a verl run (Hydra overrides as on the command line of verl's example scripts, or a
verl YAML) through this table, `docs/api.md` shows it, and "did you mean" consults it for verl names written
into an RLJob. A key the table maps to None has no RLJob equivalent; the note says why, and the import lists it.
A key with `runs_as` changes what runs at any other value (Megatron, tensor or sequence parallelism): the import
refuses it, naming the key, unless `--lossy` drops it and says so.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from kuberl.api import yaml12
from kuberl.api.contract import API_VERSION, KIND, MAX_NAME_LENGTH
from kuberl.api.rules import HUB_ID
from kuberl.api.spec import Logger, RLJobSpec
from kuberl.api.verl_shell import Unknown

ARR = "actor_rollout_ref"
HF_SCHEME = "hf://"
KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3", "abs": "abs"}


@dataclass(frozen=True)
class VerlKey:
    verl: str
    """The dotted verl key; `*` matches one or more trailing names (`algorithm.filter_groups.*`)."""
    rljob: str | None
    """The RLJob field below spec (wire names), `metadata.name`, or None: no equivalent."""
    note: str = ""
    """How the value changes on the way, or why there is no equivalent."""
    values: dict[Any, Any] = field(default_factory=dict)
    """verl value → RLJob value where the names differ (`low_var_kl` → `k3`)."""
    as_list: bool = False
    """verl takes one path or a list; RLJobs always a list."""
    model_source: bool = False
    """A model path: verl loads a bare hub id (`Qwen/Qwen2-7B-Instruct`) from the hub, an RLJob spells it hf://."""
    aliases: dict[Any, Any] = field(default_factory=dict)
    """verl values that stand for another (`lr_warmup_steps: -1` is 0 steps); other values pass unchanged."""
    runs_as: tuple[Any, ...] | None = None
    """For a key without an RLJob field: the values kuberl runs as verl does. Any other value changes what runs, so
    the import refuses it (or drops it with --lossy). None: no value changes what runs."""

    def runs_the_same(self, value: Any) -> bool:
        return self.runs_as is None or value in self.runs_as or (value is None and None in self.runs_as)

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.verl)

    def convert(self, value: Any) -> Any:
        value = self.aliases.get(value, value) if isinstance(value, (str, int, float, bool)) else value
        if self.as_list and not isinstance(value, list):
            return [value]
        if self.model_source and isinstance(value, str) and is_hub_id(value):
            return HF_SCHEME + value
        if self.values:
            if value not in self.values:
                raise ValueError(f"kuberl knows {', '.join(map(str, self.values))}")
            return self.values[value]
        return value

    def convert_back(self, value: Any) -> Any:
        """The verl value of an RLJob value: the round trip's other half."""
        if self.values:
            return next(k for k, v in self.values.items() if v == value)
        if self.model_source and isinstance(value, str):
            return value.removeprefix(HF_SCHEME)
        return value


def _key(verl: str, rljob: str | None, note: str = "", **kwargs: Any) -> VerlKey:
    return VerlKey(verl, rljob, note, **kwargs)


NO_MEGATRON = "the trainer is FSDP2 only: Megatron, and its tensor/pipeline/context/expert parallelism, do not run"
NO_ULYSSES = "sequence (Ulysses) parallelism is not implemented: every rank holds whole sequences"
MEGATRON_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")

VERL_KEYS: list[VerlKey] = [
    # data
    _key("data.train_files", "data.trainFiles", "one path or a list", as_list=True),
    _key("data.val_files", "data.valFiles", "one path or a list", as_list=True),
    _key("data.train_batch_size", "batch.trainBatchSize", "prompts per step, global"),
    _key("data.max_prompt_length", "data.maxPromptLength"),
    _key("data.max_response_length", "data.maxResponseLength"),
    _key("data.filter_overlong_prompts", "data.filterOverlongPrompts"),
    _key("data.prompt_key", "data.promptKey"),
    _key("data.shuffle", "data.shuffle"),
    _key("data.seed", "data.seed"),
    _key("data.val_batch_size", None, "the trainer sends the whole validation set to the engines at once"),
    _key(
        "data.truncation",
        None,
        "kuberl never truncates prompts: over-long ones fail, or are dropped and counted "
        "with data.filterOverlongPrompts",
    ),
    _key(
        "data.gen_batch_size",
        None,
        "each dynamic-sampling round (algorithm.filterGroups) draws trainBatchSize prompts; a larger "
        "generation batch is not offered",
    ),
    _key("data.return_raw_chat", None, "the trainer always keeps the chat-format prompt"),
    # model
    _key(f"{ARR}.model.path", "model.path", "a bare hub id becomes hf://ORG/NAME", model_source=True),
    _key(f"{ARR}.model.enable_gradient_checkpointing", "model.gradientCheckpointing"),
    _key(f"{ARR}.model.lora_rank", "model.lora.rank", "0 (verl's off) is no lora section"),
    _key(f"{ARR}.model.lora_alpha", "model.lora.alpha", "read only with lora_rank > 0, as verl reads it"),
    _key(f"{ARR}.model.target_modules", "model.lora.targetModules", "read only with lora_rank > 0", as_list=True),
    _key(f"{ARR}.model.lora.rank", None, "Megatron's LoRA; FSDP's is model.lora_rank", runs_as=(0, None)),
    _key(f"{ARR}.model.lora.*", None, "Megatron's LoRA settings; FSDP's are model.lora_*"),
    _key(f"{ARR}.model.use_remove_padding", None, "not a setting: the trainer packs responses itself"),
    _key(f"{ARR}.model.override_config.*", None, "the model's config is used as saved"),
    _key(f"{ARR}.model.use_fused_kernels", None, "not a setting: the output head's log-probs are always fused"),
    _key(
        f"{ARR}.actor.use_torch_compile",
        "model.compile",
        "verl compiles its log-prob and entropy functions, kuberl the decoder layers",
    ),
    # actor
    _key(f"{ARR}.actor.optim.lr", "actor.optim.lr"),
    _key(f"{ARR}.actor.optim.weight_decay", "actor.optim.weightDecay"),
    _key(
        f"{ARR}.actor.optim.lr_warmup_steps",
        "actor.optim.warmupSteps",
        "verl's -1 (use the ratio) is 0 here",
        aliases={-1: 0},
    ),
    _key(f"{ARR}.actor.optim.min_lr_ratio", "actor.optim.minLrRatio"),
    _key(
        f"{ARR}.actor.optim.warmup_style", "actor.optim.scheduler", values={"constant": "constant", "cosine": "cosine"}
    ),
    _key(f"{ARR}.actor.optim.lr_warmup_steps_ratio", None, "give actor.optim.warmupSteps in steps"),
    _key(f"{ARR}.actor.grad_clip", "actor.optim.gradClip"),
    _key(f"{ARR}.actor.ppo_mini_batch_size", "batch.ppoMiniBatchSize", "prompts per optimizer step, global"),
    _key(f"{ARR}.actor.ppo_micro_batch_size_per_gpu", "batch.ppoMicroBatchSizePerGPU", "responses, per GPU"),
    _key(
        f"{ARR}.actor.ppo_micro_batch_size",
        "batch.ppoMicroBatchSizePerGPU",
        "verl's deprecated global size: divided by the trainer GPUs",
    ),
    _key(f"{ARR}.actor.ppo_epochs", "batch.ppoEpochs"),
    _key(f"{ARR}.actor.use_dynamic_bsz", "batch.dynamicBatchSize.enabled"),
    _key(f"{ARR}.actor.ppo_max_token_len_per_gpu", "batch.dynamicBatchSize.maxTokenLenPerGPU"),
    _key(f"{ARR}.actor.use_kl_loss", "algorithm.kl.loss.enabled"),
    _key(f"{ARR}.actor.kl_loss_coef", "algorithm.kl.loss.coef"),
    _key(
        f"{ARR}.actor.kl_loss_type", "algorithm.kl.loss.type", "low_var_kl is k3, mse k2, kl k1", values=KL_ESTIMATORS
    ),
    _key(f"{ARR}.actor.clip_ratio", "algorithm.clipRatioLow", "sets clipRatioLow and clipRatioHigh"),
    _key(f"{ARR}.actor.clip_ratio_low", "algorithm.clipRatioLow"),
    _key(f"{ARR}.actor.clip_ratio_high", "algorithm.clipRatioHigh"),
    _key(f"{ARR}.actor.clip_ratio_c", "algorithm.clipRatioC"),
    _key(f"{ARR}.actor.policy_loss.loss_mode", "algorithm.policyLoss.lossMode", "same names; see Algorithms"),
    _key(f"{ARR}.actor.policy_loss.clip_cov_ratio", "algorithm.policyLoss.clipCovRatio"),
    _key(f"{ARR}.actor.policy_loss.clip_cov_lb", "algorithm.policyLoss.clipCovLb"),
    _key(f"{ARR}.actor.policy_loss.clip_cov_ub", "algorithm.policyLoss.clipCovUb"),
    _key(f"{ARR}.actor.policy_loss.kl_cov_ratio", "algorithm.policyLoss.klCovRatio"),
    _key(f"{ARR}.actor.policy_loss.ppo_kl_coef", "algorithm.policyLoss.ppoKlCoef"),
    _key(f"{ARR}.actor.loss_agg_mode", "algorithm.lossAggMode", "always normalised over the global mini-batch"),
    _key(
        f"{ARR}.actor.use_token_level_loss",
        "algorithm.lossAggMode",
        "verl's old switch: true is token-mean",
        values={True: "token-mean", False: "seq-mean-token-mean"},
    ),
    _key(f"{ARR}.actor.entropy_coeff", "algorithm.entropyCoef"),
    _key(f"{ARR}.actor.fsdp_config.param_offload", "actor.fsdp.paramOffload"),
    _key(f"{ARR}.actor.fsdp_config.optimizer_offload", "actor.fsdp.optimizerOffload"),
    _key(f"{ARR}.actor.fsdp_config.reshard_after_forward", "actor.fsdp.reshardAfterForward"),
    _key(f"{ARR}.actor.fsdp_config.grad_offload", None, "gradients stay on the GPU (FSDP2 has no gradient offload)"),
    _key(f"{ARR}.actor.fsdp_config.fsdp_size", None, "FSDP always spans every trainer GPU"),
    *(
        _key(f"{role}.{where}ulysses_sequence_parallel_size", None, NO_ULYSSES, runs_as=(1, None))
        for role in (f"{ARR}.actor", f"{ARR}.ref", "critic")
        for where in ("", "fsdp_config.", "fsdp.")
    ),
    *(
        _key(f"{role}.strategy", None, NO_MEGATRON, runs_as=("fsdp", "fsdp2", f"${{{ARR}.actor.strategy}}"))
        for role in (f"{ARR}.actor", f"{ARR}.ref", "critic")
    ),
    *(
        _key(f"{role}.megatron.{size}", None, NO_MEGATRON, runs_as=(1, None))
        for role in (f"{ARR}.actor", f"{ARR}.ref", "critic")
        for size in (*MEGATRON_SIZES, "expert_model_parallel_size", "virtual_pipeline_model_parallel_size")
    ),
    *(_key(f"{role}.megatron.*", None, NO_MEGATRON) for role in (f"{ARR}.actor", f"{ARR}.ref", "critic")),
    _key("model_engine", None, NO_MEGATRON, runs_as=("dp",)),
    # rollout
    _key(f"{ARR}.rollout.n", "batch.rolloutN", "responses per prompt"),
    _key(
        f"{ARR}.rollout.name",
        "rollout.engine",
        "vllm, or hf for CPU runs; SGLang and TensorRT-LLM do not run (--lossy: vLLM)",
        values={"vllm": "vllm", "hf": "hf"},
    ),
    _key(f"{ARR}.rollout.tensor_model_parallel_size", "rollout.tensorParallelSize", "default 1 here, 2 in verl"),
    *(
        _key(f"{ARR}.rollout.{size}", None, "a vLLM engine is tensor-parallel only", runs_as=(1, None))
        for size in ("pipeline_model_parallel_size", "data_parallel_size", "expert_parallel_size")
    ),
    _key(f"{ARR}.rollout.gpu_memory_utilization", "rollout.gpuMemoryUtilization", "fraction of total GPU memory"),
    _key(f"{ARR}.rollout.temperature", "rollout.temperature"),
    _key(f"{ARR}.rollout.top_p", "rollout.topP"),
    _key(f"{ARR}.rollout.top_k", "rollout.topK"),
    _key(f"{ARR}.rollout.max_num_batched_tokens", "rollout.maxNumBatchedTokens"),
    _key(f"{ARR}.rollout.max_num_seqs", "rollout.maxNumSeqs"),
    _key(f"{ARR}.rollout.enforce_eager", "rollout.enforceEager"),
    _key(f"{ARR}.rollout.calculate_log_probs", "rollout.calculateLogProbs"),
    _key(f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", "batch.logProbMicroBatchSizePerGPU", "responses, per GPU"),
    _key(
        f"{ARR}.rollout.log_prob_micro_batch_size",
        "batch.logProbMicroBatchSizePerGPU",
        "verl's deprecated global size: divided by the trainer GPUs",
    ),
    _key(f"{ARR}.rollout.log_prob_use_dynamic_bsz", None, "follows batch.dynamicBatchSize.enabled"),
    _key(f"{ARR}.rollout.log_prob_max_token_len_per_gpu", None, "follows batch.dynamicBatchSize.maxTokenLenPerGPU"),
    _key(f"{ARR}.rollout.val_kwargs.n", "rollout.val.rolloutN", "a bare `n:` key is a boolean in YAML 1.1"),
    _key(f"{ARR}.rollout.val_kwargs.temperature", "rollout.val.temperature"),
    _key(f"{ARR}.rollout.val_kwargs.top_p", "rollout.val.topP"),
    _key(f"{ARR}.rollout.val_kwargs.do_sample", "rollout.val.doSample"),
    _key(f"{ARR}.rollout.val_kwargs.top_k", None, "validation samples with top-k off"),
    _key(f"{ARR}.rollout.enable_chunked_prefill", None, "vLLM's own default (on) is used"),
    _key(f"{ARR}.rollout.mode", None, "the rollout is always the trainer's synchronous one"),
    _key(f"{ARR}.rollout.multi_turn.enable", "rollout.agent", "true: multi-turn rollouts (see Agentic rollouts)"),
    _key(f"{ARR}.rollout.multi_turn.max_assistant_turns", "rollout.agent.maxTurns", "with multi_turn.enable"),
    _key(
        f"{ARR}.rollout.multi_turn.format",
        "rollout.agent.callFormat",
        "with multi_turn.enable; hermes only",
        values={"hermes": "hermes"},
    ),
    _key(
        f"{ARR}.rollout.multi_turn.tool_config_path",
        "rollout.agent.tools",
        "the tools' names are read from the file; verl's tool classes do not run in kuberl: give each tool a "
        "function (docs/agentic.md)",
    ),
    _key(
        f"{ARR}.rollout.multi_turn.function_tool_path",
        None,
        "write each function as rollout.agent.tools[].function",
        runs_as=(None,),
    ),
    _key(
        f"{ARR}.rollout.multi_turn.interaction_config_path",
        None,
        "verl's interaction classes do not run in kuberl: write an environment class (rollout.agent.environment)",
        runs_as=(None,),
    ),
    _key(f"{ARR}.rollout.multi_turn.*", None, "kuberl's agent loop settings are rollout.agent's"),
    _key(
        f"{ARR}.rollout.agent.default_agent_loop",
        None,
        "single-turn, or multi-turn tool calls with multi_turn.enable (rollout.agent)",
        runs_as=("single_turn_agent", "tool_agent"),
    ),
    _key(f"{ARR}.hybrid_engine", None, "the rollout shares the trainer GPUs or has its own pool", runs_as=(True,)),
    # reference policy
    _key(
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
        "batch.logProbMicroBatchSizePerGPU",
        "one forward-only micro-batch for old and reference log-probs",
    ),
    _key(
        f"{ARR}.ref.log_prob_micro_batch_size",
        "batch.logProbMicroBatchSizePerGPU",
        "verl's deprecated global size: divided by the trainer GPUs",
    ),
    _key(f"{ARR}.ref.fsdp_config.param_offload", None, "the reference policy follows actor.fsdp.paramOffload"),
    _key(f"{ARR}.ref.log_prob_use_dynamic_bsz", None, "follows batch.dynamicBatchSize.enabled"),
    _key(f"{ARR}.ref.log_prob_max_token_len_per_gpu", None, "follows batch.dynamicBatchSize.maxTokenLenPerGPU"),
    _key(f"{ARR}.ref.ulysses_sequence_parallel_size", None, "sequence parallelism is not implemented"),
    # algorithm
    _key("algorithm.adv_estimator", "algorithm.advantageEstimator"),
    _key("algorithm.norm_adv_by_std_in_grpo", "algorithm.normAdvByStd"),
    _key("algorithm.gamma", "algorithm.gamma"),
    _key("algorithm.lam", "algorithm.lam"),
    _key("algorithm.use_kl_in_reward", "algorithm.kl.inReward"),
    _key("algorithm.kl_penalty", "algorithm.kl.type", "low_var_kl is k3, mse k2, kl k1", values=KL_ESTIMATORS),
    _key("algorithm.kl_ctrl.type", "algorithm.kl.control"),
    _key("algorithm.kl_ctrl.kl_coef", "algorithm.kl.coef"),
    _key("algorithm.kl_ctrl.target_kl", "algorithm.kl.target"),
    _key("algorithm.kl_ctrl.horizon", "algorithm.kl.horizon"),
    _key("algorithm.filter_groups.enable", "algorithm.filterGroups.enabled"),
    _key("algorithm.filter_groups.metric", "algorithm.filterGroups.metric"),
    _key(
        "algorithm.filter_groups.max_num_gen_batches",
        "algorithm.filterGroups.maxNumGenBatches",
        "0 (unbounded) is not offered",
    ),
    _key("algorithm.rollout_is", "algorithm.rolloutCorrection.enabled", "the weights multiply the policy loss"),
    _key(
        "algorithm.rollout_is_threshold",
        "algorithm.rolloutCorrection.threshold",
        "the metrics come with rolloutCorrection.enabled (verl reports them with the threshold alone)",
    ),
    _key(
        "algorithm.rollout_correction.rollout_is",
        "algorithm.rolloutCorrection.enabled",
        "token level only",
        values={"token": True},
    ),
    _key("algorithm.rollout_correction.rollout_is_threshold", "algorithm.rolloutCorrection.threshold"),
    _key("algorithm.rollout_correction.rollout_rs", None, "no rejection sampling", runs_as=(None,)),
    _key("algorithm.rollout_correction.bypass_mode", None, "old log-probs are always recomputed", runs_as=(False,)),
    _key("algorithm.use_pf_ppo", None, "no preference-feedback reweighting", runs_as=(False,)),
    _key("algorithm.rollout_is_level", None, "token level only"),
    _key("algorithm.rollout_is_mode", None, "truncate mode only (TIS); no rejection sampling"),
    _key("algorithm.rollout_is_threshold_lower", None, "truncate mode has no lower bound"),
    _key("algorithm.rollout_is_veto_threshold", None, "no veto: sequences are never dropped"),
    _key(
        f"{ARR}.actor.tis_imp_ratio_cap",
        None,
        "verl's earlier name: algorithm.rolloutCorrection {enabled: true, threshold: the cap}",
    ),
    # critic
    _key("critic.model.path", "critic.modelPath", "a bare hub id becomes hf://ORG/NAME", model_source=True),
    _key("critic.optim.lr", "critic.optim.lr"),
    _key("critic.optim.weight_decay", "critic.optim.weightDecay"),
    _key("critic.optim.lr_warmup_steps", "critic.optim.warmupSteps", "verl's -1 is 0 here", aliases={-1: 0}),
    _key("critic.grad_clip", "critic.optim.gradClip"),
    _key("critic.cliprange_value", "critic.cliprangeValue"),
    _key("critic.ppo_micro_batch_size_per_gpu", "critic.ppoMicroBatchSizePerGPU"),
    _key("critic.model.fsdp_config.param_offload", "critic.fsdp.paramOffload"),
    _key("critic.model.fsdp_config.optimizer_offload", "critic.fsdp.optimizerOffload"),
    _key("critic.fsdp.param_offload", "critic.fsdp.paramOffload"),
    _key("critic.fsdp.optimizer_offload", "critic.fsdp.optimizerOffload"),
    _key("critic.fsdp.reshard_after_forward", "critic.fsdp.reshardAfterForward"),
    _key("critic.model.enable_gradient_checkpointing", None, "the critic follows model.gradientCheckpointing"),
    _key("critic.model.use_remove_padding", None, "not a setting: the trainer packs responses itself"),
    _key("critic.ppo_max_token_len_per_gpu", None, "follows batch.dynamicBatchSize.maxTokenLenPerGPU"),
    _key("critic.use_dynamic_bsz", None, "follows batch.dynamicBatchSize.enabled"),
    # reward
    _key("custom_reward_function.path", "reward.function", 'with custom_reward_function.name: "file.py:name"'),
    _key("custom_reward_function.name", "reward.function", "the function in custom_reward_function.path"),
    _key("reward.custom_reward_function.path", "reward.function", 'with its name: "file.py:name"'),
    _key("reward.custom_reward_function.name", "reward.function", "the function in custom_reward_function.path"),
    _key("reward.reward_model.enable", None, "reward.model being set is the switch"),
    _key(
        "reward.reward_model.model_path", "reward.model.path", "a bare hub id becomes hf://ORG/NAME", model_source=True
    ),
    _key(
        "reward.reward_manager.name",
        None,
        "kuberl has one reward manager (verl's naive; DAPO's overlong shaping is reward.overlongBuffer)",
    ),
    *(
        entry
        for prefix in ("custom_reward_function", "reward_model")
        for entry in (
            _key(f"{prefix}.overlong_buffer.enable", None, "reward.overlongBuffer being set is the switch"),
            _key(f"{prefix}.overlong_buffer.len", "reward.overlongBuffer.length"),
            _key(f"{prefix}.overlong_buffer.penalty_factor", "reward.overlongBuffer.penaltyFactor"),
        )
    ),
    _key("reward_model.enable", None, "reward.model being set is the switch"),
    _key("reward_model.model.path", "reward.model.path", "a bare hub id becomes hf://ORG/NAME", model_source=True),
    _key("reward_model.micro_batch_size_per_gpu", "reward.model.microBatchSizePerGPU"),
    _key("reward_model.reward_manager", None, "kuberl has one reward manager (verl's naive)"),
    # trainer loop and cluster
    _key("trainer.nnodes", "cluster.trainer.nodes"),
    _key("trainer.n_gpus_per_node", "cluster.trainer.gpusPerNode"),
    _key("trainer.total_epochs", "trainer.totalEpochs"),
    _key("trainer.total_training_steps", "trainer.totalSteps"),
    _key("trainer.save_freq", "trainer.saveFreq", "in steps, not epochs"),
    _key("trainer.test_freq", "trainer.testFreq", "in steps, not epochs"),
    _key("trainer.val_before_train", "trainer.valBeforeTrain"),
    _key(
        "trainer.default_local_dir",
        None,
        "a path on one machine; checkpoints live on spec.storage (a claim every pod mounts) and "
        "trainer.checkpointDir is a relative path on it",
    ),
    _key(
        "trainer.resume_mode",
        "trainer.resume",
        "auto or disable; resume_path becomes the path itself",
        values={"auto": "auto", "disable": "disable"},
    ),
    _key("trainer.resume_from_path", "trainer.resume", "the global_step_N folder"),
    _key("trainer.max_actor_ckpt_to_keep", "trainer.maxCheckpoints"),
    _key(
        "trainer.logger",
        "trainer.loggers",
        "console, jsonl, tensorboard, wandb, mlflow; verl's others (swanlab, clearml, …) are listed, not imported",
        as_list=True,
    ),
    _key(
        "trainer.experiment_name",
        "metadata.name",
        "as a Kubernetes name (lower case, '-', at most 47); as written: trainer.tracking.runName",
    ),
    _key("trainer.project_name", "trainer.tracking.project", "W&B project and MLflow experiment"),
    _key("trainer.critic_warmup", None, "no critic warm-up phase", runs_as=(0, None)),
    _key("trainer.val_only", None, "kuberl trains; validation runs with trainer.testFreq", runs_as=(False,)),
    _key("trainer.use_v1", None, "verl's trainer generation; kuberl has one trainer"),
    _key("trainer.v1.trainer_mode", None, "steps are synchronous", runs_as=("sync",)),
    _key("trainer.device", "cluster.device", values={"cuda": "cuda", "cpu": "cpu"}),
    _key("trainer.use_legacy_worker_impl", None, "verl's worker choice; kuberl has one trainer"),
    _key("trainer.max_critic_ckpt_to_keep", None, "trainer.maxCheckpoints covers actor and critic"),
]

GLOBAL_MICRO_BATCH_KEYS = {
    f"{ARR}.actor.ppo_micro_batch_size",
    f"{ARR}.rollout.log_prob_micro_batch_size",
    f"{ARR}.ref.log_prob_micro_batch_size",
}

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


def lookup(key: str) -> VerlKey | None:
    return next((k for k in VERL_KEYS if k.matches(key)), None)


def suggestion_for(path: list[str]) -> str | None:
    """The RLJob field for a verl name written into an RLJob at `path` (below spec): `rollout.n` → `batch.rolloutN`.

    Matches verl keys that end with the path, so both `actor_rollout_ref.rollout.n` and `rollout.n` are found.
    """
    dotted = ".".join(path)
    for key in VERL_KEYS:
        if key.rljob and "*" not in key.verl and (key.verl == dotted or key.verl.endswith("." + dotted)):
            return key.rljob
    return None


# --- Hydra overrides ---------------------------------------------------------------

_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w.@/-]*)(?:=(.*))?$", re.DOTALL)


class VerlInputError(ValueError):
    """A verl run that cannot be imported: names the key (or the file and line), the value and the fix."""


def parse_override(token: str) -> tuple[str, str, Any] | None:
    """`[+|++|~]key[=value]` → (prefix, key, value read as Hydra reads it); None for a token that is not one."""
    match = _OVERRIDE.match(token)
    if not match or (match.group(3) is None and match.group(1) != "~"):
        return None
    prefix, key, raw = match.group(1) or "", match.group(2), match.group(3)
    return prefix, key, parse_value(raw, key) if raw is not None else None


def parse_value(raw: str, key: str) -> Any:
    """A Hydra value as verl's scripts write them: numbers, true/True, null, quoted strings, `[a,b]` lists."""
    if not raw.strip():
        return ""
    try:
        return yaml12.load(raw)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise VerlInputError(f"{key}={raw}: the value is not readable ({problem}); quote it as Hydra does") from exc


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """Hydra overrides (`key=value`, `+key=value`, `++key=value`) → {dotted key: value}; other tokens ignored."""
    overrides: dict[str, Any] = {}
    for token in tokens:
        parsed = parse_override(token)
        if parsed is not None and parsed[0] != "~":
            overrides[parsed[1]] = parsed[2]
    return overrides


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested verl YAML → {dotted key: leaf value}; lists are leaves."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


# --- turning it into an RLJob ------------------------------------------------------

MULTI_TURN = f"{ARR}.rollout.multi_turn"
LORA_RANK = f"{ARR}.model.lora_rank"
REWARD_FUNCTION_PATHS = ("custom_reward_function.path", "reward.custom_reward_function.path")


@dataclass
class Imported:
    document: dict[str, Any]
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, value, reason) for every key the run sets that has no RLJob equivalent and changes nothing."""
    dropped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, value, reason) for every key that changes what runs, left out with --lossy."""
    notes: list[str] = field(default_factory=list)
    """Conversions the user should know about (a global micro-batch divided, a value from verl's defaults)."""


class VerlRefused(ValueError):
    """Keys whose values kuberl cannot run as verl would; each named with its value and the reason."""

    def __init__(self, refusals: list[tuple[str, Any, str]]) -> None:
        self.refusals = refusals
        super().__init__("\n".join(f"{key}={shown(value)}: {reason}" for key, value, reason in refusals))


def shown(value: Any) -> str:
    """A value as the run wrote it: `${NNODES}`, `[console, wandb]`, `0.001`."""
    if isinstance(value, Unknown):
        return value.written or "?"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return repr(value)


def to_rljob(
    verl: dict[str, Any], name: str | None = None, *, lossy: bool = False, explicit: Collection[str] | None = None
) -> Imported:
    """An RLJob from verl's dotted keys as a run holds them; every key is mapped, listed with its reason, or refused.

    `explicit`: the keys the run sets itself (None: every key). A key from verl's defaults is imported only where
    its value differs from the RLJob's default, and listed only where it changes what runs. Keys whose values
    kuberl cannot run (VerlKey.runs_as, values outside VerlKey.values) raise VerlRefused, or with `lossy` are
    left out and listed in `dropped`.
    """
    spec: dict[str, Any] = {}
    result = Imported({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name or "verl-import"}})
    refusals: list[tuple[str, Any, str]] = []

    def set_by_run(key: str) -> bool:
        return explicit is None or key in explicit

    def refuse(key: str, value: Any, reason: str) -> None:
        (result.dropped if lossy else refusals).append((key, value, reason))

    for key, value in verl.items():
        entry = lookup(key)
        if isinstance(value, Unknown):
            if entry is None or (entry.rljob is None and entry.runs_as is None):
                result.unmapped.append((key, value, f"not imported ({value.reason})"))
                continue
            raise VerlInputError(f"{key}={shown(value)}: {value}")
        if entry is None:
            if set_by_run(key):
                result.unmapped.append((key, value, "not in kuberl's mapping table (docs/api.md): no RLJob equivalent"))
            continue
        if entry.rljob is None:
            if not entry.runs_the_same(value):
                refuse(key, value, entry.note)
            elif set_by_run(key):
                result.unmapped.append((key, value, entry.note))
            continue
        if value is None or value == MISSING_VALUE:
            continue
        if (off := _switched_off(key, verl)) is not None:
            if set_by_run(key):
                result.unmapped.append((key, value, off))
            continue
        if key == f"{MULTI_TURN}.tool_config_path":
            continue  # read with the agent below
        if key in GLOBAL_MICRO_BATCH_KEYS:
            gpus = _trainer_gpus(verl)
            per_gpu = max(1, _int(key, value) // gpus)
            result.notes.append(f"{key}={value} is global in verl: {entry.rljob} = {value} ÷ {gpus} GPUs = {per_gpu}")
            value = per_gpu
        elif key in REWARD_FUNCTION_PATHS:
            function_name = verl.get(key.removesuffix(".path") + ".name") or "compute_score"
            value = f"{value}:{function_name}"
        elif key.endswith("custom_reward_function.name"):
            continue  # joined with the path
        elif key == "trainer.resume_mode" and value == "resume_path":
            continue  # trainer.resume_from_path carries the path
        elif key == "trainer.experiment_name":
            if name is None:
                result.document["metadata"]["name"] = kubernetes_name(str(value))
            _put(spec, "trainer.tracking.runName", str(value))
            continue
        elif key == "trainer.logger":
            loggers = value if isinstance(value, list) else [value]
            value = [v for v in loggers if v in TRACKERS]
            result.unmapped += [
                (key, v, "a logger kuberl has not (it has " + ", ".join(TRACKERS) + ")")
                for v in loggers
                if v not in TRACKERS
            ]
        elif key in (LORA_RANK, f"{MULTI_TURN}.enable") and not value:
            continue
        elif key == f"{MULTI_TURN}.enable":
            value = _agent(verl, result)
        try:
            converted = entry.convert(value)
        except ValueError as exc:
            refuse(key, value, f"{exc}; {entry.note}")
            continue
        if not set_by_run(key):
            if converted == rljob_default(entry.rljob):
                continue
            result.notes.append(f"{key}={shown(value)} is verl's default: {entry.rljob} = {shown(converted)}")
        if entry.model_source and converted != value:
            result.notes.append(f"{key}={value} is a hub id, which verl downloads: {entry.rljob} = {converted}")
        _put(spec, entry.rljob, converted)
        if key == f"{ARR}.actor.clip_ratio":
            _put(spec, "algorithm.clipRatioHigh", converted)
    if refusals:
        raise VerlRefused(refusals)
    if spec.get("algorithm", {}).get("advantageEstimator", "gae") == "gae" and "critic" not in spec:
        spec["critic"] = {}  # verl's gae always trains a critic, initialised from the policy
    order = [f.alias or n for n, f in RLJobSpec.model_fields.items()]
    result.document["spec"] = {k: spec[k] for k in sorted(spec, key=order.index)}
    return result


MISSING_VALUE = "???"  # OmegaConf's mandatory value: verl's defaults leave it for the run to set
TRACKERS = get_args(Logger)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


READ_ONLY_WITH: list[tuple[tuple[str, ...], str, Callable[[Any], bool], str]] = [
    (("critic.",), "algorithm.adv_estimator", lambda v: v == "gae", "algorithm.adv_estimator=gae"),
    (("algorithm.filter_groups.",), "algorithm.filter_groups.enable", lambda v: v is True, "filter_groups.enable"),
    (("reward_model.model.", "reward_model.micro"), "reward_model.enable", lambda v: v is True, "reward_model.enable"),
    (("reward.reward_model.",), "reward.reward_model.enable", lambda v: v is True, "reward.reward_model.enable"),
    *(
        ((f"{prefix}.overlong_buffer.",), f"{prefix}.overlong_buffer.enable", lambda v: v is True, "its enable")
        for prefix in ("custom_reward_function", "reward_model")
    ),
    ((f"{ARR}.model.lora_alpha", f"{ARR}.model.target_modules"), LORA_RANK, _positive, "lora_rank > 0"),
    ((f"{MULTI_TURN}.",), f"{MULTI_TURN}.enable", lambda v: v is True, "multi_turn.enable"),
]
"""(key prefixes, the switch, its test, the switch as written): keys verl reads only when their switch is on."""


def _switched_off(key: str, verl: dict[str, Any]) -> str | None:
    """Why verl ignores `key` in this run (its switch is off), or None when verl reads it."""
    for prefixes, switch, on, written in READ_ONLY_WITH:
        if key.startswith(prefixes) and key != switch and not on(verl.get(switch)):
            return f"verl reads it only with {written}"
    return None


def _agent(verl: dict[str, Any], result: Imported) -> dict[str, Any]:
    """rollout.agent of a multi-turn run: its tools named from verl's tool config where the file can be read."""
    agent: dict[str, Any] = {"tools": []}
    path = verl.get(f"{MULTI_TURN}.tool_config_path")
    if not path:
        return agent
    try:
        config = yaml12.load(Path(str(path)).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        result.notes.append(
            f"{MULTI_TURN}.tool_config_path={path}: not read ({exc}); rollout.agent.tools needs a name and a "
            "function per tool (docs/agentic.md)"
        )
        return agent
    for tool in config.get("tools") or []:
        schema = (tool.get("tool_schema") or {}).get("function") or {}
        tool_name = schema.get("name") or str(tool.get("class_name", "tool")).rsplit(".", 1)[-1]
        agent["tools"].append({"name": tool_name})
        result.notes.append(
            f"{MULTI_TURN}.tool_config_path: tool {tool_name} is verl's class {tool.get('class_name')}, which does "
            f"not run in kuberl: set rollout.agent.tools[].function to a function taking its arguments "
            f"({', '.join((schema.get('parameters') or {}).get('properties') or {}) or 'none'})"
        )
    return agent


def rljob_default(path: str) -> Any:
    """The default of an RLJob field (wire path below spec); None where there is none."""
    model: Any = RLJobSpec
    parts = path.split(".")
    for depth, part in enumerate(parts):
        info = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if info is None:
            return None
        if depth == len(parts) - 1:
            if info.is_required():
                return None
            default = info.get_default(call_default_factory=True)
            return default.model_dump(by_alias=True) if isinstance(default, BaseModel) else default
        model = next(
            (
                t
                for t in (info.annotation, *get_args(info.annotation))
                if isinstance(t, type) and issubclass(t, BaseModel)
            ),
            None,
        )
        if model is None:
            return None
    return None


def _trainer_gpus(verl: dict[str, Any]) -> int:
    nodes = verl.get("trainer.nnodes", 1)
    per_node = verl.get("trainer.n_gpus_per_node", 8)
    return _int("trainer.nnodes", nodes) * _int("trainer.n_gpus_per_node", per_node)


def to_verl(spec: dict[str, Any]) -> dict[str, Any]:
    """The verl keys of an RLJob spec's directly mapped fields: the inverse of `to_rljob` for the round trip."""
    verl: dict[str, Any] = {}
    for entry in VERL_KEYS:
        if entry.rljob is None or "*" in entry.verl or entry.verl in GLOBAL_MICRO_BATCH_KEYS:
            continue
        value = value_at(spec, entry.rljob)
        if value is not None and entry.verl not in verl:
            try:
                verl[entry.verl] = entry.convert_back(value)
            except StopIteration:
                continue
    return verl


def is_hub_id(path: str) -> bool:
    """`ORG/NAME` as the rules read it: what a relative local path would not be written as (that is ./ORG/NAME)."""
    return bool(re.match(HUB_ID, path)) and not path.endswith(".gguf")


def kubernetes_name(text: str) -> str:
    """An RLJob name from free text, valid as admission reads it: `DAPO-Qwen2.5-7B` → `dapo-qwen2-5-7b`.

    Lower-case letters, digits and '-', starting with a letter, at most MAX_NAME_LENGTH (KubeRay's RayJob limit).
    """
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if name and not name[0].isalpha():
        name = f"verl-{name}"
    return name[:MAX_NAME_LENGTH].rstrip("-") or "verl-import"


def _int(key: str, value: Any) -> int:
    if isinstance(value, Unknown):
        raise VerlInputError(f"{key}={shown(value)}: {value}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise VerlInputError(f"{key}={shown(value)}: expected a whole number") from exc


def _put(node: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def value_at(node: Any, path: str) -> Any:
    """The value at a dotted `path` of nested mappings, or None."""
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
