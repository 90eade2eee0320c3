"""Shared pieces of the SDE step kernels: the step result, fp32 casting and the Gaussian score.

Every kernel is a pure function ``(x, v, sigma, sigma_next, eta, ...) -> StepResult``. It either
samples (``noise`` given: ``x_next = mean + std * noise``) or scores a stored transition
(``x_next`` given, e.g. during replay). All step math runs in fp32, sigmas included: float64
sigmas would shift the ``1 / (2 s^2)`` term and break rollout/replay parity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["StepResult", "as_fp32_sigma", "broadcast_to", "gaussian_mean_log_prob", "resolve_next"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class StepResult:
    """One denoising step ``x_j -> x_{j+1}``.

    ``x_next`` [B, ...] fp32: the sampled (or the given stored) next latent.
    ``log_prob`` [B] fp32 or None: per-sample score of ``x_next``, a MEAN over latent elements;
    None for deterministic steps (ODE, or any strategy at eta = 0: a point mass has no density).
    ``mean`` [B, ...] fp32: the Gaussian mean mu (the only term that depends on the parameters).
    ``std`` [B] fp32: the step standard deviation s (zeros for deterministic steps).
    """

    x_next: Tensor
    log_prob: Tensor | None
    mean: Tensor
    std: Tensor


def as_fp32_sigma(sigma: Tensor | float, batch: int, device: torch.device) -> Tensor:
    """A sigma given as a float, a 0-d tensor or a [B] tensor, as a [B] fp32 tensor."""
    s = torch.as_tensor(sigma, device=device)
    s = s.to(torch.float32)  # cast AFTER building: float64 sigmas are rounded to fp32 first
    if s.ndim == 0:
        s = s.expand(batch)
    if s.shape != (batch,):
        raise ValueError(f"sigma must be a scalar or have shape [{batch}] (the batch), got {tuple(s.shape)}")
    return s


def broadcast_to(per_sample: Tensor, like: Tensor) -> Tensor:
    """Reshape a [B] tensor to [B, 1, ..., 1] so it broadcasts against ``like`` [B, ...]."""
    return per_sample.reshape(per_sample.shape[0], *([1] * (like.ndim - 1)))


def gaussian_mean_log_prob(x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Mean over latent elements of the log-density of N(mean, std^2) at ``x_next``.

    ``x_next`` is detached (it is the stored sample; only ``mean`` carries gradients).
    ``std`` is [B]. Returns [B]. Written in the same order of operations as Flow-GRPO's
    ``sde_step_with_logprob`` so numbers agree with the reference implementation.
    """
    s = broadcast_to(std, mean)
    lp = -((x_next.detach() - mean) ** 2) / (2 * s**2) - torch.log(s) - _HALF_LOG_2PI
    return lp.mean(dim=tuple(range(1, lp.ndim)))


def resolve_next(mean: Tensor, std: Tensor, noise: Tensor | None, x_next: Tensor | None) -> Tensor:
    """``x_next`` if given (scoring a stored step), else ``mean + std * noise`` (sampling)."""
    if (noise is None) == (x_next is None):
        raise ValueError("pass exactly one of noise= (to sample a step) or x_next= (to score a stored step)")
    if x_next is not None:
        if x_next.shape != mean.shape:
            raise ValueError(f"x_next has shape {tuple(x_next.shape)}, expected {tuple(mean.shape)}")
        return x_next.to(torch.float32)
    assert noise is not None
    if noise.shape != mean.shape:
        raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {tuple(mean.shape)}")
    return mean + broadcast_to(std, mean) * noise.to(torch.float32)
