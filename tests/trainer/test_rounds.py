"""The pure parts of a step's generation rounds: which per-response value dynamic sampling filters on, and how the
per-row values travel through the sampler."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kuberl.api import load_documents, parse_spec
from kuberl.trainer.data.prompts import Prompt
from kuberl.trainer.experience.batch import Scored, place_at_last_token
from kuberl.trainer.experience.rounds import Rounds, responses
from kuberl.trainer.experience.stage import ExperienceStage

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dapo-tiny-cpu.yaml"


def rollouts(extra: dict[str, list[float]]) -> Scored:
    prompts = [
        Prompt(input_ids=[i], data_source="d", ground_truth="1", extra_info={}, index=i, raw_prompt=[])
        for i in range(2)
    ]
    return Scored(
        rows={"response_mask": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])},
        samples=[p for p in prompts for _ in range(2)],
        group_ids=torch.tensor([0, 0, 1, 1]),
        scores=torch.tensor([1.0, 0.0, 0.5, 0.5]),
        extra={k: torch.tensor(v) for k, v in extra.items()},
        reward_baselines=torch.tensor([0.25, 0.25, 0.75, 0.75]),
    )


def filter_metric(part: Scored, metric: str, **algorithm: Any) -> torch.Tensor:
    """The metric as a step's rounds compute it, with the final rewards of the experience stage."""
    ((_, doc),) = load_documents(EXAMPLE)
    doc["spec"]["algorithm"].update(algorithm)
    stage: Any = SimpleNamespace(spec=parse_spec(doc["spec"]))
    rounds: Any = SimpleNamespace(spec=stage.spec, final_rewards=lambda p: ExperienceStage.final_rewards(stage, p))
    return Rounds.filter_metric(rounds, part, metric)


def test_filter_metric_reads_the_scores_or_a_reward_extra_by_name() -> None:
    part = rollouts({"acc": [1.0, 0.0, 1.0, 1.0]})
    assert filter_metric(part, "seq_reward").tolist() == [1.0, 0.0, 0.5, 0.5]
    assert filter_metric(part, "acc").tolist() == [1.0, 0.0, 1.0, 1.0]
    # without a KL penalty in the reward, the final reward is the score
    assert filter_metric(part, "seq_final_reward").tolist() == [1.0, 0.0, 0.5, 0.5]


def test_filter_metric_names_the_field_and_the_known_keys_when_the_reward_lacks_the_key() -> None:
    with pytest.raises(
        ValueError, match=r"algorithm.filterGroups.metric 'acc' .*known here: seq_reward, seq_final_reward, pred_len"
    ):
        filter_metric(rollouts({"pred_len": [1.0, 2.0, 3.0, 4.0]}), "acc")
    # a key some responses lack (NaN there) cannot decide their group either
    with pytest.raises(ValueError, match="'acc' is not a number the reward returns for every response"):
        filter_metric(rollouts({"acc": [1.0, float("nan"), 1.0, 1.0]}), "acc")


def test_responses_carry_each_rows_score_extras_and_baseline() -> None:
    part = rollouts({"acc": [1.0, 0.0, 1.0, 1.0]})
    carried = responses(part)
    assert [(r.sample.index, r.score, r.extra, r.baseline) for r in carried] == [
        (0, 1.0, {"acc": 1.0}, 0.25),
        (0, 0.0, {"acc": 0.0}, 0.25),
        (1, 0.5, {"acc": 1.0}, 0.75),
        (1, 0.5, {"acc": 1.0}, 0.75),
    ]
    assert rollouts({"acc": [1.0, float("nan"), 0.0, 0.0]}).extra_metrics() == {
        "reward_extra/acc/mean": pytest.approx(1 / 3)
    }


def test_scores_sit_on_each_responses_last_token() -> None:
    tokens = place_at_last_token(torch.tensor([1.0, 2.0]), torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert tokens.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]]
