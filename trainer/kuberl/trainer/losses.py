"""PPO policy and value losses, their aggregation, and per-token log-probs and entropy.

Shapes: per-token tensors are ``(B, T)`` (B responses of T response tokens), logits are
``(B, T, V)``. ``mask`` is 1 on response tokens that count, 0 on padding.

Aggregation is global over the mini-batch: the caller passes the mini-batch's total
valid tokens ``batch_tokens`` and sequences ``batch_seqs``, counted over all its
micro-batches and all data-parallel ranks, and each call returns this micro-batch's
share. Summing the shares over micro-batches and ranks gives the mini-batch loss, so
the loss does not depend on how the mini-batch is split.
"""

import torch
from torch import Tensor

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

LOG_RATIO_CLAMP = 20.0


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
    seq-mean-token-sum-norm (Dr.GRPO, Liu et al. 2025): Σ_seq Σ_tok loss /
    (batch_seqs · loss_scale_factor); the factor defaults to T, so pass it explicitly
    when micro-batches are padded to different lengths.
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
        return token_sums.sum() / (batch_seqs * scale)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    agg_mode: str,
    batch_tokens: float,
    batch_seqs: float,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with dual clip.

    ρ = exp(clamp(log π − log π_old, −20, 20)); per token
    L = max(−A·ρ, −A·clip(ρ, 1 − clip_ratio_low, 1 + clip_ratio_high)), and for A < 0 also
    L = min(L, −A·clip_ratio_c) (dual clip, Ye et al. 2020, arXiv 1912.09729).
    Metrics over this micro-batch's masked tokens: ``pg_clipfrac`` (the clipped term was
    taken), ``pg_clipfrac_lower`` (the dual-clip bound was taken), ``ppo_kl`` (mean of
    log π_old − log π).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1.0 for the dual-clip bound, got {clip_ratio_c}")
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    loss = agg_loss(
        losses, mask, agg_mode, batch_tokens=batch_tokens, batch_seqs=batch_seqs, loss_scale_factor=loss_scale_factor
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).to(losses.dtype), mask),
            "pg_clipfrac_lower": masked_mean((negative & (clip_loss > dual_bound)).to(losses.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics


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
