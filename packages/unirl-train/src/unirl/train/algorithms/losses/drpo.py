"""DRPO token loss: an unclipped ratio with a token-adaptive quadratic trust region.

``l_t = -A rho_t + |A| w_t (rho_t - 1)^2 / (2 eps)`` with ``rho_t = exp(clamp(dlogp_t, -20, 20))``,
``w_t = exp(old_logprobs_t)`` (token-adaptive: confident tokens are held closer) or ``w_t = 1``,
``eps = 12.5``. No clipping: the quadratic penalty is the trust region.
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.train.algorithms.losses.ppo import broadcast_advantage, token_ratio

DRPO_DEFAULT_EPS = 12.5


def drpo_token_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantage: Tensor,
    eps: float = DRPO_DEFAULT_EPS,
    token_adaptive: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-token DRPO loss ``[B, T]`` and the ratio ``[B, T]`` (no masking, no reduction)."""
    if eps <= 0:
        raise ValueError(f"DRPO eps must be > 0 (default 12.5), got {eps}")
    ratio = token_ratio(new_logprobs, old_logprobs)
    adv = broadcast_advantage(advantage, ratio)
    w = torch.exp(old_logprobs.detach().to(ratio.dtype)) if token_adaptive else torch.ones_like(ratio)
    loss = -adv * ratio + adv.abs() * w * (ratio - 1.0) ** 2 / (2.0 * eps)
    return loss, ratio
