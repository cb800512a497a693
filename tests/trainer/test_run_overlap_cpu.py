"""``rollout.overlap: oneStepOffPolicy`` on CPU with real parts: a trainer rank and a separate ``hf`` engine in their
own Ray actors, weights through the Ray object store.

The data dependency is read from what the engine stamped on every batch (the version of the weights it held) and
from the rollout's own log-probs: batch ``k + 1`` is generated with the weights of step ``k − 1`` (one step behind
the policy that trains on it, never two), so the rollout's log-probs differ from the trainer's; with the overlap off
every batch comes from the policy that trains on it and they agree.
"""

import os
import signal
from pathlib import Path

import pytest

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=0"
STEPS = 4


def text_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Scores that differ within the groups of a random policy (its responses all run to the length limit), so
    every step moves the weights."""
    return sum(map(ord, solution_str)) % 7 / 7


def spec(checkpoint_dir: Path, overlap: str) -> dict:
    return {
        "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
        "algorithm": {"advantageEstimator": "grpo", "rolloutCorrection": {"enabled": overlap != "none"}},
        "data": {
            "trainFiles": [str(REPO / "examples/data/digits-train.parquet")],
            "maxPromptLength": 64,
            "maxResponseLength": 4,
        },
        "reward": {"function": f"{__file__}:text_reward"},
        "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 4},
        "rollout": {"engine": "hf", "placement": "separate", "overlap": overlap, "calculateLogProbs": True},
        "actor": {"optim": {"lr": 2e-2}},
        "trainer": {
            "totalSteps": STEPS,
            "saveFreq": -1,
            "checkpointDir": str(checkpoint_dir),
            "metricsPort": 0,
            "valBeforeTrain": False,
            "loggers": ["jsonl"],
        },
        "cluster": {
            "device": "cpu",
            "trainer": {"nodes": 1, "gpusPerNode": 1},
            "rollout": {"nodes": 1, "gpusPerNode": 1},
        },
    }


def run(tmp_path: Path, name: str, overlap: str) -> list[dict]:
    from kuberl.trainer.run import run_job

    doc = spec(tmp_path / f"{name}-ckpt", overlap)
    assert run_job(name, parse_spec(doc), run_dir=str(tmp_path / name), show_progress=False) == 0
    return read_jsonl(tmp_path / name / "metrics.jsonl")


@pytest.fixture(scope="module")
def overlapped(tmp_path_factory, local_ray) -> list[dict]:
    return run(tmp_path_factory.mktemp("overlap"), "overlap", "oneStepOffPolicy")


@pytest.mark.timeout(300)
def test_synchronous_batches_come_from_the_policy_that_trains_on_them(tmp_path, local_ray):
    steps = run(tmp_path, "sync", "none")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["rollout/weight_version"] for r in steps] == [0, 1, 2, 3]
    assert [r["rollout/staleness"] for r in steps] == [0] * STEPS
    assert all(r["training/rollout_probs_diff_max"] < 1e-5 for r in steps)
    assert all("timing_s/gen_wait" not in r for r in steps)


@pytest.mark.timeout(300)
def test_overlap_generates_each_batch_one_step_behind(overlapped):
    steps = overlapped
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # step 1 waits for its batch (weights 0); batch k + 1 was generated during step k with the weights of step
    # k − 1, and the weights of step k reached the engine before batch k + 2 started: never two steps behind
    assert [r["rollout/weight_version"] for r in steps] == [0, 0, 1, 2]
    assert [r["rollout/staleness"] for r in steps] == [0, 1, 1, 1]
    # the stamps are what the engine held: its log-probs agree with the trainer's only at step 1
    assert steps[0]["training/rollout_probs_diff_max"] < 1e-5
    assert all(r["training/rollout_probs_diff_max"] > 1e-3 for r in steps[1:])
    assert all(r["timing_s/overlap"] > 0 for r in steps[:-1])  # the next batch generated alongside the update
    assert steps[-1]["timing_s/overlap"] == 0  # nothing is generated after the last step
    assert steps[0]["timing_s/gen_wait"] >= steps[0]["timing_s/gen"]
    # rollout correction weighs the off-policy tokens: π_old/π_rollout is 1 only where the batch is on-policy
    assert steps[0]["mismatch/rollout_is_max"] == pytest.approx(1.0, abs=1e-3)
    assert all(r["mismatch/rollout_is_max"] > 1.0 + 1e-3 for r in steps[1:])


@pytest.mark.timeout(300)
def test_stop_during_an_overlapped_step_regenerates_the_pending_batch_on_resume(tmp_path, local_ray, overlapped):
    from kuberl.api.contract import EXIT_INTERRUPTED
    from kuberl.trainer.driver.trainer import Trainer
    from kuberl.trainer.run import run_job

    doc = spec(tmp_path / "ckpt", "oneStepOffPolicy")
    trainer = Trainer("resumed", parse_spec(doc), run_dir=tmp_path / "resumed")
    trainer.show_progress = False
    try:
        trainer.setup()
        update = trainer.update

        def interrupt_step_two(exp, timer):  # a real SIGINT while batch 3 is being generated ahead
            if trainer.global_step == 1:
                ahead = trainer.experience.ahead
                assert ahead is not None and ahead.busy
                os.kill(os.getpid(), signal.SIGINT)
            return update(exp, timer)

        trainer.update = interrupt_step_two
        assert trainer.fit() == EXIT_INTERRUPTED
    finally:
        trainer.shutdown()
    assert trainer.global_step == 2
    assert run_job("resumed", parse_spec(doc), run_dir=str(tmp_path / "resumed"), show_progress=False) == 0

    steps = read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # no step trained twice, none skipped
    # batch 3, generated ahead but not trained when the run stopped, is drawn again (the same prompts as the
    # uninterrupted run's step 3) and generated with the weights of step 2, the checkpoint's
    for key in ("prompt_length/mean", "prompt_length/max", "prompt_length/min"):
        assert [r[key] for r in steps] == pytest.approx([r[key] for r in overlapped]), key
    assert [r["rollout/weight_version"] for r in steps] == [0, 0, 2, 2]
    assert [r["rollout/staleness"] for r in steps] == [0, 1, 0, 1]
