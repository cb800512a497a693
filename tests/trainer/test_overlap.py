"""The pieces of the one-step-off-policy loop without Ray: drawing ahead, the background generation, the overlap
measure and the staleness metric."""

from __future__ import annotations

import threading

import pytest
import torch

from kuberl.trainer.experience.metrics import staleness_metrics
from kuberl.trainer.experience.overlap import AheadGeneration, Generated, draw, overlap_seconds
from kuberl.trainer.observe.metrics import Timer


class Loader:
    """PromptLoader's position interface over integers."""

    def __init__(self, per_epoch: int) -> None:
        self.per_epoch, self.epoch, self.batch_in_epoch = per_epoch, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def next_batch(self) -> list[int]:
        if self.batch_in_epoch >= self.per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.batch_in_epoch += 1
        return [self.epoch * 100 + self.batch_in_epoch]


def test_a_drawn_batch_keeps_the_position_before_it_across_an_epoch_end():
    loader = Loader(per_epoch=2)
    first, second, third = draw(loader), draw(loader), draw(loader)
    assert [d.prompts for d in (first, second, third)] == [[1], [2], [101]]
    assert [d.epoch for d in (first, second, third)] == [0, 0, 1]
    # resuming at third.position draws the third batch again
    assert third.position == {"epoch": 0, "batch_in_epoch": 2}


def test_the_generation_runs_in_the_background_and_one_at_a_time():
    release = threading.Event()
    main = threading.current_thread()

    def collect(prompts, timer: Timer):
        assert threading.current_thread() is not main
        with timer("gen"):
            release.wait(timeout=10)
        return prompts

    generation = AheadGeneration(collect)
    try:
        generation.submit(draw(Loader(4)))
        assert generation.busy  # submit returned while the generation waits
        with pytest.raises(RuntimeError, match="already being generated"):
            generation.submit(draw(Loader(4)))
        release.set()
        done = generation.wait()
        assert not generation.busy and done.scored == [1]
        assert done.timer.seconds["gen"] <= done.finished - done.started
        with pytest.raises(RuntimeError, match="no batch"):
            generation.wait()
    finally:
        generation.close()


def test_a_failed_generation_raises_in_the_trainer_and_leaves_none_in_flight():
    def collect(prompts, timer):
        raise ValueError("reward function failed")

    generation = AheadGeneration(collect)
    try:
        generation.submit(draw(Loader(4)))
        with pytest.raises(ValueError, match="reward function failed"):
            generation.wait()
        assert not generation.busy
    finally:
        generation.close()


@pytest.mark.parametrize(
    ("started", "finished", "expected"),
    [(0.0, 10.0, 4.0), (3.0, 5.0, 2.0), (0.0, 1.0, 0.0), (7.0, 9.0, 0.0), (5.0, 9.0, 1.0)],
)
def test_overlap_is_the_generation_inside_the_trainers_passes(started, finished, expected):
    generated = Generated(draw(Loader(4)), None, Timer(), started, finished)
    assert overlap_seconds(generated, 2.0, 6.0) == expected


def test_staleness_is_the_policy_version_less_the_oldest_stamp_and_its_spread_over_the_rows():
    stamps = torch.tensor([3, 3, 2, 3])
    assert staleness_metrics(stamps, policy_version=3) == {
        "rollout/weight_version": 2.0,
        "rollout/staleness": 1.0,
        "rollout/staleness/min": 0.0,
        "rollout/staleness/mean": 0.25,
        "rollout/staleness/max": 1.0,
    }
    assert staleness_metrics(torch.tensor([5, 5]), policy_version=5)["rollout/staleness"] == 0.0
    assert staleness_metrics(None, policy_version=5) == {}  # rows without stamps (the agent loop's)
