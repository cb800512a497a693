"""DAPO's overlong penalty and dynamic sampling."""

import pytest
import torch

from kuberl.trainer.algorithms.dapo import DynamicSampler, DynamicSamplingExhausted, keep_groups, overlong_penalty


def test_overlong_penalty_ramps_linearly_over_the_buffer() -> None:
    # L_max 10, L_cache 4: free up to 6 tokens, then −(len − 6)/4 · factor
    lengths = torch.tensor([5, 6, 8, 10])
    penalty = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=1.0)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    half = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=0.5)
    torch.testing.assert_close(half, torch.tensor([0.0, 0.0, -0.25, -0.5]))


def test_overlong_penalty_refuses_a_buffer_as_long_as_the_response() -> None:
    with pytest.raises(ValueError, match=r"buffer length 10 must be in 1\.\.9"):
        overlong_penalty(torch.tensor([1]), max_response_length=10, buffer_length=10, penalty_factor=1.0)


def test_keep_groups_drops_groups_whose_metric_is_all_equal_and_keeps_singletons() -> None:
    keep = keep_groups(torch.tensor([0, 0, 1, 1, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 7.0]))
    assert keep.tolist() == [False, False, True, True, True]


def rows(width: int, first_token: int) -> dict[str, torch.Tensor]:
    """Four responses of ``width`` tokens; the first token tells the rows apart."""
    responses = torch.arange(first_token, first_token + 4).unsqueeze(-1).repeat(1, width)
    return {
        "prompts": torch.ones(4, 2, dtype=torch.long),
        "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "responses": responses,
        "response_mask": torch.ones(4, width, dtype=torch.long),
    }


def test_dynamic_sampler_merges_kept_groups_over_rounds_up_to_the_target() -> None:
    sampler: DynamicSampler[str] = DynamicSampler(target_groups=2, max_rounds=3)
    groups = torch.tensor([0, 0, 1, 1])
    # round 1: group 0 all 1.0 (dropped), group 1 varies (kept)
    sampler.add(rows(2, 10), ["a", "a", "b", "b"], groups, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert not sampler.full
    # round 2: both groups vary; only the first is needed
    sampler.add(rows(3, 20), ["c", "c", "d", "d"], groups, torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert sampler.full
    batch, items, group_ids = sampler.batch()
    assert items == ["b", "b", "c", "c"]
    assert group_ids.tolist() == [0, 0, 1, 1]
    assert batch["responses"][:, 0].tolist() == [12, 13, 20, 21]
    assert batch["responses"].shape == (4, 3)  # round 1's responses padded to round 2's width
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]]
    assert sampler.metrics() == {
        "dynamic_sampling/kept_groups": 3.0,
        "dynamic_sampling/dropped_groups": 1.0,
        "dynamic_sampling/rounds": 2.0,
    }


def test_dynamic_sampler_fails_the_step_after_its_round_bound() -> None:
    sampler: DynamicSampler[str] = DynamicSampler(target_groups=1, max_rounds=1)
    with pytest.raises(DynamicSamplingExhausted, match=r"kept 0 of the 1 prompts.*maxNumGenBatches = 1.*2 groups"):
        sampler.add(rows(1, 0), ["a"] * 4, torch.tensor([0, 0, 1, 1]), torch.ones(4))
    assert sampler.rounds == 1 and not sampler.full


def test_dynamic_sampler_batch_before_full_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="holds 0 of 2 groups"):
        DynamicSampler[str](target_groups=2, max_rounds=1).batch()
