"""Flow-GRPO clipped objective per (sample, SDE step), and the exact Gaussian KL to a reference.

Conventions (REFERENCE_MATH.md, "Diffusion policy losses"):
- one log-prob per step is the MEAN over latent elements of the Gaussian log-density;
- ``rho = exp(new_logprobs - old_logprobs)``; ``l = max(-A rho, -A clip(rho, 1 - eps, 1 + eps))``;
- the mini-batch loss is the mean over all (sample, SDE step) pairs: callers sum ``l`` and divide
  by the global pair count so that micro-batching does not change the result;
- KL to a reference is the exact KL of two Gaussians with the same std ``s``:
  ``mean_elements (mu_theta - mu_ref)^2 / (2 s^2)`` (the ``dt`` factor lives inside ``s``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(ratio: Tensor, advantage: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Per-element PPO clipped loss ``max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))``.

    Shapes broadcast; the result is the loss to minimise (no reduction).
    """
    unclipped = -advantage * ratio
    clipped = -advantage * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped)


def flow_grpo_step_loss(new_logprobs: Tensor, old_logprobs: Tensor, advantage: Tensor, eps: float) -> Tensor:
    """Flow-GRPO loss of each (sample, step) element: ``[N] -> [N]`` (no reduction).

    ``new_logprobs`` carries the gradient; ``old_logprobs`` and ``advantage`` are treated as constants.
    The ratio is not clamped in log space: with eps ~ 1e-4 the clip dominates long before overflow.
    """
    ratio = torch.exp(new_logprobs - old_logprobs.detach())
    return clipped_surrogate(ratio, advantage.detach(), eps, eps)


def gaussian_mean_kl(mean: Tensor, mean_ref: Tensor, std: Tensor) -> Tensor:
    """Exact ``KL(N(mu, s^2) || N(mu_ref, s^2))`` averaged over latent elements, per sample.

    ``mean``/``mean_ref``: ``[B, ...]``; ``std``: ``[B]`` or broadcastable to ``mean``. Returns ``[B]``.
    Computed in fp32 (``1/(2 s^2)`` is large for small steps).
    """
    diff = mean.float() - mean_ref.float()
    s = _expand_std(std, diff)
    per_elem = diff**2 / (2.0 * s**2)
    return per_elem.flatten(1).mean(dim=1)


def _expand_std(std: Tensor, like: Tensor) -> Tensor:
    s = std.float()
    if s.dim() == 1 and like.dim() > 1:
        s = s.view(-1, *([1] * (like.dim() - 1)))
    return s
