"""KL estimators, KL coefficient controllers, and the KL penalty folded into rewards.

Shapes: per-token tensors are ``(B, T)`` (B responses of T response tokens); ``mask`` is
1 on response tokens that count, 0 on padding.
"""

from typing import Literal

import torch
from torch import Tensor

from kuberl.trainer.algorithms.losses import masked_mean

KL_KINDS = ("k1", "k2", "k3", "abs")

K3_LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman 2020, "Approximating KL divergence").

    With d = log π − log π_ref: k1 = d, k2 = d²/2, abs = |d|,
    k3 = exp(−d) + d − 1 (non-negative, low variance), with −d clamped to [−20, 20] and
    the result to [−10, 10].
    """
    diff = log_probs - ref_log_probs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff**2
    if kind == "k3":
        ref_minus = (-diff).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (torch.exp(ref_minus) - ref_minus - 1).clamp(-K3_CLAMP, K3_CLAMP)
    if kind == "abs":
        return diff.abs()
    raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


class FixedKLController:
    """A KL coefficient that never changes."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient as it is."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv 1909.08593).

    β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n_steps / horizon).
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if horizon <= 0:
            raise ValueError(f"the adaptive KL controller needs horizon > 0, got {horizon}")
        self.value = init_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β toward keeping the observed KL at the target; ``n_steps`` is the batch size."""
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(control: Literal["fixed", "adaptive"], coef: float, target: float, horizon: int) -> KLController:
    """The controller for ``control``; ``target`` and ``horizon`` only matter for "adaptive"."""
    if control == "fixed":
        return FixedKLController(coef)
    if control == "adaptive":
        return AdaptiveKLController(coef, target, horizon)
    raise ValueError(f"unknown KL control {control!r}; valid: fixed, adaptive")


def apply_kl_in_reward(
    token_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    *,
    coef: float,
    kind: str,
) -> tuple[Tensor, float]:
    """Token rewards r_t = score_t − β·KL_t, with KL_t zero on masked tokens.

    Also returns the batch KL for the adaptive controller: the mean over sequences of
    each sequence's masked token-mean KL.
    """
    kl = kl_penalty(log_probs, ref_log_probs, kind) * mask.to(token_scores.dtype)
    mean_kl = masked_mean(kl, mask, dim=-1).mean().item()
    return token_scores - coef * kl, mean_kl
