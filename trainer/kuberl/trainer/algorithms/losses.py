"""PPO policy and value losses, their aggregation, and per-token log-probs and entropy.

Shapes: per-token tensors are ``(B, T)`` (B responses of T response tokens), logits are
``(B, T, V)``. ``mask`` is 1 on response tokens that count, 0 on padding.

Aggregation is global over the mini-batch: the caller passes the mini-batch's total
valid tokens ``batch_tokens`` and sequences ``batch_seqs``, counted over all its
micro-batches and all data-parallel ranks, and each call returns this micro-batch's
share. Summing the shares over micro-batches and ranks gives the mini-batch loss, so
the loss does not depend on how the mini-batch is split.

Policy losses are registered by name (verl's ``actor.policy_loss.loss_mode`` names) and share one
signature, so the update calls any of them through :func:`policy_loss`. Each returns the loss share and
the metrics ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (0 where a loss has no such notion).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from kuberl.api.spec import Algorithm

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_MAX = 10.0
# GSPO's objective averages tokens within each sequence, then sequences (arXiv 2507.18071, eq. 5: 1/G Σ_i 1/|y_i| Σ_t);
# verl's compute_policy_loss_gspo aggregates so whatever actor.loss_agg_mode says, and so does `gspo` here.
GSPO_AGG_MODE = "seq-mean-token-mean"
GEO_MEAN_EPS = 1e-8


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the tokens where ``mask`` is set (over ``dim``, or all); 0 when none are."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    batch_tokens: float,
    batch_seqs: float,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """This micro-batch's share of the mini-batch loss.

    token-mean: Σ loss / batch_tokens. seq-mean-token-sum: Σ_seq Σ_tok loss / batch_seqs.
    seq-mean-token-mean: Σ_seq (Σ_tok loss / len_seq) / batch_seqs.
    seq-mean-token-sum-norm (Dr.GRPO, Liu et al. 2025, arXiv 2503.20783): Σ_seq Σ_tok loss / loss_scale_factor,
    as verl's ``agg_loss``: a constant divisor and no division by the sequence count, so the loss grows with
    the mini-batch. The factor defaults to T; pass it (verl: the response length) when micro-batches are
    trimmed to different lengths.
    """
    mask = mask.to(loss_mat.dtype)
    token_sums = (loss_mat * mask).sum(-1)
    if mode == "token-mean":
        return token_sums.sum() / batch_tokens
    if mode == "seq-mean-token-sum":
        return token_sums.sum() / batch_seqs
    if mode == "seq-mean-token-mean":
        return (token_sums / mask.sum(-1).clamp(min=1)).sum() / batch_seqs
    if mode == "seq-mean-token-sum-norm":
        scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return token_sums.sum() / scale
    raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")


def rollout_is_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor) -> Tensor:
    """π_old/π_rollout per token: the trainer's probability of each sampled token over the rollout engine's,
    exp of the log ratio clamped to ±20 so that a far-off token cannot overflow (verl's safety bound)."""
    return torch.exp((old_log_probs - rollout_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def rollout_is_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """Truncated importance weights (verl's token-level ``rollout_is`` in truncate mode, TIS):
    min(π_old/π_rollout, threshold), 0 at padding, without gradient.

    The rollout engine samples from its own numerics (bf16, other kernels), not from the trainer's π_old; the
    weights turn the policy gradient back into one of samples from π_old, and the cap bounds its variance.
    """
    with torch.no_grad():
        ratio = rollout_is_ratio(old_log_probs.detach(), rollout_log_probs)
        return ratio.clamp(max=threshold) * mask.to(ratio.dtype)


def rollout_is_metrics(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, threshold: float
) -> dict[str, float]:
    """verl's ``mismatch/rollout_is_*`` metrics over the valid tokens: the mean, max and min of π_old/π_rollout
    before the cap, and the share of tokens the cap lowered."""
    ratio = rollout_is_ratio(old_log_probs, rollout_log_probs)
    valid = ratio[mask.bool()]
    return {
        "mismatch/rollout_is_mean": valid.mean().item(),
        "mismatch/rollout_is_max": valid.max().item(),
        "mismatch/rollout_is_min": valid.min().item(),
        "mismatch/rollout_is_ratio_fraction_high": (valid > threshold).float().mean().item(),
    }


@dataclass(frozen=True)
class PolicyLossConfig:
    """The knobs of the registered policy losses (spec ``algorithm`` and ``algorithm.policyLoss``), decided once."""

    loss_mode: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1

    @classmethod
    def from_spec(cls, algorithm: Algorithm) -> "PolicyLossConfig":
        knobs = algorithm.policy_loss
        return cls(
            loss_mode=knobs.loss_mode,
            clip_ratio_low=algorithm.clip_ratio_low,
            clip_ratio_high=algorithm.clip_ratio_high,
            clip_ratio_c=algorithm.clip_ratio_c,
            clip_cov_ratio=knobs.clip_cov_ratio,
            clip_cov_lb=knobs.clip_cov_lb,
            clip_cov_ub=knobs.clip_cov_ub,
            kl_cov_ratio=knobs.kl_cov_ratio,
            ppo_kl_coef=knobs.ppo_kl_coef,
        )


@dataclass(frozen=True)
class Aggregation:
    """How a policy loss turns its per-token losses into its share of the mini-batch loss: :func:`agg_loss`'s mode and
    counts, after the per-token ``token_weights`` (e.g. :func:`rollout_is_weights`). The weights scale the losses
    only: the token and sequence counts divided by stay those of the mask."""

    mode: str
    batch_tokens: float
    batch_seqs: float
    loss_scale_factor: float | None = None
    token_weights: Tensor | None = None

    def __call__(self, losses: Tensor, mask: Tensor) -> Tensor:
        if self.token_weights is not None:
            losses = losses * self.token_weights.to(losses.dtype)
        return agg_loss(
            losses,
            mask,
            self.mode,
            batch_tokens=self.batch_tokens,
            batch_seqs=self.batch_seqs,
            loss_scale_factor=self.loss_scale_factor,
        )


class PolicyLossFn(Protocol):
    """The signature every registered policy loss has; it returns ``(loss share, metrics)``."""

    def __call__(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        config: PolicyLossConfig,
        agg: Aggregation,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Add the decorated loss to ``POLICY_LOSSES`` under ``name``."""

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return register


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg_mode: str,
    batch_tokens: float,
    batch_seqs: float,
    loss_scale_factor: float | None = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Run the policy loss registered as ``config.loss_mode``, aggregated as :class:`Aggregation` says
    (``rollout_is_weights`` become its token weights)."""
    if config.loss_mode not in POLICY_LOSSES:
        known = ", ".join(sorted(POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {config.loss_mode!r}; known losses: {known}")
    agg = Aggregation(agg_mode, batch_tokens, batch_seqs, loss_scale_factor, rollout_is_weights)
    return POLICY_LOSSES[config.loss_mode](log_probs, old_log_probs, advantages, mask, config=config, agg=agg)


def _metrics(mask: Tensor, clipped: Tensor | None, clipped_lower: Tensor | None, kl: Tensor) -> dict[str, Tensor]:
    """The three metrics every loss reports, as masked means over this micro-batch (0 for an absent flag)."""
    zero = kl.new_zeros(())
    with torch.no_grad():
        return {
            "pg_clipfrac": zero if clipped is None else masked_mean(clipped.to(kl.dtype), mask),
            "pg_clipfrac_lower": zero if clipped_lower is None else masked_mean(clipped_lower.to(kl.dtype), mask),
            "ppo_kl": masked_mean(kl.detach(), mask),
        }


@register_policy_loss("vanilla")
def vanilla(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with dual clip.

    ρ = exp(clamp(log π − log π_old, −20, 20)); per token
    L = max(−A·ρ, −A·clip(ρ, 1 − clip_ratio_low, 1 + clip_ratio_high)), and for A < 0 also
    L = min(L, −A·clip_ratio_c) (dual clip, Ye et al. 2020, arXiv 1912.09729).
    Metrics: ``pg_clipfrac`` (the clipped term was taken), ``pg_clipfrac_lower`` (the dual-clip
    bound was taken), ``ppo_kl`` (mean of log π_old − log π).
    """
    if not config.clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1.0 for the dual-clip bound, got {config.clip_ratio_c}")
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * config.clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    loss = agg(losses, mask)
    return loss, _metrics(mask, clipped > unclipped, negative & (clip_loss > dual_bound), -log_ratio)


@register_policy_loss("gspo")
def gspo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): one importance ratio per sequence, clipped per sequence.

    s_i = exp(Σ_t (log π − log π_old) / |y_i|), the length-normalised sequence ratio; per token the
    ratio is s_{i,t} = sg[s_i]·π/sg[π] (value s_i, gradient of the token's log π; log s_{i,t} ≤ 10), and
    L = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1 − clip_ratio_low, 1 + clip_ratio_high)), aggregated as the paper's
    objective, seq-mean-token-mean (GSPO_AGG_MODE), whatever ``agg.mode`` (algorithm.lossAggMode) says, as verl
    does; the KL and entropy terms still follow lossAggMode. No dual clip. ``pg_clipfrac_lower`` is 0.
    """
    mask_f = mask.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs
    seq_log_ratio = (log_ratio * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)
    log_seq_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(log_seq_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * seq_ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    loss = dataclasses.replace(agg, mode=GSPO_AGG_MODE)(losses, mask)
    return loss, _metrics(mask, clipped > unclipped, None, -log_ratio)


@register_policy_loss("gpg")
def gpg(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): plain policy gradient L = −A·log π, no ratio and no clip.

    Metrics are 0, as verl reports them for this loss.
    """
    losses = -advantages * log_probs
    loss = agg(losses, mask)
    return loss, _metrics(mask, None, None, torch.zeros_like(log_probs))


@register_policy_loss("clip_cov")
def clip_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617): detach the gradient of a few high-covariance tokens.

    Per token cov = (A − mean A)·(log π − mean log π) over this micro-batch's masked tokens. Among the
    masked tokens that the PPO clip left unclipped and with clip_cov_lb < cov < clip_cov_ub,
    max(1, ⌊clip_cov_ratio · tokens⌋) chosen at random get weight 0; the rest keep
    L = max(−A·ρ, −A·clip(ρ, 1 − clip_ratio_low, 1 + clip_ratio_high)) with ρ = exp(log π − log π_old)
    (no dual clip, no clamp, as verl). ``pg_clipfrac`` is the share of tokens set to 0.
    """
    mask_f = mask.to(log_probs.dtype)
    valid = mask_f > 0
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    with torch.no_grad():
        logp = log_probs.detach()
        cov = (advantages - masked_mean(advantages, mask_f)) * (logp - masked_mean(logp, mask_f))
        candidates = valid & ~(clipped > unclipped) & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
        index = candidates.flatten().nonzero().squeeze(-1)
        budget = max(int(config.clip_cov_ratio * float(mask_f.sum())), 1)
        chosen = index[torch.randperm(index.numel(), device=index.device)[:budget]]
        detached = torch.zeros_like(valid).flatten().index_fill_(0, chosen, True).view_as(valid)
    losses = torch.maximum(unclipped, clipped) * (~detached).to(log_probs.dtype)
    loss = agg(losses, mask)
    return loss, _metrics(mask, detached, None, -log_ratio)


@register_policy_loss("kl_cov")
def kl_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): a KL penalty on the highest-covariance tokens.

    L = −A·ρ with ρ = exp(log π − log π_old) (no clip); on the max(1, ⌊kl_cov_ratio · tokens⌋) masked tokens
    of this micro-batch with the largest cov = (A − mean A)·(log π − mean log π), L = −A·ρ + ppo_kl_coef·|log ρ|.
    ``ppo_kl`` reports the mean |log ρ| and the clip fractions are 0, as in verl.
    """
    mask_f = mask.to(log_probs.dtype)
    valid = mask_f > 0
    log_ratio = log_probs - old_log_probs
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * torch.exp(log_ratio)
    with torch.no_grad():
        index = valid.flatten().nonzero().squeeze(-1)
        adv, logp = advantages.flatten()[index], log_probs.detach().flatten()[index]
        cov = (adv - adv.mean()) * (logp - logp.mean())
        top = torch.topk(cov, min(max(1, int(index.numel() * config.kl_cov_ratio)), index.numel())).indices
        penalised = torch.zeros_like(valid).flatten().index_fill_(0, index[top], True).view_as(valid)
    losses = torch.where(penalised, pg_losses + config.ppo_kl_coef * abs_kl, pg_losses)
    loss = agg(losses, mask)
    return loss, _metrics(mask, None, None, abs_kl)


@register_policy_loss("geo_mean")
def geo_mean(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): the geometric mean of the token ratios, clipped per token.

    With δ = log π − log π_old and s = sign(A), each token's δ is clipped pessimistically,
    δ' = s·min(s·δ, s·clip(δ, −clip_ratio_low, clip_ratio_high)); per sequence
    L_i = −Ā_i·exp(mean_t δ'), Ā_i the sequence's mean advantage, and the loss is Σ_i L_i / batch_seqs
    whatever ``agg.mode`` says (verl's loss is a mean over sequences). ``pg_clipfrac`` /
    ``pg_clipfrac_lower``: share of tokens whose δ was outside the band, with A > 0 / A < 0.
    """
    if agg.token_weights is not None:
        raise ValueError("geo_mean has one loss per sequence: token-level rollout importance weights do not apply")
    mask_f = mask.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-config.clip_ratio_low, config.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * bounded)
    lengths = mask_f.sum(-1) + GEO_MEAN_EPS
    seq_ratio = torch.exp((pessimistic * mask_f).sum(-1) / lengths)
    seq_advantage = (advantages * mask_f).sum(-1) / lengths
    loss = (-seq_advantage * seq_ratio).sum() / agg.batch_seqs
    outside = log_ratio != bounded
    return loss, _metrics(mask, outside & (advantages > 0), outside & (advantages < 0), -log_ratio)


@register_policy_loss("cispo")
def cispo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    config: PolicyLossConfig,
    agg: Aggregation,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    L = −sg[clip(ρ, 1 − clip_ratio_low, 1 + clip_ratio_high)]·A·log π with ρ = exp(clamp(log π − log π_old,
    −20, 20)): every token keeps a gradient, scaled by its clipped weight. MiniMax-M1 drops the lower bound
    (clip_ratio_low 1). ``pg_clipfrac`` is the share of tokens whose weight was clipped.
    """
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    losses = -weight.detach() * advantages * log_probs
    loss = agg(losses, mask)
    return loss, _metrics(mask, ratio != weight, None, -log_ratio)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    cliprange_value: float,
    agg_mode: str,
    batch_tokens: float,
    batch_seqs: float,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: 0.5·max((V − R)², (clip(V, V_old − c, V_old + c) − R)²).

    Metric ``vf_clipfrac``: share of this micro-batch's masked tokens where the clipped
    term was the larger one.
    """
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped_values - returns) ** 2
    losses = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = agg_loss(
        losses, mask, agg_mode, batch_tokens=batch_tokens, batch_seqs=batch_seqs, loss_scale_factor=loss_scale_factor
    )
    with torch.no_grad():
        metrics = {"vf_clipfrac": masked_mean((clipped_sq > unclipped_sq).to(losses.dtype), mask)}
    return loss, metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per token: logsumexp(z) − Σ_v softmax(z)_v·z_v, ``(B, T)``.

    Logits must be finite (a −inf logit gives 0·−inf = nan). Half-precision logits are
    upcast to float32 one sequence at a time.
    """
    if logits.dtype not in (torch.float32, torch.float64):
        return torch.stack([entropy_from_logits(row.float()) for row in logits])
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def log_probs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[label] = z_label − logsumexp(z) per token, ``(B, T)``.

    No (B, T, V) log-softmax is built; half-precision logits are upcast to float32 one
    sequence at a time.
    """
    if logits.dtype not in (torch.float32, torch.float64):
        return torch.stack(
            [log_probs_from_logits(row.float(), label) for row, label in zip(logits, labels, strict=True)]
        )
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
