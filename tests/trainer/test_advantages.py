import math
from typing import Any

import pytest
import torch

from kuberl.trainer.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    generalized_advantage_estimate,
    masked_whiten,
    register_advantage,
)


def close(actual: torch.Tensor, expected: list[Any]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-5, rtol=1e-5)


def test_registry_holds_the_four_estimators() -> None:
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus"} <= set(ADVANTAGE_ESTIMATORS)


def test_unknown_estimator_error_lists_known_names() -> None:
    with pytest.raises(ValueError, match=r"'ppo'.*gae, gpg, grpo, grpo_passk, opo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo"):
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
