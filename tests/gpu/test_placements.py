"""``kuberl run`` with the vLLM rollout colocated and separate on one GPU: after every weight transfer the engine's
log-probs of the tokens it sampled must match the trainer's (``training/rollout_probs_diff_mean``, the mean
|p_rollout − p_trainer| per token). A transfer that failed would leave the engine on its dummy initial weights or
on the previous step's, and a large learning rate makes every step move the policy visibly."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.gpu.conftest import ROLLOUT_PROBS_TOLERANCE, short_grpo_job
from tests.trainer.kuberl_cli import kuberl_run

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

STEPS = 3


def rljob(placement: str, train_file: str) -> dict:
    return short_grpo_job(f"placement-{placement}", train_file, placement=placement, steps=STEPS)


@pytest.mark.parametrize("placement", ["colocated", "separate"])
def test_rollout_log_probs_match_the_trainer_after_every_transfer(placement, train_file, tmp_path, record):
    spec_file = tmp_path / "rljob.yaml"
    spec_file.write_text(yaml.safe_dump(rljob(placement, train_file)))
    run = kuberl_run(spec_file, tmp_path / "run", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "training/rollout_probs_diff_mean" in s]
    diffs = [s["training/rollout_probs_diff_mean"] for s in steps]
    record[placement] = {
        "rollout_probs_diff_mean": [round(d, 5) for d in diffs],
        "update_weights_s": [round(s.get("timing_s/update_weights", 0.0), 4) for s in steps],
        "gen_s": [round(s.get("timing_s/gen", 0.0), 3) for s in steps],
    }
    if placement == "separate":
        assert "1 separate vLLM engine(s) of 1 GPU(s), shared layout, weights by ipc" in run.stdout
    assert len(diffs) == STEPS
    assert max(diffs) < ROLLOUT_PROBS_TOLERANCE, diffs
