"""A learning check per algorithm family on CPU: DAPO (examples/dapo-tiny-cpu.yaml: clip-higher, token-mean loss,
dynamic sampling; its header says why overlong shaping is left out) and GSPO (the GRPO example with the gspo loss) each
raise the mean reward of the digits task within the GRPO example's 40 steps, same seed, same tiny model. GRPO's own
check is that example run as a user runs it (tests/trainer/test_run_tiny_cpu.py, the same margin): a third 40-step
run here would train the same model on the same seed again.

The reward measured is the mean score of every response generated in a step: for DAPO that is
``dynamic_sampling/generated_score/mean`` (``critic/score/mean`` covers only the kept groups, which the filter
biases towards the middle), for the others ``critic/score/mean``.
"""

from pathlib import Path

import pytest
import yaml

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
MARGIN = 0.06
"""Mean reward of the last 5 steps minus the first 5, as tests/trainer/test_run_tiny_cpu.py asks of GRPO."""

FAMILIES = {
    "dapo": ("dapo-tiny-cpu.yaml", {}),
    "gspo": ("tiny-cpu.yaml", {"policyLoss": {"lossMode": "gspo"}, "lossAggMode": "seq-mean-token-mean"}),
}


def family_spec(family: str, tmp_path: Path) -> dict:
    example, algorithm = FAMILIES[family]
    spec = yaml.safe_load((REPO / "examples" / example).read_text())["spec"]
    spec["algorithm"].update(algorithm)
    spec["data"]["trainFiles"] = [str(REPO / f) for f in spec["data"]["trainFiles"]]
    spec["data"]["valFiles"] = []
    spec["trainer"].update(
        checkpointDir=str(tmp_path / "ckpt"),
        saveFreq=-1,
        testFreq=-1,
        metricsPort=0,
        valBeforeTrain=False,
        loggers=["jsonl"],
    )
    return spec


def step_rewards(metrics_file: Path) -> list[float]:
    records = [r for r in read_jsonl(metrics_file) if "critic/score/mean" in r]
    return [r.get("dynamic_sampling/generated_score/mean", r["critic/score/mean"]) for r in records]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_raises_the_mean_reward_within_the_grpo_example_budget(family, tmp_path, local_ray) -> None:
    from kuberl.trainer.run import run_job

    spec = family_spec(family, tmp_path)
    assert run_job(family, parse_spec(spec), run_dir=str(tmp_path / "run"), show_progress=False) == 0
    rewards = step_rewards(tmp_path / "run" / "metrics.jsonl")
    assert len(rewards) == spec["trainer"]["totalSteps"] == 40
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(
        f"{family}: reward first 5 steps {first:.3f}, last 5 steps {last:.3f}; curve {[round(r, 3) for r in rewards]}"
    )
    assert last >= first + MARGIN, rewards
    if family == "dapo":
        records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
        assert any(r["dynamic_sampling/dropped_groups"] > 0 for r in records)
