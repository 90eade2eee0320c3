"""Flow-SDE step of Flow-GRPO (Liu et al. 2025), and Dance-SDE of DanceGRPO (Xue et al. 2025).

Both share the mean and std of the reverse SDE of the rectified flow:
    mu = x * (1 + g^2 dt / (2 sigma)) + v * (1 + g^2 (1 - sigma) / (2 sigma)) * dt
    s  = g * sqrt(-dt),   x_next = mu + s z,   dt = sigma_next - sigma < 0
and differ in the diffusion coefficient g:
    Flow-SDE:  g = eta * sqrt(sigma / (1 - sigma'))  with sigma' = sigma, except that at
               sigma == 1 the schedule's second sigma is used (1 / (1 - 1) is infinite);
    Dance-SDE: g = eta (a constant).
The score is the Gaussian log-density of x_next, averaged over latent elements.
With eta == 0 the step IS the Euler step (delegated, so it matches bit for bit; log_prob None,
as DiffusionSamplingParams documents: those SDE indices carry no log-prob signal).
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.rollout.sde.base import (
    StepResult,
    as_fp32_sigma,
    broadcast_to,
    gaussian_mean_log_prob,
    resolve_next,
)
from unirl.rollout.sde.ode import ode_step

__all__ = ["dance_sde_step", "flow_sde_step", "sde_mean_std"]


def sde_mean_std(x: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Mean [B, ...] and std [B] of the reverse-SDE step, given fp32 [B] ``sigma``, ``sigma_next``, ``g``."""
    dt = sigma_next - sigma
    sig_b, dt_b, g_b = broadcast_to(sigma, x), broadcast_to(dt, x), broadcast_to(g, x)
    x32, v32 = x.to(torch.float32), v.to(torch.float32)
    mean = x32 * (1 + g_b**2 / (2 * sig_b) * dt_b) + v32 * (1 + g_b**2 * (1 - sig_b) / (2 * sig_b)) * dt_b
    std = g * torch.sqrt(-dt)
    return mean, std


def flow_sde_step(
    x: Tensor,
    v: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    eta: float,
    *,
    sigma_at_one: Tensor | float,
    noise: Tensor | None = None,
    x_next: Tensor | None = None,
) -> StepResult:
    """Flow-GRPO SDE step. ``sigma_at_one`` replaces sigma in ``1 - sigma`` where sigma == 1
    (pass the schedule's second sigma, ``sigmas[1]``). Pass ``noise`` to sample or ``x_next`` to score."""
    b = x.shape[0]
    s = as_fp32_sigma(sigma, b, x.device)
    s_next = as_fp32_sigma(sigma_next, b, x.device)
    if eta == 0:
        return _deterministic(x, v, s, s_next, x_next)
    s_one = as_fp32_sigma(sigma_at_one, b, x.device)
    g = eta * torch.sqrt(s / (1 - torch.where(s == 1, s_one, s)))
    mean, std = sde_mean_std(x, v, s, s_next, g)
    xn = resolve_next(mean, std, noise, x_next)
    return StepResult(x_next=xn, log_prob=gaussian_mean_log_prob(xn, mean, std), mean=mean, std=std)


def dance_sde_step(
    x: Tensor,
    v: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    eta: float,
    *,
    noise: Tensor | None = None,
    x_next: Tensor | None = None,
) -> StepResult:
    """DanceGRPO SDE step: the Flow-SDE mean/std with a constant diffusion coefficient g = eta."""
    b = x.shape[0]
    s = as_fp32_sigma(sigma, b, x.device)
    s_next = as_fp32_sigma(sigma_next, b, x.device)
    if eta == 0:
        return _deterministic(x, v, s, s_next, x_next)
    g = torch.full_like(s, float(eta))
    mean, std = sde_mean_std(x, v, s, s_next, g)
    xn = resolve_next(mean, std, noise, x_next)
    return StepResult(x_next=xn, log_prob=gaussian_mean_log_prob(xn, mean, std), mean=mean, std=std)


def _deterministic(x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, x_next: Tensor | None) -> StepResult:
    """eta == 0: the Euler step. A point mass has no density, so log_prob is None even when a stored
    ``x_next`` is given (it is returned as is; ``mean`` is the Euler result)."""
    r = ode_step(x, v, s, s_next)
    if x_next is None:
        return r
    return StepResult(x_next=x_next.to(torch.float32), log_prob=None, mean=r.mean, std=r.std)
