"""`kuberl import-verl` on verl's example command lines: every key is mapped, listed or refused, and the mapped
ones come back unchanged through the table (RLJob → verl keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.verl import GLOBAL_MICRO_BATCH_KEYS, VERL_KEYS, lookup, to_rljob, to_verl
from kuberl.api.verl_import import read_run
from kuberl.cli import main


def overrides_from_script(text: str, **env: str) -> dict[str, Any]:
    """The run's own keys, as written (verl's defaults are not read here)."""
    return read_run(["-"], env=env, read_stdin=lambda: text, installed_verl=False).values


# verl examples/grpo_trainer/run_qwen2-7b.sh
GRPO = r"""
set -x

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_grpo_example_gsm8k' \
    trainer.experiment_name='qwen2_7b_function_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 $@
"""

# verl examples/ppo_trainer/run_deepseek7b_llm.sh
PPO = r"""
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    critic.optim.lr=1e-5 \
    critic.model.use_remove_padding=False \
    critic.model.path=deepseek-ai/deepseek-llm-7b-chat \
    critic.model.enable_gradient_checkpointing=True \
    critic.ppo_micro_batch_size_per_gpu=32 \
    critic.model.fsdp_config.param_offload=False \
    critic.model.fsdp_config.optimizer_offload=False \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger=['console'] \
    trainer.project_name='verl_example_gsm8k' \
    trainer.experiment_name='deepseek_llm_7b_function_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_training_steps=2 \
    trainer.use_legacy_worker_impl=False \
    trainer.total_epochs=15 $@

    # trainer.save_freq=20 \
    # trainer.test_freq=1 \
"""

# A DAPO run in the shape of verl's recipe scripts: settings in variables, read with defaults and arithmetic
DAPO = r"""#!/usr/bin/env bash
set -xeuo pipefail

project_name='DAPO'
exp_name='DAPO-Qwen2.5-7B-Math-Test'
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 2))
train_prompt_bsz=512
gen_prompt_bsz=$((train_prompt_bsz * 3))
NNODES=${NNODES:-4}
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}
TRAIN_FILE=${TRAIN_FILE:-"${RAY_DATA_HOME}/data/dapo-math-17k.parquet"}
TEST_FILE=${TEST_FILE:-"${RAY_DATA_HOME}/data/aime-2024.parquet"}
token_len=$((max_prompt_length + max_response_length))

python3 -m recipe.dapo.main_dapo \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${TEST_FILE}" \
    data.prompt_key=prompt \
    data.truncation='left' \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.gen_batch_size=${gen_prompt_bsz} \
    data.train_batch_size=${train_prompt_bsz} \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    algorithm.adv_estimator=grpo \
    algorithm.kl_ctrl.kl_coef=0.0 \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${token_len} \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=${token_len} \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=${token_len} \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    +actor_rollout_ref.model.override_config.attention_dropout=0. \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size=null \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=null \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=${token_len} \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k="-1" \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \
    actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.rollout.val_kwargs.n=1 \
    reward_model.reward_manager=dapo \
    custom_reward_function.overlong_buffer.enable=True \
    custom_reward_function.overlong_buffer.len=512 \
    trainer.logger=['console','wandb'] \
    trainer.project_name="${project_name}" \
    trainer.experiment_name="${exp_name}" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes="${NNODES}" \
    +trainer.val_before_train=True \
    trainer.test_freq=2 \
    trainer.save_freq=2 \
    trainer.total_epochs=1 \
    trainer.default_local_dir="/ckpts/DAPO" \
    trainer.resume_mode=disable
"""
DAPO_ENV = {"MODEL_PATH": "/models/Qwen2.5-Math-7B", "RAY_DATA_HOME": "/data"}

RUNS = {"grpo": GRPO, "ppo-with-critic": PPO, "dapo": DAPO}


ENVS: dict[str, dict[str, str]] = {"grpo": {"HOME": "/data"}, "ppo-with-critic": {"HOME": "/data"}, "dapo": DAPO_ENV}


def _spec(script: str, **env: str) -> dict[str, Any]:
    return to_rljob(overrides_from_script(script, **env)).document["spec"]


@pytest.mark.parametrize("run", RUNS)
def test_every_key_is_mapped_or_listed_with_a_reason(run: str) -> None:
    verl = overrides_from_script(RUNS[run], **ENVS[run])
    imported = to_rljob(verl)
    unmapped = {key for key, _, reason in imported.unmapped if reason}
    for key, value in verl.items():
        entry = lookup(key)
        assert key in unmapped or (entry is not None and entry.rljob is not None), key
        assert not (key in unmapped and entry is not None and entry.rljob and value is not None), key


@pytest.mark.parametrize("run", RUNS)
def test_mapped_keys_come_back_unchanged(run: str) -> None:
    verl = overrides_from_script(RUNS[run], **ENVS[run])
    back = to_verl(_spec(RUNS[run], **ENVS[run]))
    direct = {
        key: value
        for key, value in verl.items()
        if (entry := lookup(key)) is not None
        and entry.rljob is not None
        and "*" not in entry.verl
        and key not in GLOBAL_MICRO_BATCH_KEYS
        and value is not None
        and entry.rljob != "metadata.name"
        and not key.startswith(
            ("custom_reward_function", "actor_rollout_ref.ref.", "actor_rollout_ref.actor.clip_ratio")
        )
    }
    for key, value in direct.items():
        expected = [value] if lookup(key).as_list and not isinstance(value, list) else value  # type: ignore[union-attr]
        assert back.get(key) == expected, f"{key}: {value!r} came back as {back.get(key)!r}"


def test_grpo_run_becomes_the_same_batch_and_kl_settings() -> None:
    spec = _spec(GRPO, HOME="/data")
    assert spec["batch"] == {
        "trainBatchSize": 1024,
        "ppoMiniBatchSize": 256,
        "ppoMicroBatchSizePerGPU": 40,
        "logProbMicroBatchSizePerGPU": 40,
        "rolloutN": 5,
    }
    assert spec["algorithm"]["kl"]["loss"] == {"enabled": True, "coef": 0.001, "type": "k3"}
    assert spec["trainer"]["loggers"] == ["console", "wandb"]
    assert "critic" not in spec


def test_ppo_run_keeps_its_critic() -> None:
    spec = _spec(PPO, HOME="/data")
    assert spec["algorithm"]["advantageEstimator"] == "gae"
    assert spec["critic"] == {
        "optim": {"lr": 1e-5},
        "modelPath": "hf://deepseek-ai/deepseek-llm-7b-chat",
        "ppoMicroBatchSizePerGPU": 32,
        "fsdp": {"paramOffload": False, "optimizerOffload": False},
    }
    assert spec["trainer"]["totalSteps"] == 2


def test_dapo_run_imports_dynamic_sampling_and_the_overlong_penalty() -> None:
    imported = to_rljob(overrides_from_script(DAPO, **DAPO_ENV))
    reasons = {key: reason for key, _, reason in imported.unmapped}
    assert "draws trainBatchSize prompts" in reasons["data.gen_batch_size"]
    spec = imported.document["spec"]
    assert spec["algorithm"]["filterGroups"] == {"enabled": True, "metric": "acc", "maxNumGenBatches": 10}
    assert spec["reward"]["overlongBuffer"]["length"] == 512
    assert spec["algorithm"]["clipRatioHigh"] == 0.28 and spec["batch"]["dynamicBatchSize"] == {
        "enabled": True,
        "maxTokenLenPerGPU": 4096,
    }
    assert spec["data"]["trainFiles"] == ["/data/data/dapo-math-17k.parquet"]
    assert spec["cluster"]["trainer"] == {"nodes": 4, "gpusPerNode": 8}
    assert imported.document["metadata"]["name"] == "dapo-qwen2-5-7b-math-test"
    assert spec["trainer"]["resume"] == "disable" and spec["trainer"]["valBeforeTrain"] is True


def test_rollout_importance_sampling_is_imported_and_its_other_modes_are_listed() -> None:
    imported = to_rljob(
        {
            "actor_rollout_ref.rollout.calculate_log_probs": True,
            "algorithm.rollout_is": True,
            "algorithm.rollout_is_threshold": 3.0,
            "algorithm.rollout_is_mode": "mask",
            "actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0,
        }
    )
    spec = imported.document["spec"]
    assert spec["algorithm"]["rolloutCorrection"] == {"enabled": True, "threshold": 3.0}
    assert spec["rollout"]["calculateLogProbs"] is True
    reasons = {key: reason for key, _, reason in imported.unmapped}
    assert "truncate mode only" in reasons["algorithm.rollout_is_mode"]
    assert "threshold: the cap" in reasons["actor_rollout_ref.actor.tis_imp_ratio_cap"]


def test_global_micro_batch_is_divided_by_the_trainer_gpus() -> None:
    imported = to_rljob({"actor_rollout_ref.actor.ppo_micro_batch_size": 128, "trainer.n_gpus_per_node": 8})
    assert imported.document["spec"]["batch"]["ppoMicroBatchSizePerGPU"] == 16
    assert any("÷ 8 GPUs = 16" in note for note in imported.notes)


def test_every_mapped_field_exists_in_the_spec() -> None:
    from kuberl.api.validation import validate_document

    for entry in VERL_KEYS:
        if entry.rljob and entry.rljob != "metadata.name":
            doc: dict[str, Any] = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "x"}}
            node = doc.setdefault("spec", {})
            *parents, last = entry.rljob.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = "?"
            assert not any("unknown field" in i.message for i in validate_document(doc)), entry.rljob


def test_cli_writes_a_valid_rljob_and_lists_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "run_dapo.sh"
    script.write_text(DAPO)
    out = tmp_path / "dapo.yaml"
    env = [f"--env={k}={v}" for k, v in DAPO_ENV.items()]
    assert main(["import-verl", str(script), "--output-file", str(out), *env]) == 0
    err = capsys.readouterr().err
    assert "not imported: data.truncation=left: kuberl never truncates prompts" in err
    assert main(["validate", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["kind"] == "RLJob"


def test_cli_takes_overrides_on_its_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "import-verl",
        "data.train_files=/d.parquet",
        "actor_rollout_ref.model.path=/m",
        "algorithm.adv_estimator=grpo",
    ]
    assert main([*args, "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8", "trainer.n_gpus_per_node=1"]) in (
        0,
        1,
    )
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["batch"]["rolloutN"] == 4


def test_verl_yaml_given_to_validate_points_at_import_verl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump({"data": {"train_batch_size": 8}, "actor_rollout_ref": {"rollout": {"n": 4}}}))
    assert main(["validate", str(path)]) == 1
    assert "kuberl import-verl" in capsys.readouterr().out


def test_verl_yaml_is_imported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump({"data": {"train_batch_size": 8}, "actor_rollout_ref": {"rollout": {"n": 4}}}))
    main(["import-verl", str(path)])
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["batch"] == {"trainBatchSize": 8, "rolloutN": 4}


def test_a_bare_hub_id_becomes_an_hf_url_with_a_note() -> None:
    imported = to_rljob(overrides_from_script(PPO, HOME="/data"))
    spec = imported.document["spec"]
    assert spec["model"]["path"] == "hf://deepseek-ai/deepseek-llm-7b-chat"
    assert spec["critic"]["modelPath"] == "hf://deepseek-ai/deepseek-llm-7b-chat"
    assert any("is a hub id, which verl downloads: model.path = hf://deepseek-ai" in n for n in imported.notes)
    assert to_verl(spec)["actor_rollout_ref.model.path"] == "deepseek-ai/deepseek-llm-7b-chat"


def test_a_local_model_path_is_kept() -> None:
    spec = to_rljob({"actor_rollout_ref.model.path": "/models/Qwen2.5-Math-7B"}).document["spec"]
    assert spec["model"]["path"] == "/models/Qwen2.5-Math-7B"


# --- what kuberl cannot run: refused with the key, or dropped with --lossy ---------------------------------------

MEGATRON = r"""
TP=4
PP=2
python3 -m verl.trainer.main_ppo \
    data.train_files=/d/train.parquet \
    actor_rollout_ref.model.path=/models/q \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=64 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.rollout.name=sglang \
    trainer.n_gpus_per_node=8
"""


def test_megatron_tp_pp_ulysses_and_sglang_are_refused_with_each_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "run_megatron.sh"
    script.write_text(MEGATRON)
    out = tmp_path / "out.yaml"
    assert main(["import-verl", str(script), "--output-file", str(out)]) == 2
    err = capsys.readouterr().err
    for refused in (
        "error: actor_rollout_ref.actor.strategy=megatron: the trainer is FSDP2 only",
        "error: actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4: the trainer is FSDP2 only",
        "error: actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2:",
        "error: actor_rollout_ref.actor.ulysses_sequence_parallel_size=2: sequence (Ulysses) parallelism",
        "error: actor_rollout_ref.rollout.name=sglang: kuberl knows vllm, hf",
    ):
        assert refused in err
    assert "(--lossy drops it)" in err and not out.exists()


def test_lossy_imports_without_them_and_prints_every_dropped_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "run_megatron.sh"
    script.write_text(MEGATRON)
    assert main(["import-verl", str(script), "--lossy"]) == 0
    captured = capsys.readouterr()
    dropped = [line for line in captured.err.splitlines() if line.startswith("dropped (--lossy): ")]
    assert len(dropped) == 5
    spec = yaml.safe_load(captured.out)["spec"]
    assert "rollout" not in spec and spec["cluster"]["trainer"]["gpusPerNode"] == 8  # vLLM: the default engine


def test_values_kuberl_runs_as_verl_does_are_not_refused() -> None:
    imported = to_rljob(
        {
            "actor_rollout_ref.actor.strategy": "fsdp2",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
            "trainer.critic_warmup": 0,
        }
    )
    assert {key for key, _, _ in imported.unmapped} == {
        "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "trainer.critic_warmup",
    }


# --- multi-turn ------------------------------------------------------------------------------------------------


def test_multi_turn_becomes_rollout_agent_with_the_tools_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tool_config.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "verl.tools.gsm8k_tool.Gsm8kTool",
                        "config": {"type": "native"},
                        "tool_schema": {
                            "type": "function",
                            "function": {"name": "calc_gsm8k_reward", "parameters": {"properties": {"answer": {}}}},
                        },
                    }
                ]
            }
        )
    )
    args = [
        "import-verl",
        "data.train_files=/d.parquet",
        "actor_rollout_ref.model.path=/m",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
    ]
    assert main(args) == 1  # the tool needs a function: the RLJob is written and fails validation on it
    captured = capsys.readouterr()
    agent = yaml.safe_load(captured.out)["spec"]["rollout"]["agent"]
    assert agent == {"tools": [{"name": "calc_gsm8k_reward"}], "maxTurns": 5, "callFormat": "hermes"}
    assert "tool calc_gsm8k_reward is verl's class verl.tools.gsm8k_tool.Gsm8kTool" in captured.err
    assert "rollout.agent.tools calc_gsm8k_reward has no function" in captured.err


def test_an_interaction_config_is_refused_with_its_key() -> None:
    from kuberl.api.verl import VerlRefused

    with pytest.raises(VerlRefused, match=r"multi_turn\.interaction_config_path=/i\.yaml: verl.s interaction classes"):
        to_rljob(
            {
                "actor_rollout_ref.rollout.multi_turn.enable": True,
                "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "/i.yaml",
            }
        )


def test_multi_turn_keys_of_a_single_turn_run_are_listed_not_imported() -> None:
    imported = to_rljob({"actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 5})
    assert "rollout" not in imported.document["spec"]
    assert imported.unmapped == [
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", 5, "verl reads it only with multi_turn.enable")
    ]


# --- values the table converts --------------------------------------------------------------------------------


def test_lr_warmup_steps_minus_one_becomes_zero() -> None:
    spec = to_rljob({"actor_rollout_ref.actor.optim.lr_warmup_steps": -1}).document["spec"]
    assert spec["actor"]["optim"]["warmupSteps"] == 0


def test_lora_alpha_without_a_rank_is_listed_and_the_rljob_trains_every_weight() -> None:
    imported = to_rljob({"actor_rollout_ref.model.lora_alpha": 32, "actor_rollout_ref.model.path": "/m"})
    assert imported.document["spec"]["model"] == {"path": "/m"}
    assert imported.unmapped == [("actor_rollout_ref.model.lora_alpha", 32, "verl reads it only with lora_rank > 0")]
    with_rank = to_rljob({"actor_rollout_ref.model.lora_alpha": 32, "actor_rollout_ref.model.lora_rank": 8})
    assert with_rank.document["spec"]["model"]["lora"] == {"alpha": 32, "rank": 8}


@pytest.mark.parametrize(
    "experiment",
    [
        "qwen2.5-7b_grpo_gsm8k_function_rm_lr1e-6_kl0.001_bsz1024_n16",  # 56 characters
        "7b-first",
        "___",
    ],
)
def test_generated_names_are_always_valid(experiment: str) -> None:
    from kuberl.api.validation import validate_document

    document = to_rljob(
        {"trainer.experiment_name": experiment, "data.train_files": "/d", "actor_rollout_ref.model.path": "/m"}
    ).document
    document["spec"]["batch"] = {"ppoMicroBatchSizePerGPU": 1}
    assert not [i for i in validate_document(document) if i.field == "metadata.name"], document["metadata"]


# --- reading the run --------------------------------------------------------------------------------------------


def test_a_variable_the_script_does_not_set_names_the_key_the_value_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "run.sh"
    script.write_text(DAPO)
    assert main(["import-verl", str(script)]) == 2
    err = capsys.readouterr().err
    assert 'error: data.train_files="${TRAIN_FILE}": TRAIN_FILE is not set and its default cannot be computed' in err
    assert "pass --env TRAIN_FILE=VALUE" in err


def test_an_exported_secret_is_noted_not_copied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "run.sh"
    script.write_text("export WANDB_API_KEY=0123abcd\nexport VLLM_USE_V1=1\n" + GRPO)
    assert main(["import-verl", str(script), "--env", "HOME=/data"]) == 0
    captured = capsys.readouterr()
    assert "0123abcd" not in captured.out + captured.err
    assert "WANDB_API_KEY is a secret and is not copied: put it in a Secret" in captured.err
    assert "environment VLLM_USE_V1=1 is not imported" in captured.err


def test_output_json_prints_json_and_output_file_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["import-verl", "data.train_files=/d.parquet", "actor_rollout_ref.model.path=/m", "-o", "json"]
    main(args)
    assert json.loads(capsys.readouterr().out)["kind"] == "RLJob"
    assert not (Path.cwd() / "json").exists()
    out = tmp_path / "job.json"
    main([*args, "--output-file", str(out)])
    assert json.loads(out.read_text())["spec"]["model"] == {"path": "/m"}


def test_an_sft_script_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "sft.sh"
    script.write_text("torchrun --nproc_per_node=8 -m verl.trainer.fsdp_sft_trainer data.train_files=/d model.x=1\n")
    assert main(["import-verl", str(script)]) == 2
    assert "sft.sh:1: verl.trainer.fsdp_sft_trainer is verl's supervised fine-tuning (SFT)" in capsys.readouterr().err


def test_a_broken_verl_yaml_names_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 8\n bad: [\n")
    assert main(["import-verl", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not valid YAML" in err and "line 3" in err and "<unicode string>" not in err


def test_project_and_experiment_names_and_loggers_reach_the_trackers() -> None:
    imported = to_rljob(
        {
            "trainer.project_name": "verl_grpo_example_gsm8k",
            "trainer.experiment_name": "Qwen2.5-7B GRPO (lr 1e-6)",
            "trainer.logger": ["console", "wandb", "mlflow", "swanlab"],
        }
    )
    trainer = imported.document["spec"]["trainer"]
    assert trainer["tracking"] == {"project": "verl_grpo_example_gsm8k", "runName": "Qwen2.5-7B GRPO (lr 1e-6)"}
    assert trainer["loggers"] == ["console", "wandb", "mlflow"]
    assert imported.document["metadata"]["name"] == "qwen2-5-7b-grpo-lr-1e-6"
    assert (
        "trainer.logger",
        "swanlab",
        "a logger kuberl has not (it has console, jsonl, tensorboard, wandb, mlflow)",
    ) in (imported.unmapped)
