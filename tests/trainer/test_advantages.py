import math
from typing import Any

import pytest
import torch

from kuberl.trainer.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    generalized_advantage_estimate,
    masked_whiten,
    register_advantage,
)


def close(actual: torch.Tensor, expected: list[Any]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-5, rtol=1e-5)


def test_registry_holds_verls_estimators() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
        "grpo_passk",
    }


def test_unknown_estimator_error_lists_known_names() -> None:
    with pytest.raises(
        ValueError,
        match=r"'ppo'.*gae, gpg, grpo, grpo_passk, opo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo",
    ):
        compute_advantages("ppo", torch.zeros(1, 1), torch.ones(1, 1))


def test_registering_a_name_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(ADVANTAGE_ESTIMATORS["grpo"])


# GAE, gamma=0.9, lam=0.8 (gamma*lam = 0.72), rewards [0, 0, 1], values [0.5, 0.4, 0.3]:
#   t=2: delta = 1 + 0.9*0   - 0.3 =  0.7;   A2 = 0.7
#   t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13;  A1 = -0.13 + 0.72*0.7   = 0.374
#   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;  A0 = -0.14 + 0.72*0.374 = 0.12928
#   returns = A + V = [0.62928, 0.774, 1.0]
GAE_ADV = [0.12928, 0.374, 0.7]
GAE_RET = [0.62928, 0.774, 1.0]


def test_gae_advantages_and_returns_before_whitening() -> None:
    adv, ret = generalized_advantage_estimate(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]]), torch.ones(1, 3), gamma=0.9, lam=0.8
    )
    close(adv, [GAE_ADV])
    close(ret, [GAE_RET])


def test_gae_ignores_padded_tokens() -> None:
    # The pad token's reward 5 and value 9 must not leak into the valid tokens.
    adv, ret = generalized_advantage_estimate(
        torch.tensor([[0.0, 0.0, 1.0, 5.0]]),
        torch.tensor([[0.5, 0.4, 0.3, 9.0]]),
        torch.tensor([[1, 1, 1, 0]]),
        gamma=0.9,
        lam=0.8,
    )
    close(adv, [[*GAE_ADV, 0.0]])
    close(ret, [[*GAE_RET, 0.0]])


def test_gae_carries_the_recursion_across_a_masked_token_inside_a_response() -> None:
    # mask [1, 0, 1], gamma=0.5, lam=1, rewards [0, 7, 1], values [0.2, 9, 0.4]:
    #   t=2: delta = 1 - 0.4 = 0.6; A2 = 0.6
    #   t=1 masked: V and A from t=2 carried unchanged
    #   t=0: delta = 0 + 0.5*0.4 - 0.2 = 0; A0 = 0 + 0.5*0.6 = 0.3; R0 = 0.3 + 0.2 = 0.5
    adv, ret = generalized_advantage_estimate(
        torch.tensor([[0.0, 7.0, 1.0]]),
        torch.tensor([[0.2, 9.0, 0.4]]),
        torch.tensor([[1.0, 0.0, 1.0]]),
        gamma=0.5,
        lam=1.0,
    )
    close(adv, [[0.3, 0.0, 0.6]])
    close(ret, [[0.5, 0.0, 1.0]])


def test_gae_estimator_whitens_advantages_and_keeps_raw_returns() -> None:
    # Whitening GAE_ADV: mean = 1.20328/3 = 0.401093; deviations -0.271813, -0.027093, 0.298907;
    # unbiased var = (0.073882 + 0.000734 + 0.089345)/2 = 0.081981, std = 0.286323
    adv, ret = compute_advantages(
        "gae",
        torch.tensor([[0.0, 0.0, 1.0, 5.0]]),
        torch.tensor([[1, 1, 1, 0]]),
        values=torch.tensor([[0.5, 0.4, 0.3, 9.0]]),
        gamma=0.9,
        lam=0.8,
    )
    close(adv, [[-0.949326, -0.094624, 1.043949, 0.0]])
    close(ret, [[*GAE_RET, 0.0]])


def test_gae_without_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="'gae' needs values="):
        compute_advantages("gae", torch.zeros(1, 2), torch.ones(1, 2))


def test_masked_whiten_of_a_single_token_is_zero_not_nan() -> None:
    close(masked_whiten(torch.tensor([[3.0, 4.0]]), torch.tensor([[1, 0]])), [[0.0, 0.0]])


# Outcome rewards sit on each response's last valid token; groups are interleaved and
# their ids are not contiguous. Scores: id 7 -> [1, 0, 0], id 3 -> [1, 3], id 9 -> [0.5].
GROUP_IDS = torch.tensor([7, 3, 7, 9, 3, 7])
GROUP_REWARDS = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.5], [0.0, 3.0], [0.0, 0.0]])
GROUP_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1]])


def test_grpo_normalizes_by_group_mean_and_unbiased_std() -> None:
    # id 7: mean 1/3, var = ((2/3)^2 + 2*(1/3)^2)/2 = 1/3, std = 0.577350
    #       -> (2/3)/0.577350 = 1.154699, (-1/3)/0.577350 = -0.577350
    # id 3: mean 2, var = (1 + 1)/1 = 2, std = 1.414214 -> -1/1.414214 = -0.707107, +0.707107
    # id 9: group of one -> mean 0, std 1 -> 0.5/(1 + 1e-6) = 0.4999995
    adv, ret = compute_advantages("grpo", GROUP_REWARDS, GROUP_MASK, group_ids=GROUP_IDS)
    expected = [
        [1.154699, 1.154699],
        [-0.707107, 0.0],  # second token is padding
        [-0.577350, -0.577350],
        [0.4999995, 0.4999995],
        [0.707107, 0.707107],
        [-0.577350, -0.577350],
    ]
    close(adv, expected)
    close(ret, expected)


def test_grpo_without_std_normalization_is_dr_grpo_mean_centering() -> None:
    # id 7: [1, 0, 0] - 1/3; id 3: [1, 3] - 2; id 9: 0.5 - 0
    adv, _ = compute_advantages("grpo", GROUP_REWARDS, GROUP_MASK, group_ids=GROUP_IDS, norm_adv_by_std=False)
    third = 1 / 3
    close(
        adv,
        [[2 * third] * 2, [-1.0, 0.0], [-third] * 2, [0.5, 0.5], [1.0, 1.0], [-third] * 2],
    )


def test_grpo_ignores_rewards_on_padded_tokens() -> None:
    rewards = torch.tensor([[1.0, 100.0], [0.0, 0.0]])
    adv, _ = compute_advantages("grpo", rewards, torch.tensor([[1, 0], [1, 1]]), group_ids=torch.tensor([0, 0]))
    # scores [1, 0]: mean 0.5, std sqrt(0.5) = 0.707107 -> +-0.707107
    close(adv, [[0.707107, 0.0], [-0.707107, -0.707107]])


def test_rloo_subtracts_the_mean_of_the_other_responses() -> None:
    # scores [1, 2, 6]: 1 - (2+6)/2 = -3; 2 - (1+6)/2 = -1.5; 6 - (1+2)/2 = 4.5
    # a group of one (score 4) keeps its raw score
    rewards = torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 6.0], [0.0, 4.0]])
    adv, ret = compute_advantages("rloo", rewards, torch.ones(4, 2), group_ids=torch.tensor([0, 0, 0, 1]))
    expected = [[-3.0, -3.0], [-1.5, -1.5], [4.5, 4.5], [4.0, 4.0]]
    close(adv, expected)
    close(ret, expected)


def test_reinforce_plus_plus_discounts_and_whitens() -> None:
    # gamma 0.5, rewards [0, 0, 1] -> G = [0.25, 0.5, 1]; the pad token's reward 7 is dropped.
    # mean 1.75/3 = 0.583333; deviations -0.333333, -0.083333, 0.416667;
    # unbiased var = (0.111111 + 0.006944 + 0.173611)/2 = 0.145833, std = 0.381881
    adv, ret = compute_advantages(
        "reinforce_plus_plus", torch.tensor([[0.0, 0.0, 1.0, 7.0]]), torch.tensor([[1, 1, 1, 0]]), gamma=0.5
    )
    close(ret, [[0.25, 0.5, 1.0, 0.0]])
    close(adv, [[-0.872872, -0.218218, 1.091089, 0.0]])


def test_reinforce_plus_plus_restarts_the_return_at_a_masked_token() -> None:
    # mask [1, 0, 1], gamma 1, rewards [1, 2, 3]: G2 = 3, G1 masked = 0, G0 = 1 + 0 = 1
    _, ret = compute_advantages(
        "reinforce_plus_plus", torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1, 0, 1]]), gamma=1.0
    )
    close(ret, [[1.0, 0.0, 3.0]])


def test_grpo_needs_group_ids() -> None:
    with pytest.raises(ValueError, match="'grpo' needs group_ids="):
        compute_advantages("grpo", torch.zeros(2, 2), torch.ones(2, 2))


def test_whitened_advantages_have_zero_mean_and_unit_std_over_valid_tokens() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, _ = compute_advantages("reinforce_plus_plus", torch.randn(2, 4), mask, gamma=0.9)
    valid = adv[mask.bool()]
    assert math.isclose(valid.mean().item(), 0.0, abs_tol=1e-6)
    assert math.isclose(valid.std().item(), 1.0, rel_tol=1e-5)


# --- issue 18: reinforce_plus_plus_baseline, opo, gpg, grpo_passk, remax ---


def outcome(scores: list[float], lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score on its response's last token, and the response mask."""
    mask = torch.tensor([[1 if t < n else 0 for t in range(width)] for n in lengths])
    rewards = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, n - 1] = s
    return rewards, mask


def test_reinforce_plus_plus_baseline_whitens_the_group_centred_scores_over_tokens() -> None:
    # groups [0,0,1,1], scores [2,0,3,3] -> centred [1,−1,0,0]; one token each: mean 0, unbiased var 2/3,
    # so ±1/√(2/3) = ±1.224745; the padded second token stays 0
    rewards, mask = outcome([2.0, 0.0, 3.0, 3.0], [1, 1, 1, 1], 2)
    adv, ret = compute_advantages("reinforce_plus_plus_baseline", rewards, mask, group_ids=torch.tensor([0, 0, 1, 1]))
    close(adv, [[1.224745, 0.0], [-1.224745, 0.0], [0.0, 0.0], [0.0, 0.0]])
    close(ret, adv.tolist())


def test_opo_baseline_is_the_length_weighted_group_mean() -> None:
    # group 0: lengths 1 and 3, scores 1 and 0 -> b = (1·1 + 3·0)/4 = 0.25 -> A = [0.75, −0.25]
    # group 1: one response of length 2 scoring 2 -> baseline 0 -> A = 2
    rewards, mask = outcome([1.0, 0.0, 2.0], [1, 3, 2], 3)
    adv, _ = compute_advantages("opo", rewards, mask, group_ids=torch.tensor([0, 0, 1]))
    close(adv, [[0.75, 0.0, 0.0], [-0.25, -0.25, -0.25], [2.0, 2.0, 0.0]])


def test_gpg_scales_centred_scores_by_batch_over_nonzero_rewards() -> None:
    # scores [1,0,0,0]: one nonzero of 4 -> a = 4; group means 0.5 and 0 -> A = 4·[0.5, −0.5, 0, 0]
    rewards, mask = outcome([1.0, 0.0, 0.0, 0.0], [1, 1, 1, 1], 1)
    adv, _ = compute_advantages("gpg", rewards, mask, group_ids=torch.tensor([0, 0, 1, 1]))
    close(adv, [[2.0], [-2.0], [0.0], [0.0]])


def test_gpg_with_no_nonzero_reward_keeps_a_at_batch_size() -> None:
    rewards, mask = outcome([0.0, 0.0], [1, 1], 1)
    adv, _ = compute_advantages("gpg", rewards, mask, group_ids=torch.tensor([0, 0]))
    close(adv, [[0.0], [0.0]])


def test_grpo_passk_rewards_only_the_best_response_by_its_margin() -> None:
    # group 0 scores [0, 4, 2]: best 4 (row 1), second 2 -> margin 2; group 1 [5, 5]: margin 0
    rewards, mask = outcome([0.0, 4.0, 2.0, 5.0, 5.0], [1] * 5, 1)
    groups = torch.tensor([0, 0, 0, 1, 1])
    raw, _ = compute_advantages("grpo_passk", rewards, mask, group_ids=groups, norm_adv_by_std=False)
    close(raw, [[0.0], [2.0], [0.0], [0.0], [0.0]])
    # with std: group 0 has mean 2, unbiased var (4 + 4 + 0)/2 = 4, std 2 -> 2/(2 + 1e-6)
    normed, _ = compute_advantages("grpo_passk", rewards, mask, group_ids=groups)
    close(normed, [[0.0], [1.0], [0.0], [0.0], [0.0]])


def test_grpo_passk_refuses_a_group_of_one() -> None:
    rewards, mask = outcome([1.0, 2.0, 3.0], [1, 1, 1], 1)
    with pytest.raises(ValueError, match=r"grpo_passk.*at least 2 responses per group"):
        compute_advantages("grpo_passk", rewards, mask, group_ids=torch.tensor([0, 0, 1]))


def test_remax_subtracts_the_greedy_baseline_from_the_return_to_go() -> None:
    # row 0 rewards [0, 0, 1] -> G = [1, 1, 1], b = 0.5; row 1 rewards [0, 2 | pad] -> G = [2, 2, 0], b = 3
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantages("remax", rewards, mask, reward_baselines=torch.tensor([0.5, 3.0]))
    close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    close(adv, [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])


def test_remax_needs_the_greedy_baselines() -> None:
    with pytest.raises(ValueError, match=r"'remax' needs reward_baselines="):
        compute_advantages("remax", torch.zeros(1, 1), torch.ones(1, 1))
