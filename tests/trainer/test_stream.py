"""The asynchronous stream's bookkeeping, without engines: how many groups it admits (the staleness bound), which
ready groups it regenerates, and the loader position a checkpoint keeps when prompts were trained out of order."""

from __future__ import annotations

import torch

from kuberl.trainer.data.prompts import PromptLoader
from kuberl.trainer.experience.stream import GroupStream, Ready
from kuberl.trainer.plan.execution import Sampling
from tests.trainer.test_data import dataset

BATCH = 4


class Pool:
    """What the stream reads of its engine pool: the weights' version, the engines, the engines' idle time."""

    def __init__(self, engines: int = 1) -> None:
        self.version = 0
        self.size = engines

    def engine_seconds(self) -> tuple[float, float]:
        return 0.0, 0.0


def stream(staleness: int, *, pool: Pool | None = None, loader: PromptLoader | None = None) -> GroupStream:
    made = GroupStream(
        pool=pool or Pool(),  # type: ignore[arg-type]
        loader=loader or PromptLoader(dataset(64), BATCH, seed=0),
        scorer=None,  # type: ignore[arg-type]
        sampling=Sampling(1.0, 1.0, -1, 8),
        rollout_n=2,
        max_staleness=staleness,
        pad_id=0,
    )
    made.restore(0, total_steps=100)
    return made


def admitted(s: GroupStream) -> int:
    """Groups the stream hands out until the bound stops it."""
    count = 0
    while (chunk := s.next_chunk(engine=None)) is not None:  # type: ignore[arg-type]
        count += len(chunk.fresh)
    return count


def test_generation_runs_at_most_k_plus_one_batches_ahead_of_the_weights():
    pool = Pool()
    s = stream(2, pool=pool)
    assert admitted(s) == 3 * BATCH  # (version 0 + k 2 + 1) batches
    pool.version = 1
    assert admitted(s) == BATCH
    assert admitted(s) == 0


def test_nothing_is_admitted_past_the_runs_last_step():
    s = stream(4)
    s.restore(0, total_steps=2)
    assert admitted(s) == 2 * BATCH


def test_a_ready_group_older_than_the_bound_is_regenerated_before_anything_new():
    pool = Pool()
    s = stream(1, pool=pool)
    chunk = s.next_chunk(engine=None)  # type: ignore[arg-type]
    assert chunk is not None
    old, fresh = chunk.fresh[0], chunk.fresh[1]
    nothing = torch.zeros(2)
    s.ready = [Ready(old, {}, nothing, {}, version=0, interrupted=0), Ready(fresh, {}, nothing, {}, 1, 0)]
    pool.version = 2  # step 3 trains the policy of step 2: version 0 is two behind, one too many
    s.drop_stale()
    assert [r.group for r in s.ready] == [fresh]
    assert s.todo[0] == old and s.counters.dropped == 1
    assert s.next_chunk(engine=None).fresh[0] == old  # type: ignore[arg-type, union-attr]


def test_a_checkpoint_keeps_the_oldest_untrained_batch_and_the_prompts_trained_after_it():
    s = stream(2)
    for _ in range(3):
        s.draw()
    assert [g.ordinal for g in s.todo] == list(range(12))
    s.record_trained([0, 1, 2, 3, 5, 6, 8])
    assert s.resume_position() == {"epoch": 0, "batch_in_epoch": 1, "trained_ahead": [1, 2, 4]}


def test_a_resumed_stream_skips_the_prompts_trained_before_the_checkpoint():
    loader = PromptLoader(dataset(64), BATCH, seed=0)
    loader.load_state_dict({"epoch": 0, "batch_in_epoch": 1, "trained_ahead": [1, 2, 4]})
    s = stream(2, loader=loader)
    s.draw()
    s.draw()
    assert [g.ordinal for g in s.todo] == [4, 7, 9, 10, 11]
    expected = loader.order(0)
    assert [g.prompt.index for g in s.todo] == [int(expected[i]) for i in (4, 7, 9, 10, 11)]
    assert s.resume_position() == {"epoch": 0, "batch_in_epoch": 1, "trained_ahead": [1, 2, 4]}


def test_a_resumed_streams_checkpoint_keeps_the_skips_it_has_not_drawn_yet():
    """Stopped again after training every prompt it drew: the skips of a later batch carry over, so a second resume
    does not train them twice."""
    loader = PromptLoader(dataset(64), BATCH, seed=0)
    loader.load_state_dict({"epoch": 0, "batch_in_epoch": 1, "trained_ahead": [1, 2, 4, 9]})
    s = stream(2, loader=loader)
    s.draw()
    assert [g.ordinal for g in s.todo] == [4, 7]
    s.record_trained([g.ordinal for g in s.todo])
    assert s.resume_position() == {"epoch": 0, "batch_in_epoch": 2, "trained_ahead": [0, 5]}


def test_with_every_prompt_drawn_trained_the_checkpoint_keeps_the_loaders_next_batch():
    s = stream(2)
    for _ in range(len(s.loader)):
        s.draw()
    s.record_trained([g.ordinal for g in s.todo])
    assert s.resume_position() == {"epoch": 1, "batch_in_epoch": 0, "trained_ahead": []}


def test_groups_between_the_streams_lists_still_hold_the_checkpoints_position():
    """Groups handed to an engine before their call is registered, or scored after their generation came back, are
    in none of the stream's queues for a moment: a checkpoint then still resumes before them."""
    s = stream(2)
    chunk = s.next_chunk(engine=None)  # type: ignore[arg-type]
    assert chunk is not None and [g.ordinal for g in chunk.fresh] == [0, 1, 2, 3] and not s.todo
    assert s.resume_position() == {"epoch": 0, "batch_in_epoch": 0, "trained_ahead": []}
    s.record_trained([0, 2])
    assert s.resume_position() == {"epoch": 0, "batch_in_epoch": 0, "trained_ahead": [0, 2]}
