"""GRPO and PPO (GAE with a critic) run end to end with 2 FSDP2 ranks on gloo, on an embedded local Ray."""

import json
import math
from pathlib import Path

import pytest

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=0"


def tiny_spec(tmp_path: Path, **overrides) -> dict:
    spec = {
        "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
        "algorithm": {"advantageEstimator": "grpo", "kl": {"loss": {"enabled": True, "coef": 0.01}}},
        "data": {
            "trainFiles": [str(REPO / "examples/data/digits-train.parquet")],
            "maxPromptLength": 64,
            "maxResponseLength": 3,
        },
        "reward": {"function": "default"},
        "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 2, "ppoMicroBatchSizePerGPU": 1},
        "rollout": {"engine": "hf"},
        "actor": {"optim": {"lr": 1e-3}},
        "trainer": {
            "totalSteps": 2,
            "checkpointDir": str(tmp_path / "ckpt"),
            "metricsPort": 0,
            "valBeforeTrain": False,
            "loggers": ["jsonl"],
        },
        "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}},
    }
    for path, value in overrides.items():
        node = spec
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return spec


def run(tmp_path: Path, spec: dict, name: str) -> list[dict]:
    from kuberl.trainer.run import run_job

    assert run_job(name, parse_spec(spec), run_dir=str(tmp_path / "run"), show_progress=False) == 0
    return read_jsonl(tmp_path / "run" / "metrics.jsonl")


@pytest.mark.timeout(300)
def test_grpo_with_kl_loss_runs_on_two_fsdp_ranks(tmp_path, local_ray):
    records = run(tmp_path, tiny_spec(tmp_path, **{"rollout.calculateLogProbs": True}), "grpo-2ranks")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        for key in (
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/entropy",
            "actor/grad_norm",
            "critic/score/mean",
            "timing_s/gen",
            "timing_s/ref",
            "timing_s/update_actor",
            "perf/throughput",
        ):
            assert key in r, key
        assert r["actor/micro_batches"] == 2  # (2 prompts × 2 samples / 2 ranks) / micro 1
        assert r["training/rollout_probs_diff_max"] < 1e-3  # the trainer sees what the rollout sampled from
    assert (tmp_path / "ckpt" / "global_step_2" / "actor" / "rng_rank1.pt").exists()


@pytest.mark.timeout(300)
def test_one_mini_batch_one_epoch_skips_the_old_log_prob_pass(tmp_path, local_ray):
    spec = tiny_spec(tmp_path, **{"rollout.calculateLogProbs": True, "batch.ppoMiniBatchSize": 4})
    records = run(tmp_path, spec, "grpo-fused")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert "timing_s/old_log_prob" not in r
        assert r["actor/pg_clipfrac"] == 0.0 and abs(r["actor/ppo_kl"]) < 1e-6  # ratio 1 by construction
        assert r["actor/entropy"] > 0
        # the update's log-probs, read back from both ranks in row order, are what the rollout sampled from
        assert r["training/rollout_probs_diff_max"] < 1e-3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mini_batch", [2, 4], ids=["old-log-prob-pass", "old-log-probs-from-update"])
def test_rollout_correction_weighs_the_update_and_reports_its_weights(tmp_path, local_ray, mini_batch):
    """The update reads the rollout's log-probs (a missing key fails the step) with the old log-probs of a separate
    pass or of its own forward; on CPU the hf engine and the trainer compute the same float32 probabilities, so
    every weight is 1 and none is capped."""
    spec = tiny_spec(
        tmp_path,
        **{
            "rollout.calculateLogProbs": True,
            "batch.ppoMiniBatchSize": mini_batch,
            "algorithm.rolloutCorrection": {"enabled": True, "threshold": 1.5},
        },
    )
    records = run(tmp_path, spec, f"grpo-rollout-is-{mini_batch}")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert ("timing_s/old_log_prob" in r) == (mini_batch == 2)
        assert abs(r["mismatch/rollout_is_mean"] - 1.0) < 1e-3
        assert abs(r["mismatch/rollout_is_max"] - 1.0) < 1e-3 and abs(r["mismatch/rollout_is_min"] - 1.0) < 1e-3
        assert r["mismatch/rollout_is_ratio_fraction_high"] == 0.0
        assert math.isfinite(r["actor/pg_loss"])


@pytest.mark.timeout(300)
def test_ppo_with_a_critic_runs_on_two_fsdp_ranks(tmp_path, local_ray):
    spec = tiny_spec(
        tmp_path,
        **{
            "algorithm": {"advantageEstimator": "gae", "kl": {"inReward": True, "coef": 0.01}},
            "critic": {"optim": {"lr": 1e-3}},
            "batch.dynamicBatchSize": {"enabled": True, "maxTokenLenPerGPU": 128},
        },
    )
    records = run(tmp_path, spec, "ppo-2ranks")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        for key in (
            "critic/vf_loss",
            "critic/values/mean",
            "critic/vf_explained_var",
            "actor/reward_kl_penalty",
            "timing_s/values",
            "timing_s/update_critic",
        ):
            assert key in r, key
    critic = tmp_path / "ckpt" / "global_step_2" / "critic"
    assert sorted(p.name for p in (critic / "model").glob("__*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert "critic/model/__1_0.distcp" in json.loads((critic.parent / "manifest.json").read_text())["files"]


@pytest.mark.timeout(300)
def test_a_reward_model_scores_the_responses(tmp_path, local_ray):
    spec = tiny_spec(
        tmp_path,
        **{
            "reward": {"model": {"path": TINY, "microBatchSizePerGPU": 4, "maxLength": 128}},
            "algorithm": {"advantageEstimator": "grpo"},
            "cluster.trainer.gpusPerNode": 1,
            "trainer.totalSteps": 1,
        },
    )
    (record,) = run(tmp_path, spec, "reward-model")
    assert record["critic/score/max"] != record["critic/score/min"]  # a (random) model gives graded scores


@pytest.mark.timeout(300)
def test_a_reward_model_slower_than_the_timeout_ends_the_job_as_a_permanent_failure(tmp_path, local_ray):
    from kuberl.api.status import FailureClass
    from kuberl.trainer.driver.failures import classify
    from kuberl.trainer.rewards.functions import RewardTimeoutError
    from kuberl.trainer.run import run_job

    spec = tiny_spec(
        tmp_path,
        **{
            # a real CPU forward pass of the tiny model takes far longer than a millisecond
            "reward": {"model": {"path": TINY, "microBatchSizePerGPU": 4, "maxLength": 128}, "timeoutSeconds": 0.001},
            "algorithm": {"advantageEstimator": "grpo"},
            "cluster.trainer.gpusPerNode": 1,
            "trainer.totalSteps": 1,
        },
    )
    with pytest.raises(RewardTimeoutError, match=r"within 0\.001 s \(reward\.timeoutSeconds\)") as raised:
        run_job("reward-model-timeout", parse_spec(spec), run_dir=str(tmp_path / "run"), show_progress=False)
    assert classify(raised.value).kind == FailureClass.PERMANENT
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_jsonl(tmp_path / "run" / "metrics.jsonl")
