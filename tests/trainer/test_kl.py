import math
from typing import Any

import pytest
import torch

from kuberl.trainer.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)


def close(actual: torch.Tensor | float, expected: float | list[Any]) -> None:
    actual = torch.as_tensor(actual, dtype=torch.float32)
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-5)


# π = 0.5, π_ref = 0.25 on the first token (d = ln 2 = 0.693147); swapped on the second (d = -ln 2).
LOGP = torch.tensor([[math.log(0.5), math.log(0.25)]])
REF = torch.tensor([[math.log(0.25), math.log(0.5)]])


def test_kl_kinds_are_k1_k2_k3_abs() -> None:
    assert KL_KINDS == ("k1", "k2", "k3", "abs")


def test_k1_is_the_log_ratio() -> None:
    close(kl_penalty(LOGP, REF, "k1"), [[0.693147, -0.693147]])


def test_k2_is_half_the_squared_log_ratio() -> None:
    close(kl_penalty(LOGP, REF, "k2"), [[0.240227, 0.240227]])  # 0.5 * 0.693147^2


def test_k3_is_the_low_variance_estimator() -> None:
    # d = ln 2:  e^-d + d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # d = -ln 2: e^d - d - 1  = 2 - 0.693147 - 1   = 0.306853
    close(kl_penalty(LOGP, REF, "k3"), [[0.193147, 0.306853]])


def test_k3_is_clamped_to_10() -> None:
    # d = -30: e^30 - 30 - 1 is huge -> 10 (and the exponent is clamped to 20 first, so no inf)
    close(kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "k3"), [[10.0]])


def test_abs_is_the_absolute_log_ratio() -> None:
    close(kl_penalty(LOGP, REF, "abs"), [[0.693147, 0.693147]])


def test_unknown_kl_kind_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'low_var_kl'.*k1, k2, k3, abs"):
        kl_penalty(LOGP, REF, "low_var_kl")


def test_fixed_controller_never_moves() -> None:
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=10.0, n_steps=1000)
    assert ctl.value == 0.05


def test_adaptive_controller_raises_beta_when_kl_is_above_target() -> None:
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1, horizon=100)
    # error = 0.15/0.1 - 1 = 0.5, clipped to 0.2; mult = 1 + 0.2*10/100 = 1.02 -> 0.102
    ctl.update(current_kl=0.15, n_steps=10)
    assert math.isclose(ctl.value, 0.102)


def test_adaptive_controller_lowers_beta_when_kl_is_below_target() -> None:
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1, horizon=100)
    # error = 0.09/0.1 - 1 = -0.1; mult = 1 - 0.1*10/100 = 0.99 -> 0.099
    ctl.update(current_kl=0.09, n_steps=10)
    assert math.isclose(ctl.value, 0.099)


def test_adaptive_controller_needs_a_positive_horizon() -> None:
    with pytest.raises(ValueError, match="horizon > 0"):
        make_kl_controller("adaptive", 0.1, 0.1, 0)


def test_controller_state_round_trips() -> None:
    ctl = make_kl_controller("adaptive", 0.1, 0.1, 100)
    ctl.update(current_kl=1.0, n_steps=10)
    restored = make_kl_controller("adaptive", 0.1, 0.1, 100)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value == pytest.approx(0.102)


def test_make_kl_controller_picks_the_kind_and_rejects_unknown() -> None:
    assert isinstance(make_kl_controller("fixed", 0.001, 0.1, 10000), FixedKLController)
    assert isinstance(make_kl_controller("adaptive", 0.001, 0.1, 10000), AdaptiveKLController)
    with pytest.raises(ValueError, match="'pid'"):
        make_kl_controller("pid", 0.001, 0.1, 10000)


def test_kl_in_reward_subtracts_beta_times_kl_on_valid_tokens() -> None:
    # k1 KL per token: seq 0 [0.1, 0.2, 0.3]; seq 1 [0.4, -0.2, pad 9].  beta = 0.5
    #   seq 0: [0 - 0.05, 0 - 0.1, 1 - 0.15] = [-0.05, -0.1, 0.85]
    #   seq 1: [0 - 0.2, 1 + 0.1, pad 0]    = [-0.2, 1.1, 0]
    # mean_kl = mean(0.6/3, 0.2/2) = mean(0.2, 0.1) = 0.15
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ref = torch.full((2, 3), -1.0)
    log_probs = ref + torch.tensor([[0.1, 0.2, 0.3], [0.4, -0.2, 9.0]])
    rewards, mean_kl = apply_kl_in_reward(
        scores, log_probs, ref, torch.tensor([[1, 1, 1], [1, 1, 0]]), coef=0.5, kind="k1"
    )
    close(rewards, [[-0.05, -0.1, 0.85], [-0.2, 1.1, 0.0]])
    assert isinstance(mean_kl, float)
    assert math.isclose(mean_kl, 0.15, rel_tol=1e-5)
