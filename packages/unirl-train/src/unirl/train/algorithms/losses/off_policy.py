"""Decoupled-PPO off-policy correction: behaviour (engine, ``logp_behav``) vs proximal (trainer,
``logp_old``) policy.

``rho = exp(logp - logp_old)`` drives the clipped objective as usual; each token (or sequence)
is weighted by ``w = exp(logp_old - logp_behav)``, either truncated ``min(w, C)``
(truncated IS) or used as a 0/1 mask that drops elements with ``w`` outside ``[C_min, C_max]``
(no reweighting inside the band). ``level="sequence"`` uses ``exp(sum_t m (logp_old - logp_behav))``
for every token of the sequence. The weight never carries a gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from unirl.train.algorithms.losses.ppo import LOG_RATIO_CLAMP

OffPolicyMode = Literal["truncate", "mask"]
OffPolicyLevel = Literal["token", "sequence"]


@torch.no_grad()
def decoupled_weight(
    logp_old: Tensor,
    logp_behav: Tensor,
    mask: Tensor,
    mode: OffPolicyMode,
    *,
    cap: float | None = None,
    c_min: float | None = None,
    c_max: float | None = None,
    level: OffPolicyLevel = "token",
) -> Tensor:
    """The importance weight per token ``[B, T]`` (0 where ``mask`` is 0)."""
    m = mask.to(logp_old.dtype)
    log_w = (logp_old - logp_behav) * m
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"off-policy level must be 'token' or 'sequence', got {level!r}")
    w = torch.exp(torch.clamp(log_w, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if mode == "truncate":
        if cap is None or cap <= 0:
            raise ValueError(f"off-policy mode 'truncate' needs cap > 0, got {cap}")
        out = torch.clamp(w, max=cap)
    elif mode == "mask":
        if c_min is None or c_max is None or not 0 <= c_min < c_max:
            raise ValueError(
                f"off-policy mode 'mask' needs 0 <= c_min < c_max, got c_min={c_min}, c_max={c_max}"
            )
        out = ((w >= c_min) & (w <= c_max)).to(w.dtype)
    else:
        raise ValueError(f"off-policy mode must be 'truncate' or 'mask', got {mode!r}")
    return out * m
