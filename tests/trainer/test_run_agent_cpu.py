"""`kuberl run` with rollout.agent on CPU: multi-turn rows with masked observations go through the real workers
(old log-probs with observations attended, GRPO, the update) and the agent metrics reach metrics.jsonl."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.kuberl_cli import REPO, kuberl_run

ENVIRONMENT = """
class Echo:
    '''Answers every turn; rewards a turn that contains a digit; ends after two steps.'''

    def reset(self, prompt, extra_info):
        self.steps = 0
        return "start"

    def step(self, action):
        self.steps += 1
        return "turn " + str(self.steps), float(any(c.isdigit() for c in action)), self.steps == 2
"""


def run(tmp_path: Path, agent: dict[str, Any], steps: int = 2) -> list[dict[str, Any]]:
    doc = yaml.safe_load((REPO / "examples" / "agent-calculator-cpu.yaml").read_text())
    spec = doc["spec"]
    spec["rollout"]["agent"] = agent
    spec["data"]["maxResponseLength"] = 48
    spec["batch"].update(trainBatchSize=2, rolloutN=2, ppoMiniBatchSize=2, ppoMicroBatchSizePerGPU=4)
    spec["trainer"].update(totalSteps=steps, testFreq=0, checkpointDir=str(tmp_path / "ckpt"), metricsPort=0)
    spec["trainer"]["valBeforeTrain"] = False
    for key in ("trainFiles", "valFiles"):
        spec["data"][key] = [str(REPO / f) for f in spec["data"][key]]
    spec_file = tmp_path / "agent.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    result = kuberl_run(spec_file, tmp_path / "run", timeout=580)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_environment_turns_train_with_observations_masked(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ENVIRONMENT)
    records = run(tmp_path, {"environment": {"class": f"{tmp_path}/echo.py:Echo"}, "maxTurns": 2, "workers": 1})
    assert len(records) == 2
    for r in records:
        assert r["agent/masked_token_share"] > 0  # the reset observation opens every response, masked
        assert 1 <= r["agent/turns/mean"] <= 2
        assert 0.0 <= r["critic/score/mean"] <= 2.0  # the summed environment rewards
        assert r["actor/pg_loss"] == r["actor/pg_loss"]  # finite: the update ran over the holed mask
