"""FlowDPPO: an unclipped policy gradient with a divergence-triggered trust-region mask.

Per (sample, SDE step), with the step std ``s`` and the old Gaussian mean ``mu_old`` recorded
once per rollout:
- ``D = mean_elements (mu_theta - mu_old)^2 / (2 s^2)`` (the exact Gaussian KL of the step);
- ``l = -A rho``, set to 0 when ``D >= tau`` AND the update moves away from the old policy in the
  direction the advantage pushes it: ``(A > 0 and rho > 1)`` or ``(A < 0 and rho < 1)``.
The mask is a stop signal, not a differentiable penalty: no gradient flows through ``D``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.train.algorithms.losses.flow_grpo import gaussian_mean_kl


def dppo_divergence(mean: Tensor, mean_old: Tensor, std: Tensor) -> Tensor:
    """``D`` per sample ``[B]``: exact Gaussian KL between the current and old step kernels."""
    return gaussian_mean_kl(mean, mean_old, std)


def dppo_mask(divergence: Tensor, ratio: Tensor, advantage: Tensor, tau: float) -> Tensor:
    """Boolean ``[B]``: True where the element is KEPT (contributes ``-A rho``)."""
    away = ((advantage > 0) & (ratio > 1.0)) | ((advantage < 0) & (ratio < 1.0))
    blocked = (divergence >= tau) & away
    return ~blocked


def dppo_step_loss(
    new_logprobs: Tensor, old_logprobs: Tensor, advantage: Tensor, divergence: Tensor, tau: float
) -> tuple[Tensor, Tensor]:
    """Per-element FlowDPPO loss ``[N]`` and the keep-mask ``[N]``; callers sum and divide globally."""
    ratio = torch.exp(new_logprobs - old_logprobs.detach())
    keep = dppo_mask(divergence.detach(), ratio.detach(), advantage, tau)
    loss = torch.where(keep, -advantage.detach() * ratio, torch.zeros_like(ratio))
    return loss, keep
