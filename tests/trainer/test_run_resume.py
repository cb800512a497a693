"""Determinism: 6 straight steps and 3 steps + resume + 3 steps give the same per-step metrics.

This needs every piece of state a checkpoint holds: model, optimizer, scheduler, the dataloader position, the
KL controller and each rank's RNG (rollout sampling).
"""

import signal
from pathlib import Path

import pytest

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=0"
VOLATILE = ("timing_s/", "perf/")


def spec(checkpoint_dir: Path) -> dict:
    return {
        "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
        "algorithm": {
            "advantageEstimator": "grpo",
            "kl": {
                "inReward": True,
                "coef": 0.05,
                "control": "adaptive",
                "target": 0.01,
                "horizon": 100,
                "loss": {"enabled": True, "coef": 0.01},
            },
        },
        "data": {
            "trainFiles": [str(REPO / "examples/data/digits-train.parquet")],
            "maxPromptLength": 64,
            "maxResponseLength": 3,
        },
        "reward": {"function": "default"},
        "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 2, "ppoMicroBatchSizePerGPU": 2},
        "rollout": {"engine": "hf"},
        "actor": {"optim": {"lr": 5e-3, "warmupSteps": 2, "scheduler": "cosine", "minLrRatio": 0.1}},
        "trainer": {
            "totalSteps": 6,
            "saveFreq": -1,
            "checkpointDir": str(checkpoint_dir),
            "metricsPort": 0,
            "valBeforeTrain": False,
            "loggers": ["jsonl"],
        },
        "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}},
    }


def graded_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """Scores that differ within most groups of a random policy, so dynamic sampling keeps some and drops some."""
    return {"score": len(solution_str) / 10, "starts_with_digit": float(solution_str[:1].isdigit())}


def dapo_remax(checkpoint_dir: Path) -> dict:
    """Dynamic sampling, the overlong penalty and ReMax's greedy baselines: extra generation rounds move the data
    position, which the checkpoint must hold."""
    doc = spec(checkpoint_dir)
    doc["algorithm"].update(
        advantageEstimator="remax",
        filterGroups={"enabled": True, "metric": "seq_reward", "maxNumGenBatches": 50},
    )
    doc["reward"] = {"function": f"{__file__}:graded_reward", "overlongBuffer": {"length": 1, "penaltyFactor": 0.5}}
    return doc


def stable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(VOLATILE)}


@pytest.mark.timeout(480)
@pytest.mark.parametrize("make_spec", [spec, dapo_remax], ids=["grpo", "dapo-remax"])
def test_resumed_run_matches_a_straight_run(tmp_path, local_ray, make_spec):
    from kuberl.trainer.run import run_job

    straight = make_spec(tmp_path / "straight-ckpt")
    assert run_job("straight", parse_spec(straight), run_dir=str(tmp_path / "straight"), show_progress=False) == 0

    resumed = make_spec(tmp_path / "resumed-ckpt")
    # the first half stops after step 3 (the scheduler still plans for 6 steps: totalSteps stays in the spec) …
    first = dict(resumed, trainer={**resumed["trainer"], "saveFreq": 3})
    from kuberl.api.contract import EXIT_INTERRUPTED
    from kuberl.trainer.driver.trainer import Trainer

    trainer = Trainer("resumed", parse_spec(first), run_dir=tmp_path / "resumed")
    trainer.show_progress = False
    try:
        trainer.setup()
        original = trainer.train_step

        def stop_after_three():
            metrics = original()
            if trainer.global_step == 2:  # global_step counts completed steps; this is step 3
                trainer._on_stop_signal(signal.SIGINT, None)
            return metrics

        trainer.train_step = stop_after_three
        assert trainer.fit() == EXIT_INTERRUPTED
    finally:
        trainer.shutdown()
    assert (tmp_path / "resumed-ckpt" / "global_step_3" / "manifest.json").exists()
    # … and a new run resumes from its checkpoint (resume: auto) for steps 4-6
    assert run_job("resumed", parse_spec(resumed), run_dir=str(tmp_path / "resumed"), show_progress=False) == 0

    a = [stable(r) for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl")]
    b = [stable(r) for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-6), (x["step"], key)
    # the adaptive KL controller moved, and its state was restored with the checkpoint
    assert a[-1]["actor/reward_kl_penalty_coeff"] != a[0]["actor/reward_kl_penalty_coeff"]
    if make_spec is dapo_remax:
        # extra rounds before the checkpoint at step 3 moved the data position it saved
        assert sum(r["dynamic_sampling/rounds"] for r in a[:3]) > 3
        assert all(r["dynamic_sampling/kept_groups"] >= 4 for r in a)
        assert all(r["reward_extra/overlong_penalty/mean"] <= 0 for r in a)
