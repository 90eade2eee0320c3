"""Token-level PPO for autoregressive policies: clamped token ratio, clip-higher, dual clip.

``rho_t = exp(clamp(new_logprobs_t - old_logprobs_t, -20, 20))``;
``l_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` the dual clip
bounds the loss from above: ``l_t = min(l_t, -c A)`` (``c = 3``). DAPO's clip-higher is just
``eps_high > eps_low`` (0.2 / 0.28). Reduction is done by ``aggregation.aggregate``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.train.algorithms.losses.flow_grpo import clipped_surrogate

#: Bound on the token log-ratio before ``exp`` (keeps rho finite for wildly off-policy tokens).
LOG_RATIO_CLAMP = 20.0


def token_log_ratio(new_logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """``clamp(new_logprobs - old_logprobs, -20, 20)``; ``old_logprobs`` is treated as a constant."""
    return torch.clamp(new_logprobs - old_logprobs.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_ratio(new_logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """``rho_t = exp(clamp(new_logprobs_t - old_logprobs_t, -20, 20))``."""
    return torch.exp(token_log_ratio(new_logprobs, old_logprobs))


def broadcast_advantage(advantage: Tensor, like: Tensor) -> Tensor:
    """Sequence advantages ``[B]`` -> ``[B, 1]`` so they broadcast over tokens; ``[B, T]`` unchanged."""
    a = advantage.detach().to(like.dtype)
    return a.unsqueeze(-1) if a.dim() == 1 and like.dim() == 2 else a


def ppo_token_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantage: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO loss ``[B, T]`` and the ratio ``[B, T]`` (no masking, no reduction).

    ``advantage`` is ``[B]`` (one per sequence) or ``[B, T]``. ``dual_clip=None`` disables the
    dual clip; otherwise it must be > 1.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (typically 3.0) or None, got {dual_clip}")
    ratio = token_ratio(new_logprobs, old_logprobs)
    adv = broadcast_advantage(advantage, ratio)
    loss = clipped_surrogate(ratio, adv, eps_low, eps_high)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return loss, ratio
