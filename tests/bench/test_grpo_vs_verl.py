"""bench/grpo_vs_verl.py on CPU: the verl configuration it writes shares every setting of the kuberl side's RLJob,
verl's own metric records become the same per-phase steps as kuberl's, and verl runs without kuberl on its path.

verl itself is not installed here; the overrides were composed with verl 0.9.1's Hydra config and passed its
``validate_config`` on 2026-12-06 (docs/performance.md says how to repeat that)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.grpo_bench import kuberl_spec, summarise
from bench.grpo_vs_verl import (
    SHARED,
    VERL_SOURCE,
    console_records,
    file_records,
    hydra_value,
    kuberl_budget,
    override_arguments,
    verl_data,
    verl_env,
    verl_overrides,
    verl_stack,
    verl_steps,
)
from kuberl.api.validation import parse_spec

ARR = "actor_rollout_ref"


def _args(**changes: Any) -> argparse.Namespace:
    job = {
        "max_tokens": "24576",
        "micro_batch": 32,
        "prompts": 32,
        "group": 8,
        "max_prompt": 256,
        "max_response": 256,
        "seed": 7,
        "gpu_memory_utilization": 0.25,
        "lr": 3e-6,
        "steps": 4,
    }
    return argparse.Namespace(**{**job, **changes})


def _overrides(
    tmp_path: Path, *, overlap: bool, fused_kernels: str = "off", **changes: Any
) -> tuple[Any, dict[str, Any]]:
    doc = kuberl_spec(
        _args(**changes), "/models/policy", "/data/train.parquet", True, "kuberl_overlap" if overlap else "kuberl"
    )
    stack = verl_stack(
        data_file="/data/train-verl.parquet",
        work=tmp_path,
        side="verl",
        token_budget=kuberl_budget(_args(**changes), doc, "H100-80GB"),
        attention="sdpa",
        remove_padding=False,
        bypass=True,
        compile_log_probs=True,
        fused_kernels=fused_kernels,
    )
    return parse_spec(doc["spec"]), verl_overrides(doc, stack, overlap=overlap)


def _shared_values(spec: Any) -> dict[str, Any]:
    """Every setting both sides share, read from the RLJob as the kuberl trainer reads it (defaults included)."""
    batch, rollout, actor, algo = spec.batch, spec.rollout, spec.actor, spec.algorithm
    return {
        "data.train_batch_size": batch.train_batch_size,
        "data.max_prompt_length": spec.data.max_prompt_length,
        "data.max_response_length": spec.data.max_response_length,
        "data.filter_overlong_prompts": spec.data.filter_overlong_prompts,
        "data.shuffle": spec.data.shuffle,
        "data.seed": spec.data.seed,
        f"{ARR}.model.path": spec.model.path,
        f"{ARR}.model.enable_gradient_checkpointing": spec.model.gradient_checkpointing,
        f"{ARR}.actor.optim.lr": actor.optim.lr,
        f"{ARR}.actor.optim.weight_decay": actor.optim.weight_decay,
        f"{ARR}.actor.optim.lr_warmup_steps": actor.optim.warmup_steps,
        f"{ARR}.actor.optim.min_lr_ratio": actor.optim.min_lr_ratio,
        f"{ARR}.actor.grad_clip": actor.optim.grad_clip,
        f"{ARR}.actor.ppo_mini_batch_size": batch.ppo_mini_batch_size,
        f"{ARR}.actor.ppo_epochs": batch.ppo_epochs,
        f"{ARR}.actor.use_dynamic_bsz": batch.dynamic_batch_size.enabled,
        f"{ARR}.actor.ppo_max_token_len_per_gpu": batch.dynamic_batch_size.max_token_len_per_gpu,
        f"{ARR}.actor.use_kl_loss": algo.kl.loss.enabled,
        f"{ARR}.actor.clip_ratio_low": algo.clip_ratio_low,
        f"{ARR}.actor.clip_ratio_high": algo.clip_ratio_high,
        f"{ARR}.actor.clip_ratio_c": algo.clip_ratio_c,
        f"{ARR}.actor.policy_loss.loss_mode": algo.policy_loss.loss_mode,
        f"{ARR}.actor.loss_agg_mode": algo.loss_agg_mode,
        f"{ARR}.actor.entropy_coeff": algo.entropy_coef,
        f"{ARR}.actor.fsdp_config.param_offload": actor.fsdp.param_offload,
        f"{ARR}.actor.fsdp_config.optimizer_offload": actor.fsdp.optimizer_offload,
        f"{ARR}.actor.fsdp_config.reshard_after_forward": actor.fsdp.reshard_after_forward,
        f"{ARR}.rollout.n": batch.rollout_n,
        f"{ARR}.rollout.name": rollout.engine,
        f"{ARR}.rollout.tensor_model_parallel_size": rollout.tensor_parallel_size,
        f"{ARR}.rollout.gpu_memory_utilization": rollout.gpu_memory_utilization,
        f"{ARR}.rollout.temperature": rollout.temperature,
        f"{ARR}.rollout.top_p": rollout.top_p,
        f"{ARR}.rollout.top_k": rollout.top_k,
        f"{ARR}.rollout.max_num_batched_tokens": rollout.max_num_batched_tokens,
        f"{ARR}.rollout.max_num_seqs": rollout.max_num_seqs,
        f"{ARR}.rollout.enforce_eager": rollout.enforce_eager,
        f"{ARR}.rollout.calculate_log_probs": rollout.calculate_log_probs,
        "algorithm.adv_estimator": algo.advantage_estimator,
        "algorithm.norm_adv_by_std_in_grpo": algo.norm_adv_by_std,
        "algorithm.use_kl_in_reward": algo.kl.in_reward,
        "trainer.nnodes": spec.cluster.trainer.nodes,
        "trainer.n_gpus_per_node": spec.cluster.trainer.gpus_per_node,
        "trainer.total_training_steps": spec.trainer.total_steps,
    }


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlapped"])
def test_every_shared_setting_is_the_same_on_both_sides(tmp_path: Path, overlap: bool) -> None:
    spec, overrides = _overrides(tmp_path, overlap=overlap)
    expected = _shared_values(spec)
    assert set(SHARED) <= set(expected), f"add to this test's table: {sorted(set(SHARED) - set(expected))}"
    differ = {k: (overrides.get(k), v) for k, v in expected.items() if overrides.get(k) != v}
    assert not differ, f"verl value, kuberl value: {differ}"
    assert overrides["trainer.v1.trainer_mode"] == ("colocate_async" if overlap else "sync")


def test_the_job_is_the_benchmarks_one(tmp_path: Path) -> None:
    _, overrides = _overrides(tmp_path, overlap=False)
    job = {
        "data.train_batch_size": 32,
        f"{ARR}.rollout.n": 8,
        f"{ARR}.actor.ppo_mini_batch_size": 32,
        f"{ARR}.actor.optim.lr": 3e-6,
        f"{ARR}.actor.optim.weight_decay": 0.0,
        f"{ARR}.rollout.gpu_memory_utilization": 0.25,
        f"{ARR}.rollout.enforce_eager": False,
        f"{ARR}.model.enable_gradient_checkpointing": False,
        f"{ARR}.actor.use_dynamic_bsz": True,
        f"{ARR}.actor.ppo_max_token_len_per_gpu": 24576,
        f"{ARR}.actor.use_kl_loss": False,
        "algorithm.use_kl_in_reward": False,
        "data.seed": 7,
        "trainer.total_training_steps": 4,
    }
    assert {k: overrides[k] for k in job} == job


TINY_CONFIG = {"vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}


def test_a_left_out_budget_gives_verl_the_one_kuberls_plan_chose(tmp_path: Path) -> None:
    from kuberl.api.memory import config_shape, gpu_named, plan_memory

    config = {**TINY_CONFIG, "intermediate_size": 512}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    doc = kuberl_spec(_args(max_tokens="auto"), str(tmp_path / "model"), "/data/train.parquet", True)
    assert "maxTokenLenPerGPU" not in doc["spec"]["batch"]["dynamicBatchSize"]
    plan = plan_memory(parse_spec(doc["spec"]), config_shape(config), gpu_named("L4"), layout="colocated")
    assert kuberl_budget(_args(max_tokens="auto"), doc, "NVIDIA L4") == plan.token_budget


def test_verl_is_configured_for_this_stack(tmp_path: Path) -> None:
    _, overrides = _overrides(tmp_path, overlap=False)
    assert overrides[f"+{ARR}.model.override_config.attn_implementation"] == "sdpa"  # no flash-attn wheel
    assert overrides["algorithm.rollout_correction.bypass_mode"] is True  # no old-log-prob pass, as kuberl
    assert overrides["trainer.logger"] == ["console", "file"] and overrides["trainer.save_freq"] == -1
    assert overrides["data.train_files"] == ["/data/train-verl.parquet"] and overrides["trainer.use_v1"] is True
    assert overrides[f"{ARR}.model.use_fused_kernels"] is False
    assert f"{ARR}.model.fused_kernel_options.impl_backend" not in overrides


def test_verls_fused_kernels_name_their_backend(tmp_path: Path) -> None:
    _, overrides = _overrides(tmp_path, overlap=False, fused_kernels="triton")
    assert overrides[f"{ARR}.model.use_fused_kernels"] is True
    assert overrides[f"{ARR}.model.fused_kernel_options.impl_backend"] == "triton"


def test_overrides_are_written_as_hydra_reads_them(tmp_path: Path) -> None:
    assert [hydra_value(v) for v in (True, False, None, 0.3, -1, "token-mean")] == [
        "True",
        "False",
        "null",
        "0.3",
        "-1",
        "token-mean",
    ]
    assert hydra_value(["console", "file"]) == "[console,file]"
    assert hydra_value("/tmp/a b/x") == "/tmp/a b/x" and hydra_value("a b") == "'a b'"
    _, overrides = _overrides(tmp_path, overlap=False)
    arguments = override_arguments(overrides)
    assert f"+{ARR}.model.override_config.attn_implementation=sdpa" in arguments
    assert "data.train_files=[/data/train-verl.parquet]" in arguments


VERL_FILE = [
    {
        "step": 1,
        "data": {
            "timing_s/gen": 6.5,
            "timing_s/reward": 0.2,
            "timing_s/adv": 0.05,
            "timing_s/update_actor": 2.0,
            "timing_s/update_weights": 0.4,
            "timing_s/step": 9.5,
            "perf/total_num_tokens": 70000,
            "perf/time_per_step": 9.5,
            "response_length/mean": 150.0,
            "critic/score/mean": 0.0,
        },
    },
    {
        "step": 2,
        "data": {
            "timing_s/gen": 2.0,
            "timing_s/reward": 0.1,
            "timing_s/old_log_prob": 0.5,
            "timing_s/adv": 0.05,
            "timing_s/update_actor": 1.2,
            "timing_s/update_weights": 0.3,
            "timing_s/step": 4.25,
            "perf/total_num_tokens": 72250,
            "response_length/mean": 160.0,
            "critic/score/mean": 0.03,
            "training/off_policy/trajectory_staleness/mean": 0.0,
        },
    },
]
"""verl 0.9.1's file logger lines (verl/utils/tracking.py FileLogger), metric names from
verl/trainer/ppo/v1/trainer_base.py (marked_timer) and metric_utils.compute_throughout_metrics."""


def test_verls_file_logger_becomes_steps_by_phase(tmp_path: Path) -> None:
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in VERL_FILE))
    steps = verl_steps(file_records(path))
    assert [s["step"] for s in steps] == [1, 2]
    second = steps[1]
    assert (second["tokens"], second["seconds"], second["tokens_per_s"]) == (72250, 4.25, 17000.0)
    assert second["breakdown_s"] == {
        "generation": 2.0,
        "reward": 0.1,
        "log_probs": 0.5,
        "update": 1.25,
        "sync": 0.3,
        "idle": 0.0,
        "other": 0.1,
    }
    summary = summarise(steps)
    assert summary["tokens_per_s"] == 17000.0 and summary["phases_s"]["update"] == 1.25


def test_verls_console_lines_give_the_same_steps() -> None:
    text = "\n".join(
        [
            "(TaskRunnerV1 pid=4242) Training Progress:  50%",
            *(
                "(TaskRunnerV1 pid=4242) step:"
                + str(line["step"])
                + " - "
                + " - ".join(f"{k}:np.float64({v})" if "timing" in k else f"{k}:{v}" for k, v in line["data"].items())
                for line in VERL_FILE
            ),
        ]
    )
    from_console = verl_steps(console_records(text))
    from_file = verl_steps([{"step": line["step"], **line["data"]} for line in VERL_FILE])
    assert from_console == from_file


def test_verls_data_is_the_same_rows_scored_by_its_gsm8k_rule(tmp_path: Path) -> None:
    rows = [
        {
            "data_source": "kuberl/gsm8k-synth",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": a},
        }
        for q, a in (("1+1?", "2"), ("2+2?", "4"))
    ]
    source = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    copied = pq.read_table(verl_data(str(source), tmp_path / "verl.parquet")).to_pylist()
    assert [r["data_source"] for r in copied] == [VERL_SOURCE] * 2
    assert [{k: v for k, v in r.items() if k != "data_source"} for r in copied] == [
        {k: v for k, v in r.items() if k != "data_source"} for r in rows
    ]


def test_verl_runs_on_its_own_sites_without_kuberl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", "/repo/api:/repo/trainer:/root/site")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env = verl_env(["/root/verl-site"], tmp_path / "m.jsonl")
    assert env["PYTHONPATH"] == "/root/verl-site"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # verl's engines run their core in a process of their own
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "m.jsonl") and env["HF_HUB_OFFLINE"] == "1"


def test_the_async_rows_are_compared_with_verls_overlapped_row() -> None:
    from bench.grpo_vs_verl import VERL_ROWS, print_async_ratios

    result = {
        "verl_overlap": {"tokens_per_s": 1000.0},
        "kuberl_async_k1": {"tokens_per_s": 900.0},
        "kuberl_async_k2": {"tokens_per_s": 1250.0, "phases_s": {"update": 0.5}},
    }
    print_async_ratios(result)
    assert result["ratio_kuberl_async_k1_vs_verl_overlap"] == 0.9
    assert result["ratio_kuberl_async_k2_vs_verl_overlap"] == 1.25
    assert VERL_ROWS["async"] == [True]  # verl's side of the async rows is its overlapped row


@pytest.mark.parametrize("overlap", ["on", "both"])
def test_verls_overlapped_row_asks_for_a_whole_cycle_of_steps(
    overlap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import grpo_vs_verl

    # 4 steps measure kuberl's one-step-off row (step 3), one short of verl's whole cycle
    monkeypatch.setattr("sys.argv", ["grpo_vs_verl.py", "--overlap", overlap, "--steps", "4"])
    with pytest.raises(SystemExit):
        grpo_vs_verl.main()
    assert "--steps must be at least 5 for verl's overlapped row" in capsys.readouterr().err
