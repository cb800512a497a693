"""Reward faults end a real run (`kuberl run`, an embedded local Ray) instead of training on garbage: a reward
function that never returns fails within reward.timeoutSeconds, a score of 1e39 fails with a message naming the
sample; onError zero within maxErrorFraction keeps training and counts the failed samples."""

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.kuberl_cli import REPO, kuberl_run

FUNCTIONS = """
import time

calls = 0

def sleeps_forever(data_source, solution_str, ground_truth, extra_info):
    time.sleep(1e9)

def too_big(data_source, solution_str, ground_truth, extra_info):
    return 1e39

def raises_every_16th(data_source, solution_str, ground_truth, extra_info):
    global calls
    calls += 1
    if calls % 16 == 0:
        raise ValueError("cannot parse the answer")
    return float(solution_str.strip().startswith(ground_truth))
"""
TIMEOUT = 5


def run(tmp_path: Path, function: str, **reward: Any) -> tuple[subprocess.CompletedProcess[str], float]:
    """`kuberl run` of the tiny CPU example for 2 steps with reward.function = user_rewards.py:``function``."""
    (tmp_path / "user_rewards.py").write_text(FUNCTIONS)
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["reward"] = {"function": f"{tmp_path}/user_rewards.py:{function}", **reward}
    doc["spec"]["trainer"].update(
        totalSteps=2, testFreq=-1, valBeforeTrain=False, checkpointDir=str(tmp_path / "ckpt"), metricsPort=0
    )
    spec_file = tmp_path / "rljob.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    result = kuberl_run(spec_file, tmp_path / "run", timeout=400)
    return result, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_reward_function_that_sleeps_forever_fails_the_run_at_the_timeout(tmp_path: Path) -> None:
    result, elapsed = run(tmp_path, "sleeps_forever", timeoutSeconds=TIMEOUT)
    assert result.returncode == 1, result.stdout[-3000:]  # `kuberl run` prints the message, no traceback
    assert "error: reward function" in result.stderr and "did not score a batch" in result.stderr, result.stderr[-3000:]
    assert f"within {TIMEOUT} s (reward.timeoutSeconds = {TIMEOUT})" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not any(
        "critic/score/mean" in r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")
    )
    print(f"sleeps_forever: failed after {elapsed:.0f} s (timeout {TIMEOUT} s, the rest is startup)")


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_reward_of_1e39_fails_the_run_naming_the_sample(tmp_path: Path) -> None:
    result, _ = run(tmp_path, "too_big")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error: reward function" in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "returned 1e+39, which is inf in torch.float32 on sample 0 (data_source='kuberl/digits'" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_on_error_zero_within_the_fraction_keeps_training_and_counts_the_failures(tmp_path: Path) -> None:
    result, _ = run(tmp_path, "raises_every_16th", onError="zero", maxErrorFraction=0.1)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
    assert [r["reward_extra/reward_error/mean"] for r in records] == [1 / 16, 1 / 16]  # 8 of 128 responses a step
    assert all(r["actor/skipped_steps"] == 0.0 for r in records)
