"""Flow-matching SFT: regress the velocity ``v = eps - x0`` at ``x_t = (1 - t) x0 + t eps``."""

from __future__ import annotations

import torch
from torch import Tensor


def flow_matching_target(x0: Tensor, noise: Tensor) -> Tensor:
    """The rectified-flow velocity target ``eps - x0`` (diffusers FlowMatchEuler convention)."""
    return noise - x0


def flow_sft_sample_loss(v_pred: Tensor, x0: Tensor, noise: Tensor) -> Tensor:
    """Per-sample MSE ``mean_elements (v_pred - (eps - x0))^2``: ``[B]``, computed in fp32."""
    err = v_pred.float() - flow_matching_target(x0, noise).float()
    return (err**2).flatten(1).mean(dim=1)


def sample_timesteps(
    n: int,
    kind: str,
    generator: torch.Generator | None = None,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
) -> Tensor:
    """Draw ``n`` flow times ``t`` in (0, 1): ``uniform`` or SD3's ``logit_normal`` (sigmoid of a normal)."""
    if kind == "uniform":
        return torch.rand(n, generator=generator)
    if kind == "logit_normal":
        return torch.sigmoid(logit_mean + logit_std * torch.randn(n, generator=generator))
    raise ValueError(f"timestep sampling kind={kind!r} is not one of 'uniform', 'logit_normal'")
