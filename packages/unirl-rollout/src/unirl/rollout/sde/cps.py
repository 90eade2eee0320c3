"""Coefficient-preserving sampling (CPS; Wang & Yu 2025, "Coefficients-Preserving Sampling").

    s  = sigma_next * sin(eta * pi / 2)
    x0_hat = x - sigma v,   eps_hat = x + (1 - sigma) v
    mu = (1 - sigma_next) x0_hat + sqrt(sigma_next^2 - s^2) eps_hat,   x_next = mu + s z

Two scorings of the stored x_next are offered, and named apart because their ratios have
different scales:
- ``cps_step(..., scoring="gaussian")`` (strategy ``cps``): the true Gaussian log-density,
  mean over elements, like the other kernels. Needs s > 0, i.e. sigma_next > 0 (the final step to
  sigma = 0 is deterministic and cannot be an SDE step).
- ``cps_step(..., scoring="no_variance")`` (strategy ``cps_novar``): the peers' score
  ``-mean((x_next - mu)^2)`` with no 1/(2 s^2) scale and no normaliser. Not a log-density.
With eta == 0 the step is the Euler step (delegated; log_prob None).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from unirl.rollout.sde.base import (
    StepResult,
    as_fp32_sigma,
    broadcast_to,
    gaussian_mean_log_prob,
    resolve_next,
)
from unirl.rollout.sde.flow_sde import _deterministic

__all__ = ["CPSScoring", "cps_step"]

CPSScoring = Literal["gaussian", "no_variance"]


def cps_step(
    x: Tensor,
    v: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    eta: float,
    *,
    scoring: CPSScoring = "gaussian",
    noise: Tensor | None = None,
    x_next: Tensor | None = None,
) -> StepResult:
    """One CPS step; see the module docstring for the two ``scoring`` options."""
    b = x.shape[0]
    s = as_fp32_sigma(sigma, b, x.device)
    s_next = as_fp32_sigma(sigma_next, b, x.device)
    if eta == 0:
        return _deterministic(x, v, s, s_next, x_next)
    x32, v32 = x.to(torch.float32), v.to(torch.float32)
    sig_b, nxt_b = broadcast_to(s, x), broadcast_to(s_next, x)
    std = s_next * math.sin(eta * math.pi / 2)
    x0_hat = x32 - sig_b * v32
    eps_hat = x32 + (1 - sig_b) * v32
    mean = (1 - nxt_b) * x0_hat + torch.sqrt(nxt_b**2 - broadcast_to(std, x) ** 2) * eps_hat
    xn = resolve_next(mean, std, noise, x_next)
    if scoring == "gaussian":
        if bool((std <= 0).any()):
            raise ValueError(
                "CPS with gaussian scoring needs sigma_next > 0 (the step to sigma=0 has std 0 and no "
                "density); exclude the final step from the SDE indices or use sde_strategy='cps_novar'"
            )
        log_prob = gaussian_mean_log_prob(xn, mean, std)
    elif scoring == "no_variance":
        d = -((xn.detach() - mean) ** 2)
        log_prob = d.mean(dim=tuple(range(1, d.ndim)))
    else:
        raise ValueError(f"scoring={scoring!r} is not one of 'gaussian', 'no_variance'")
    return StepResult(x_next=xn, log_prob=log_prob, mean=mean, std=std)
