"""The registered policy losses against values worked by hand (verl's definitions, issue 18)."""

import math
from typing import Any

import pytest
import torch

from kuberl.api.spec import Algorithm
from kuberl.trainer.algorithms.losses import POLICY_LOSSES, PolicyLossConfig, policy_loss


def close(actual: torch.Tensor, expected: float | list[Any], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol)


def run(
    mode: str,
    log_probs: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str = "token-mean",
    **knobs: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Loss, metrics and d loss / d log_probs."""
    log_probs = log_probs.clone().requires_grad_(True)
    config = PolicyLossConfig(loss_mode=mode, **knobs)
    tokens, seqs = float(mask.sum()), float(mask.shape[0])
    loss, metrics = policy_loss(
        log_probs, old, adv, mask, config=config, agg_mode=agg_mode, batch_tokens=tokens, batch_seqs=seqs
    )
    (grad,) = torch.autograd.grad(loss, log_probs)
    return loss.detach(), metrics, grad


def test_registry_holds_verls_loss_modes() -> None:
    assert set(POLICY_LOSSES) == {"vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"}


def test_unknown_loss_mode_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'ppo'.*known losses: cispo, clip_cov, geo_mean, gpg, gspo, kl_cov, vanilla"):
        run("ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))


def test_config_from_spec_reads_the_shared_clip_and_the_loss_knobs() -> None:
    algo = Algorithm.model_validate(
        {"clipRatioHigh": 0.28, "policyLoss": {"lossMode": "kl_cov", "klCovRatio": 0.01, "ppoKlCoef": 1.0}}
    )
    config = PolicyLossConfig.from_spec(algo)
    assert (config.loss_mode, config.clip_ratio_low, config.clip_ratio_high) == ("kl_cov", 0.2, 0.28)
    assert (config.kl_cov_ratio, config.ppo_kl_coef, config.clip_cov_ub) == (0.01, 1.0, 5.0)


# GSPO: sequence 0 has token log-ratios [ln 2, 0] -> s_0 = exp(ln2 / 2) = √2 = 1.414214, A = +1;
# sequence 1 has one token of log-ratio ln 0.5 (its second token is padding) -> s_1 = 0.5, A = −1.
GSPO_LP = torch.tensor([[math.log(2.0), 0.0], [math.log(0.5), 3.0]])
GSPO_ADV = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
GSPO_MASK = torch.tensor([[1, 1], [1, 0]])


def test_gspo_clips_the_sequence_ratio_and_means_per_sequence() -> None:
    # seq 0: max(−√2, −1.2) = −1.2 on both tokens; seq 1: max(0.5, 0.8) = 0.8. seq-mean-token-mean: (−1.2 + 0.8)/2
    loss, metrics, grad = run("gspo", GSPO_LP, torch.zeros(2, 2), GSPO_ADV, GSPO_MASK, "seq-mean-token-mean")
    close(loss, -0.2)
    close(metrics["pg_clipfrac"], 1.0)  # all three tokens took the clipped term
    close(metrics["ppo_kl"], 0.0)  # −(ln 2 + 0 + ln 0.5)/3
    close(grad, [[0.0, 0.0], [0.0, 0.0]])


def test_gspo_gives_every_token_the_sequence_ratio_as_its_gradient_weight() -> None:
    # Unclipped (bounds [0, 11]): L = (1/2)·[(1/2)Σ_t −A·s_0 + (−A·s_1)]; d/d log π_{0,t} = −(1/4)·√2 = −0.353553,
    # d/d log π_{1,0} = +(1/2)·0.5 = 0.25; a padded token gets no gradient.
    _, metrics, grad = run(
        "gspo",
        GSPO_LP,
        torch.zeros(2, 2),
        GSPO_ADV,
        GSPO_MASK,
        "seq-mean-token-mean",
        clip_ratio_low=1.0,
        clip_ratio_high=10.0,
    )
    close(grad, [[-0.353553, -0.353553], [0.25, 0.0]])
    close(metrics["pg_clipfrac"], 0.0)


# A 3×5 batch where the modes differ (issue 38): sequence ratios s = 1.1 (5 tokens, A = +1, inside the clip band),
# 0.5 (2 tokens, A = −1: clipped to 0.8), 1.5 (1 token, A = +2: clipped to 1.2); padding holds 7.0.
# Token losses: −1.1 ×5, max(0.5, 0.8) = 0.8 ×2, max(−3.0, −2.4) = −2.4 ×1.
# seq-mean-token-mean: (−1.1 + 0.8 − 2.4)/3 = −0.9 (GSPO's; verl's compute_policy_loss_gspo gives the same);
# token-mean would be (−5.5 + 1.6 − 2.4)/8 = −0.7875.
GSPO_3X5_LP = torch.tensor(
    [[math.log(1.1)] * 5, [math.log(0.5)] * 2 + [7.0] * 3, [math.log(1.5)] + [7.0] * 4], dtype=torch.float64
)
GSPO_3X5_ADV = torch.tensor([[1.0] * 5, [-1.0] * 5, [2.0] * 5], dtype=torch.float64)
GSPO_3X5_MASK = torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])


@pytest.mark.parametrize(
    "agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_gspo_trains_the_papers_objective_whatever_loss_agg_mode_says(agg_mode: str) -> None:
    loss, _, _ = run("gspo", GSPO_3X5_LP, torch.zeros_like(GSPO_3X5_LP), GSPO_3X5_ADV, GSPO_3X5_MASK, agg_mode)
    close(loss, -0.9)


def test_an_imported_verl_gspo_run_trains_verls_objective() -> None:
    from kuberl.api.verl import to_rljob

    prefix = "actor_rollout_ref.actor."
    imported = to_rljob({f"{prefix}policy_loss.loss_mode": "gspo", f"{prefix}loss_agg_mode": "token-mean"})
    algorithm = Algorithm.model_validate(imported.document["spec"]["algorithm"])
    lp = GSPO_3X5_LP.clone().requires_grad_(True)
    loss, _ = policy_loss(
        lp,
        torch.zeros_like(lp),
        GSPO_3X5_ADV,
        GSPO_3X5_MASK,
        config=PolicyLossConfig.from_spec(algorithm),
        agg_mode=algorithm.loss_agg_mode,
        batch_tokens=float(GSPO_3X5_MASK.sum()),
        batch_seqs=3.0,
    )
    close(loss.detach(), -0.9)


@pytest.mark.parametrize("mode", ["vanilla", "gpg", "clip_cov", "kl_cov", "cispo"])
def test_the_other_token_losses_follow_loss_agg_mode_as_in_verl(mode: str) -> None:
    # verl's compute_policy_loss_{vanilla,gpg,clip_cov,kl_cov,cispo} call agg_loss with loss_agg_mode. With ratio 1
    # (no clip; kl_cov's penalty ppo_kl_coef·|log ρ| is 0, clip_cov's band holds no token) each token's loss is
    # −A·w, so the two modes give −(5 − 2 + 2)/8·w and −(1 − 1 + 2)/3·w
    lp = torch.where(GSPO_3X5_MASK.bool(), torch.full_like(GSPO_3X5_LP, -1.0), GSPO_3X5_LP)
    weight = -1.0 if mode in ("gpg", "cispo") else 1.0  # these multiply by log π = −1 instead of the ratio 1
    knobs = {"clip_cov_lb": 1e6, "clip_cov_ub": 2e6} if mode == "clip_cov" else {}
    token, _, _ = run(mode, lp, lp, GSPO_3X5_ADV, GSPO_3X5_MASK, "token-mean", **knobs)
    sequence, _, _ = run(mode, lp, lp, GSPO_3X5_ADV, GSPO_3X5_MASK, "seq-mean-token-mean", **knobs)
    expected_token, expected_sequence = -(5 - 2 + 2) / 8 * weight, -(1 - 1 + 2) / 3 * weight
    close(token, expected_token)
    close(sequence, expected_sequence)


def test_gpg_loss_is_minus_advantage_times_log_prob() -> None:
    # (−2·−1 + −2·−2)/2 = 3; gradient −A/2 = −1 per token
    loss, metrics, grad = run(
        "gpg", torch.tensor([[-1.0, -2.0]]), torch.zeros(1, 2), torch.full((1, 2), 2.0), torch.ones(1, 2)
    )
    close(loss, 3.0)
    close(grad, [[-1.0, -1.0]])
    assert all(float(m) == 0.0 for m in metrics.values())


# Covariance tokens: A = [1, 1, −1, −1], log π = [−1, −3, −1, −3]; means 0 and −2, so
# cov = A·(log π + 2) = [1, −1, −1, 1]: tokens 0 and 3 lie in (clipCovLb 0.5, clipCovUb 5).
COV_LP = torch.tensor([[-1.0, -3.0, -1.0, -3.0]])
COV_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
COV_MASK = torch.ones(1, 4)


def test_clip_cov_detaches_the_high_covariance_tokens_within_budget() -> None:
    # budget max(1, ⌊0.5·4⌋) = 2 covers both candidates; ratio 1 everywhere, so the others keep −A/4
    _, metrics, grad = run("clip_cov", COV_LP, COV_LP, COV_ADV, COV_MASK, clip_cov_ratio=0.5, clip_cov_lb=0.5)
    close(grad, [[0.0, -0.25, 0.25, 0.0]])
    close(metrics["pg_clipfrac"], 0.5)


def test_clip_cov_detaches_at_most_its_budget() -> None:
    # budget max(1, ⌊0.25·4⌋) = 1: one of tokens 0 and 3, picked at random
    _, metrics, grad = run("clip_cov", COV_LP, COV_LP, COV_ADV, COV_MASK, clip_cov_ratio=0.25, clip_cov_lb=0.5)
    close(metrics["pg_clipfrac"], 0.25)
    assert (grad == 0).sum() == 1 and (grad[0, 1:3] != 0).all()


def test_clip_cov_never_picks_a_token_the_ppo_clip_already_clipped() -> None:
    # token 0: ratio 2 with A = 1 takes the clipped term −1.2 (no gradient by itself); only token 3 is detached
    old = COV_LP - torch.tensor([[math.log(2.0), 0.0, 0.0, 0.0]])
    _, metrics, grad = run("clip_cov", COV_LP, old, COV_ADV, COV_MASK, clip_cov_ratio=0.5, clip_cov_lb=0.5)
    close(metrics["pg_clipfrac"], 0.25)
    close(grad, [[0.0, -0.25, 0.25, 0.0]])


def test_kl_cov_penalises_the_largest_covariance_token() -> None:
    # log π = [−1, −3, −1, −3.5], mean −2.125: cov = [1.125, −0.875, −1.125, 1.375] -> token 3 (budget 1).
    # Token 3 has log ratio 0.5: −(−1)·e^0.5 + 0.1·0.5 = 1.648721 + 0.05; others −A·1 = [−1, −1, 1].
    lp = torch.tensor([[-1.0, -3.0, -1.0, -3.5]])
    old = lp - torch.tensor([[0.0, 0.0, 0.0, 0.5]])
    loss, metrics, grad = run("kl_cov", lp, old, COV_ADV, COV_MASK, kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    close(loss, (-1 - 1 + 1 + 1.648721 + 0.05) / 4)
    close(metrics["ppo_kl"], 0.125)  # mean |log ratio| = 0.5/4
    close(metrics["pg_clipfrac"], 0.0)
    # d/d log π_3 = (e^0.5 + 0.1·sign(0.5))/4 = (1.648721 + 0.1)/4
    close(grad, [[-0.25, -0.25, 0.25, (1.648721 + 0.1) / 4]])


def test_geo_mean_clips_log_ratios_pessimistically_and_means_over_sequences() -> None:
    # seq 0, A = +1, δ = [0.5, −0.1]: δ' = [min(0.5, 0.2), −0.1] -> exp(0.05) = 1.051271, L_0 = −1.051271
    # seq 1, A = −1, δ = [−0.5] (pad after): δ' = max(−0.5, −0.2) = −0.2 -> exp(−0.2) = 0.818731, L_1 = +0.818731
    lp = torch.tensor([[0.5, -0.1], [-0.5, 9.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    expected = (-1.051271 + 0.818731) / 2
    for agg_mode in ("token-mean", "seq-mean-token-sum-norm"):  # the sequence mean holds whatever the mode
        loss, metrics, _ = run("geo_mean", lp, torch.zeros(2, 2), adv, mask, agg_mode)
        close(loss, expected)
    close(metrics["pg_clipfrac"], 1 / 3)  # token (0, 0), A > 0
    close(metrics["pg_clipfrac_lower"], 1 / 3)  # token (1, 0), A < 0
    close(metrics["ppo_kl"], -(0.5 - 0.1 - 0.5) / 3)


def test_cispo_weights_every_token_by_its_clipped_ratio_without_dropping_its_gradient() -> None:
    # ratios [1.5, 0.5] -> weights [1.2, 0.8]; L = −w·A·log π = [−1.2·1·−1, −0.8·−1·−2] = [1.2, −1.6]
    lp = torch.tensor([[-1.0, -2.0]])
    old = lp - torch.tensor([[math.log(1.5), math.log(0.5)]])
    loss, metrics, grad = run("cispo", lp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    close(loss, (1.2 - 1.6) / 2)
    close(metrics["pg_clipfrac"], 1.0)
    close(grad, [[-0.6, 0.4]])  # −w·A/2: the clipped tokens still move


def test_vanilla_is_the_default_loss_mode() -> None:
    assert PolicyLossConfig().loss_mode == "vanilla" and Algorithm().policy_loss.loss_mode == "vanilla"


def test_spec_enums_docs_and_registries_name_the_same_algorithms() -> None:
    from typing import get_args

    from kuberl.api import docs
    from kuberl.api.spec import AdvantageEstimatorName, PolicyLossMode
    from kuberl.trainer.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from kuberl.trainer.algorithms.losses import LOSS_AGG_MODES

    assert set(get_args(PolicyLossMode)) == set(POLICY_LOSSES) == {row[0] for row in docs.POLICY_LOSSES}
    assert set(get_args(AdvantageEstimatorName)) == set(ADVANTAGE_ESTIMATORS) == {row[0] for row in docs.ESTIMATORS}
    assert set(LOSS_AGG_MODES) == {row[0] for row in docs.AGGREGATIONS}
