"""`kuberl run examples/tiny-cpu.yaml` trains a randomly initialised tiny Llama on the digits task and the mean
reward rises: the whole stack (Ray, FSDP2 worker, hf rollout, rewards, GRPO, checkpoints, metrics) works."""

import time

import pytest
import yaml

from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.kuberl_cli import REPO, kuberl_run

MARGIN = 0.06
"""Mean reward of the last 5 steps minus the first 5. Measured with this example: 0.194 (data.seed 1, the
example), 0.100 and 0.094 (seeds 2 and 3)."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_cpu_example_raises_the_reward(tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["trainer"].update(checkpointDir=str(tmp_path / "ckpt"), metricsPort=0)
    spec_file = tmp_path / "tiny-cpu.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    result = kuberl_run(spec_file, tmp_path / "run", timeout=580)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
    rewards = [r["critic/score/mean"] for r in records]
    assert len(rewards) == doc["spec"]["trainer"]["totalSteps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"tiny-cpu: {elapsed:.0f} s, reward first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last >= first + MARGIN, rewards
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"global_step_{len(rewards)}"
    assert any(k.startswith("val-core/kuberl/digits/reward/mean@") for r in records for k in r)
