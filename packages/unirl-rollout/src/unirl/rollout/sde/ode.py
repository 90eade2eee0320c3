"""Deterministic Euler (ODE) step: ``x_next = x + v * dt``. No log-prob.

Bit-for-bit equal to diffusers' ``FlowMatchEulerDiscreteScheduler.step`` in fp32
(``sample.float() + (sigma_next - sigma) * model_output``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.rollout.sde.base import StepResult, as_fp32_sigma, broadcast_to

__all__ = ["ode_step"]


def ode_step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float) -> StepResult:
    """One Euler step from ``sigma`` to ``sigma_next`` (both [B] or scalar); std = 0, log_prob None."""
    b = x.shape[0]
    s = as_fp32_sigma(sigma, b, x.device)
    s_next = as_fp32_sigma(sigma_next, b, x.device)
    dt = broadcast_to(s_next - s, x)
    x_next = x.to(torch.float32) + dt * v.to(torch.float32)
    return StepResult(x_next=x_next, log_prob=None, mean=x_next, std=torch.zeros_like(s))
