"""Advantage estimators, registered by name.

Shapes: ``B`` responses of ``T`` response tokens. ``token_rewards``, ``mask``, ``values``,
advantages and returns are ``(B, T)``; ``group_ids`` is ``(B,)`` and marks the responses
sampled from the same prompt; ``reward_baselines`` is ``(B,)``, each response's baseline reward
(ReMax: the reward of the greedy response to the same prompt). ``mask`` is 1 on response tokens
that count, 0 on padding.

Every estimator takes the same arguments, so the driver can call any of them by name
through :func:`compute_advantages`; each one ignores the arguments it does not use.
Advantages and returns are 0 on masked tokens.
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from kuberl.trainer.algorithms.losses import masked_mean


class AdvantageEstimator(Protocol):
    """The signature every registered estimator has; it returns ``(advantages, returns)``."""

    def __call__(
        self,
        token_rewards: Tensor,
        mask: Tensor,
        *,
        values: Tensor | None = None,
        group_ids: Tensor | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        norm_adv_by_std: bool = True,
        reward_baselines: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}

GROUP_STD_EPS = 1e-6
WHITEN_EPS = 1e-8


def register_advantage(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Add the decorated estimator to ``ADVANTAGE_ESTIMATORS`` under ``name``."""

    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return register


def compute_advantages(
    name: str,
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as ``name``; returns ``(advantages, returns)``."""
    if name not in ADVANTAGE_ESTIMATORS:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known estimators: {known}")
    return ADVANTAGE_ESTIMATORS[name](
        token_rewards,
        mask,
        values=values,
        group_ids=group_ids,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std=norm_adv_by_std,
        reward_baselines=reward_baselines,
    )


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x − mean) / sqrt(var + 1e-8) over the masked tokens of the whole batch.

    The variance is unbiased (Bessel-corrected); masked tokens come out as 0.
    """
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_mean((x - mean) ** 2, mask) * n / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def _require(tensor: Tensor | None, arg: str, estimator: str) -> Tensor:
    if tensor is None:
        raise ValueError(f"advantage estimator {estimator!r} needs {arg}=, got None")
    return tensor


def _groups(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Each sample's group index in 0..G−1 and the size of its group, both ``(B,)``."""
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return group, counts[group]


def _group_sum(x: Tensor, group: Tensor) -> Tensor:
    """Sum of ``x`` over each sample's group, given back per sample: ``(B,)``."""
    return torch.zeros_like(x).index_add_(0, group, x)[group]


def generalized_advantage_estimate(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Unwhitened GAE (Schulman et al. 2015, arXiv 1506.02438) and returns = A + V.

    δ_t = r_t + γ·V_{t+1} − V_t,  A_t = δ_t + γλ·A_{t+1}, with V and A after the last
    token taken as 0. Masked tokens are skipped: the recursion carries V and A across
    them, so a masked token inside a response (e.g. a tool observation) does not break it.
    """
    mask = mask.to(token_rewards.dtype)
    batch, length = token_rewards.shape
    next_value = token_rewards.new_zeros(batch)
    next_adv = token_rewards.new_zeros(batch)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(length)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = mask[:, t]
        next_value = m * values[:, t] + (1 - m) * next_value
        next_adv = m * adv + (1 - m) * next_adv
        advantages[:, t] = next_adv
    return advantages * mask, (advantages + values) * mask


@register_advantage("gae")
def gae(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's GAE (Schulman 2015), advantages whitened over the batch's masked tokens."""
    values = _require(values, "values", "gae")
    advantages, returns = generalized_advantage_estimate(token_rewards, values, mask, gamma=gamma, lam=lam)
    return masked_whiten(advantages, mask), returns


@register_advantage("grpo")
def grpo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300): A_i = (r_i − mean_g) / (std_g + 1e-6).

    r_i is the response's summed reward and mean/std (unbiased) are over its group g,
    broadcast to every token. ``norm_adv_by_std=False`` gives Dr.GRPO's r_i − mean_g
    (Liu et al. 2025, arXiv 2503.20783). A group of one has mean 0 and std 1.
    """
    group_ids = _require(group_ids, "group_ids", "grpo")
    mask = mask.to(token_rewards.dtype)
    scores = (token_rewards * mask).sum(-1)
    group, count = _groups(group_ids)
    count = count.to(scores.dtype)
    deviation = scores - _group_sum(scores, group) / count
    single = count == 1
    centered = torch.where(single, scores, deviation)
    if norm_adv_by_std:
        std = (_group_sum(deviation**2, group) / (count - 1).clamp(min=1)).sqrt()
        centered = centered / (torch.where(single, 1.0, std) + GROUP_STD_EPS)
    advantages = centered.unsqueeze(-1) * mask
    return advantages, advantages


@register_advantage("rloo")
def rloo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): A_i = r_i − mean of the others in the group.

    Computed as n/(n−1)·(r_i − mean_g) for a group of n > 1; a group of one keeps r_i.
    """
    group_ids = _require(group_ids, "group_ids", "rloo")
    mask = mask.to(token_rewards.dtype)
    scores = (token_rewards * mask).sum(-1)
    group, count = _groups(group_ids)
    count = count.to(scores.dtype)
    loo = (scores - _group_sum(scores, group) / count) * count / (count - 1).clamp(min=1)
    advantages = torch.where(count > 1, loo, scores).unsqueeze(-1) * mask
    return advantages, advantages


@register_advantage("reinforce_plus_plus")
def reinforce_plus_plus(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): G_t = r_t + γ·G_{t+1}, whitened over the batch.

    The return-to-go restarts at 0 at every masked token. Returns are G, advantages
    are G whitened over the masked tokens.
    """
    mask = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = (token_rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns, mask), returns


def _scores(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Each response's summed reward over its masked tokens, ``(B,)``."""
    return (token_rewards * mask.to(token_rewards.dtype)).sum(-1)


def _group_mean(scores: Tensor, group_ids: Tensor) -> Tensor:
    """Mean score of each sample's group, given back per sample; 0 for a group of one (verl's rule)."""
    group, count = _groups(group_ids)
    count = count.to(scores.dtype)
    return torch.where(count > 1, _group_sum(scores, group) / count, 0.0)


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with baseline (Hu 2025, arXiv 2501.03262): r_i − mean_g on every token, whitened over the batch.

    The whitening is over the batch's masked tokens, so longer responses weigh more in its mean and variance.
    """
    group_ids = _require(group_ids, "group_ids", "reinforce_plus_plus_baseline")
    scores = _scores(token_rewards, mask)
    centered = (scores - _group_mean(scores, group_ids)).unsqueeze(-1) * mask.to(scores.dtype)
    advantages = masked_whiten(centered, mask)
    return advantages, advantages


@register_advantage("opo")
def opo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """OPO (Hao et al. 2025, arXiv 2505.23585): A_i = r_i − Σ_g len_j·r_j / Σ_g len_j, the length-weighted baseline.

    len is the response's masked-token count; a group of one has baseline 0.
    """
    group_ids = _require(group_ids, "group_ids", "opo")
    mask = mask.to(token_rewards.dtype)
    scores = _scores(token_rewards, mask)
    lengths = mask.sum(-1)
    group, count = _groups(group_ids)
    baseline = _group_sum(lengths * scores, group) / _group_sum(lengths, group).clamp(min=1)
    advantages = (scores - torch.where(count > 1, baseline, 0.0)).unsqueeze(-1) * mask
    return advantages, advantages


@register_advantage("gpg")
def gpg(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): A_i = a·(r_i − mean_g), a = B / #(responses with r ≠ 0).

    a (at least 1) rescales the batch gradient for the responses that carry no signal; verl's f_norm is 1.
    """
    group_ids = _require(group_ids, "group_ids", "gpg")
    scores = _scores(token_rewards, mask)
    alpha = scores.numel() / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    advantages = (alpha * (scores - _group_mean(scores, group_ids))).unsqueeze(-1) * mask.to(scores.dtype)
    return advantages, advantages


@register_advantage("grpo_passk")
def grpo_passk(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Pass@k GRPO (Chen et al. 2025, arXiv 2503.19595): only the group's best response gets an advantage.

    A = r_max − r_second (divided by std_g + 1e-6, unbiased, when ``norm_adv_by_std``) for the first response
    reaching the group's maximum, 0 for all others. Every group needs two responses or more.
    """
    group_ids = _require(group_ids, "group_ids", "grpo_passk")
    scores = _scores(token_rewards, mask)
    group, count = _groups(group_ids)
    if bool((count < 2).any()):
        raise ValueError("advantage estimator 'grpo_passk' needs at least 2 responses per group (batch.rolloutN >= 2)")
    n_groups = int(group.max()) + 1
    best = scores.new_full((n_groups,), -torch.inf).scatter_reduce(0, group, scores, "amax")
    position = torch.arange(scores.numel(), device=scores.device)
    at_best = torch.where(scores == best[group], position, scores.numel())
    first_best = torch.full((n_groups,), scores.numel(), device=scores.device).scatter_reduce(0, group, at_best, "amin")
    is_best = position == first_best[group]
    others = torch.where(is_best, -torch.inf, scores)
    second = scores.new_full((n_groups,), -torch.inf).scatter_reduce(0, group, others, "amax")
    gap = best - second
    if norm_adv_by_std:
        n = count.to(scores.dtype)
        deviation = scores - _group_sum(scores, group) / n
        squares = torch.zeros_like(gap).index_add_(0, group, deviation**2)
        sizes = torch.zeros_like(gap).index_add_(0, group, torch.ones_like(scores))
        gap = gap / ((squares / (sizes - 1)).sqrt() + GROUP_STD_EPS)
    advantages = torch.where(is_best, gap[group], 0.0).unsqueeze(-1) * mask.to(scores.dtype)
    return advantages, advantages


@register_advantage("remax")
def remax(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    group_ids: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505): A_t = G_t − b, b the reward of the greedy response to the prompt.

    G_t = Σ_{s ≥ t} r_s (undiscounted return-to-go over masked tokens); returns are G. The driver produces
    ``reward_baselines`` by scoring one greedy (temperature 0) response per prompt.
    """
    baselines = _require(reward_baselines, "reward_baselines", "remax")
    mask = mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    advantages = returns - baselines.to(returns.dtype).unsqueeze(-1) * mask
    return advantages, returns
