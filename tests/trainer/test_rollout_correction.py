"""Rollout importance sampling (``algorithm.rolloutCorrection``, verl's token-level truncated ``rollout_is``)
against values worked by hand.

Two responses of three tokens, the second padded after two:

    π_old      0.5   0.3   0.2  |  0.1   0.4   pad
    π_rollout  0.25  0.3   0.05 |  0.2   0.32  pad
    ratio      2.0   1.0   4.0  |  0.5   1.25
    weight     1.5   1.0   1.5  |  0.5   1.25  0     (threshold 1.5)
"""

import math

import pytest
import torch

from kuberl.trainer.algorithms.losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    policy_loss,
    rollout_is_metrics,
    rollout_is_weights,
)
from kuberl.trainer.experience.batch import Experience
from kuberl.trainer.experience.metrics import data_metrics

OLD = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.4, 1.0]]))
ROLLOUT = torch.log(torch.tensor([[0.25, 0.3, 0.05], [0.2, 0.32, 1.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
THRESHOLD = 1.5


def close(actual: torch.Tensor | float, expected: float | list[list[float]]) -> None:
    actual = torch.as_tensor(actual, dtype=torch.float32)
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-5)


def vanilla(agg_mode: str, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The vanilla PPO loss at the on-policy point (log π = log π_old, ratio 1) and its gradient in log π."""
    log_probs = OLD.clone().requires_grad_(True)
    loss, _ = policy_loss(
        log_probs,
        OLD,
        ADV,
        MASK,
        config=PolicyLossConfig(),
        agg_mode=agg_mode,
        batch_tokens=5.0,
        batch_seqs=2.0,
        rollout_is_weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, log_probs)
    return loss.detach(), grad


def test_weights_are_the_ratio_capped_at_the_threshold_and_zero_at_padding() -> None:
    weights = rollout_is_weights(OLD, ROLLOUT, MASK, THRESHOLD)
    close(weights, [[1.5, 1.0, 1.5], [0.5, 1.25, 0.0]])


def test_no_gradient_flows_through_the_weights() -> None:
    old = OLD.clone().requires_grad_(True)
    assert not rollout_is_weights(old, ROLLOUT, MASK, THRESHOLD).requires_grad


def test_a_far_off_token_does_not_overflow() -> None:
    """log ratio 100 is clamped to 20 before exp (verl's safety bound), then capped."""
    old, rollout, mask = torch.tensor([[0.0]]), torch.tensor([[-100.0]]), torch.tensor([[1.0]])
    close(rollout_is_weights(old, rollout, mask, THRESHOLD), [[1.5]])
    close(rollout_is_metrics(old, rollout, mask, THRESHOLD)["mismatch/rollout_is_max"], math.exp(20.0))


def test_token_mean_loss_is_weighted_per_token() -> None:
    """Per-token loss −A at ratio 1: [[-1, -1, -1], [2, 2, 0]]; weighted [[-1.5, -1, -1.5], [1, 2.5, 0]], sum −0.5,
    over 5 tokens −0.1 (uncorrected: (−3 + 4) / 5 = 0.2). Gradient −A·w / 5."""
    plain, _ = vanilla("token-mean", None)
    close(plain, 0.2)
    loss, grad = vanilla("token-mean", rollout_is_weights(OLD, ROLLOUT, MASK, THRESHOLD))
    close(loss, -0.1)
    close(grad, [[-0.3, -0.2, -0.3], [0.2, 0.5, 0.0]])


def test_sequence_means_divide_by_the_token_count_not_the_weights() -> None:
    """seq-mean-token-mean: (−4/3 + 3.5/2) / 2 = 5/24."""
    loss, _ = vanilla("seq-mean-token-mean", rollout_is_weights(OLD, ROLLOUT, MASK, THRESHOLD))
    close(loss, 5 / 24)


@pytest.mark.parametrize("mode", sorted(set(POLICY_LOSSES) - {"geo_mean"}))
def test_every_per_token_loss_takes_the_weights(mode: str) -> None:
    """Weights of 1 leave each loss as it is; weights of 2 double it (clip_cov draws the same tokens each time)."""
    log_probs = OLD + torch.tensor([[0.1, -0.05, 0.3], [-0.2, 0.02, 0.0]])

    def loss(weights: torch.Tensor | None) -> float:
        torch.manual_seed(0)
        value, _ = policy_loss(
            log_probs,
            OLD,
            ADV,
            MASK,
            config=PolicyLossConfig(loss_mode=mode),
            agg_mode="token-mean",
            batch_tokens=5.0,
            batch_seqs=2.0,
            rollout_is_weights=weights,
        )
        return float(value)

    plain = loss(None)
    assert abs(plain) > 1e-3
    close(loss(torch.ones_like(MASK)), plain)
    close(loss(2 * torch.ones_like(MASK)), 2 * plain)


def test_geo_mean_refuses_token_weights() -> None:
    with pytest.raises(ValueError, match="geo_mean has one loss per sequence"):
        policy_loss(
            OLD,
            OLD,
            ADV,
            MASK,
            config=PolicyLossConfig(loss_mode="geo_mean"),
            agg_mode="token-mean",
            batch_tokens=5.0,
            batch_seqs=2.0,
            rollout_is_weights=torch.ones_like(MASK),
        )


def step_experience() -> Experience:
    return Experience(
        prompts=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        responses=torch.ones(2, 3, dtype=torch.long),
        response_mask=MASK.long(),
        response_attention_mask=None,
        rollout_log_probs=ROLLOUT,
        weight_version=None,
        samples=[],
        group_ids=torch.tensor([0, 0]),
        scores=torch.zeros(2),
        token_rewards=torch.zeros(2, 3),
        advantages=ADV,
        returns=ADV,
        old_log_probs=OLD,
        entropy=None,
        ref_log_probs=None,
        values=None,
        metrics={},
    )


def test_step_metrics_report_the_weights_when_the_correction_is_on() -> None:
    """Ratios 2, 1, 4, 0.5, 1.25 over the 5 valid tokens: mean 1.75, max 4, min 0.5, 2 of 5 above 1.5."""
    on = data_metrics(step_experience(), max_response_length=3, kl_coef=None, rollout_is_threshold=THRESHOLD)
    close(on["mismatch/rollout_is_mean"], 1.75)
    close(on["mismatch/rollout_is_max"], 4.0)
    close(on["mismatch/rollout_is_min"], 0.5)
    close(on["mismatch/rollout_is_ratio_fraction_high"], 0.4)
    off = data_metrics(step_experience(), max_response_length=3, kl_coef=None)
    assert set(on) - set(off) == {
        "mismatch/rollout_is_mean",
        "mismatch/rollout_is_max",
        "mismatch/rollout_is_min",
        "mismatch/rollout_is_ratio_fraction_high",
    }
    assert {k: on[k] for k in off} == off
