import math
from typing import Any

import pytest
import torch

from kuberl.trainer.algorithms.losses import (
    LOSS_AGG_MODES,
    PolicyLossConfig,
    agg_loss,
    entropy_from_logits,
    log_probs_from_logits,
    masked_mean,
    policy_loss,
    value_loss,
)


def close(actual: torch.Tensor, expected: float | list[Any], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol)


# Two sequences, the first padded after two tokens (its 9 must never count).
LOSS = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
TOKENS, SEQS = 5.0, 2.0


def agg(mode: str, rows: slice = slice(None), **kwargs: float) -> torch.Tensor:
    return agg_loss(LOSS[rows], MASK[rows], mode, batch_tokens=TOKENS, batch_seqs=SEQS, **kwargs)


def test_loss_agg_modes_are_the_four_verl_modes() -> None:
    assert LOSS_AGG_MODES == ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def test_token_mean_divides_the_token_sum_by_batch_tokens() -> None:
    close(agg("token-mean"), 3.0)  # (1+2+3+4+5)/5


def test_seq_mean_token_sum_divides_sequence_sums_by_batch_seqs() -> None:
    close(agg("seq-mean-token-sum"), 7.5)  # (3 + 12)/2


def test_seq_mean_token_mean_averages_per_sequence_means() -> None:
    close(agg("seq-mean-token-mean"), 2.75)  # (3/2 + 12/3)/2


def test_seq_mean_token_sum_norm_divides_the_token_sum_by_the_scale_factor_only() -> None:
    close(agg("seq-mean-token-sum-norm"), 5.0)  # (3 + 12)/3, T = 3; no division by the 2 sequences
    close(agg("seq-mean-token-sum-norm", loss_scale_factor=5.0), 3.0)  # 15/5


def test_seq_mean_token_sum_norm_matches_verls_agg_loss_on_the_issue_example() -> None:
    # verl's agg_loss gives (1+2+3+4)/3 = 3.3333 here; dividing by the 2 sequences as well gave 1.6667.
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm", batch_tokens=4, batch_seqs=2), 10 / 3)


@pytest.mark.parametrize(
    ("mode", "first_row", "second_row"),
    [
        ("token-mean", 0.6, 2.4),  # 3/5, 12/5
        ("seq-mean-token-sum", 1.5, 6.0),  # 3/2, 12/2
        ("seq-mean-token-mean", 0.75, 2.0),  # (3/2)/2, (12/3)/2
        ("seq-mean-token-sum-norm", 1.0, 4.0),  # 3/3, 12/3
    ],
)
def test_micro_batch_shares_sum_to_the_full_batch_loss(mode: str, first_row: float, second_row: float) -> None:
    first, second = agg(mode, slice(0, 1)), agg(mode, slice(1, 2))
    close(first, first_row)
    close(second, second_row)
    close(first + second, agg(mode).item())


def test_unknown_agg_mode_names_the_mode_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'token-sum'.*token-mean, seq-mean-token-sum"):
        agg("token-sum")


def test_seq_mean_token_mean_counts_an_empty_sequence_as_zero() -> None:
    mask = torch.tensor([[1, 1], [0, 0]])
    loss = agg_loss(torch.ones(2, 2), mask, "seq-mean-token-mean", batch_tokens=2, batch_seqs=2)
    close(loss, 0.5)  # (2/2 + 0)/2


# One response of four tokens plus a padded fifth; clip 0.2 both sides, dual clip c = 3:
#   token 0: ratio 1.5, A =  2: max(-2*1.5, -2*1.2) = max(-3, -2.4) = -2.4  (clipped)
#   token 1: ratio 1.0, A =  1: max(-1, -1) = -1                          (not clipped)
#   token 2: ratio 0.5, A = -1: max(0.5, 0.8) = 0.8                       (clipped)
#   token 3: ratio 5.0, A = -1: max(5, 1.2) = 5 -> dual clip min(5, 3) = 3 (dual bound)
#   pad:     ratio 9.0, A = 10: ignored
RATIOS = torch.tensor([[1.5, 1.0, 0.5, 5.0, 9.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
ADV = torch.tensor([[2.0, 1.0, -1.0, -1.0, 10.0]])
PG_MASK = torch.tensor([[1, 1, 1, 1, 0]])


def pg(**overrides: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    config = PolicyLossConfig(**(dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0) | overrides))
    return policy_loss(
        OLD + RATIOS.log(), OLD, ADV, PG_MASK, config=config, agg_mode="token-mean", batch_tokens=4, batch_seqs=1
    )


def test_policy_loss_clips_positive_and_negative_advantages_and_applies_dual_clip() -> None:
    loss, _ = pg()
    close(loss, 0.1)  # (-2.4 - 1 + 0.8 + 3)/4


def test_policy_loss_clip_fractions_and_ppo_kl() -> None:
    _, metrics = pg()
    close(metrics["pg_clipfrac"], 0.5)  # tokens 0 and 2 of 4
    close(metrics["pg_clipfrac_lower"], 0.25)  # token 3 of 4
    # -(ln 1.5 + ln 1 + ln 0.5 + ln 5)/4 = -(0.405465 + 0 - 0.693147 + 1.609438)/4
    close(metrics["ppo_kl"], -0.330439)
    assert not any(m.requires_grad for m in metrics.values())


def test_policy_loss_asymmetric_clip_uses_the_higher_upper_bound() -> None:
    # token 0 now: max(-3, -2*1.28) = -2.56 -> (-2.56 - 1 + 0.8 + 3)/4 = 0.06
    loss, _ = pg(clip_ratio_high=0.28)
    close(loss, 0.06)


def test_policy_loss_dual_clip_bound_follows_clip_ratio_c() -> None:
    # token 3 now: min(5, 4) = 4 -> (-2.4 - 1 + 0.8 + 4)/4 = 0.35
    loss, _ = pg(clip_ratio_c=4.0)
    close(loss, 0.35)


def test_policy_loss_rejects_clip_ratio_c_not_above_one() -> None:
    with pytest.raises(ValueError, match=r"clip_ratio_c must be greater than 1\.0"):
        pg(clip_ratio_c=1.0)


def test_policy_loss_clamps_the_log_ratio_to_20() -> None:
    # log ratio -100 is clamped to -20: ratio e^-20 ~ 2e-9, A = -1 -> max(~0, 0.8) = 0.8; ppo_kl = 20
    log_probs = torch.tensor([[-101.0]], requires_grad=True)
    loss, metrics = policy_loss(
        log_probs,
        torch.tensor([[-1.0]]),
        torch.tensor([[-1.0]]),
        torch.ones(1, 1),
        config=PolicyLossConfig(),
        agg_mode="token-mean",
        batch_tokens=1,
        batch_seqs=1,
    )
    close(loss, 0.8)
    close(metrics["ppo_kl"], 20.0)
    (grad,) = torch.autograd.grad(loss, log_probs)
    assert torch.isfinite(grad).all()


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_error() -> None:
    # cliprange 0.5, old value 1 for all three tokens:
    #   v=2.0, R=2: clip(v)=1.5; (0)^2 vs (-0.5)^2 -> 0.25 (clipped)
    #   v=1.2, R=0: clip(v)=1.2; 1.44 vs 1.44     -> 1.44
    #   v=0.0, R=3: clip(v)=0.5; 9 vs 6.25        -> 9
    # loss = 0.5 * (0.25 + 1.44 + 9)/3 = 1.781667; vf_clipfrac = 1/3
    loss, metrics = value_loss(
        torch.tensor([[2.0, 1.2, 0.0, 50.0]]),
        torch.ones(1, 4),
        torch.tensor([[2.0, 0.0, 3.0, 0.0]]),
        torch.tensor([[1, 1, 1, 0]]),
        cliprange_value=0.5,
        agg_mode="token-mean",
        batch_tokens=3,
        batch_seqs=1,
    )
    close(loss, 1.781667)
    close(metrics["vf_clipfrac"], 1 / 3)


def test_masked_mean_over_a_dimension_ignores_padding() -> None:
    close(masked_mean(LOSS, MASK, dim=-1), [1.5, 4.0])  # (1+2)/2, (3+4+5)/3


def test_entropy_of_uniform_and_skewed_distributions() -> None:
    # uniform over 4 -> ln 4 = 1.386294; p = [1/4, 3/4] -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    # (-1e4 gives those two tokens probability exactly 0)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e4, -1e4]]])
    close(entropy_from_logits(logits), [[1.386294, 0.562335]])


# float32 spacing near 1000 is 6.1e-5, so results there are good to about 1e-4.


def test_entropy_is_stable_for_huge_logits() -> None:
    close(entropy_from_logits(torch.tensor([[[1000.0, 1000.0]]])), [[math.log(2.0)]], tol=1e-4)  # ln 2


def test_log_probs_pick_the_label_log_softmax() -> None:
    # softmax([0, ln 3]) = [1/4, 3/4]: label 1 -> ln 0.75 = -0.287682, label 0 -> ln 0.25 = -1.386294
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    close(log_probs_from_logits(logits, torch.tensor([[1, 0]])), [[-0.287682, -1.386294]])


def test_log_probs_are_stable_for_huge_logits() -> None:
    log_probs = log_probs_from_logits(torch.tensor([[[1000.0, 1000.0]]]), torch.tensor([[0]]))
    close(log_probs, [[-math.log(2.0)]], tol=1e-4)  # ln 1/2


def test_bfloat16_logits_are_upcast_to_float32() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    log_probs = log_probs_from_logits(logits, torch.tensor([[2]]))
    assert log_probs.dtype == torch.float32
    close(log_probs, [[-1.386294]])  # ln 1/4
    close(entropy_from_logits(logits), [[1.386294]])
