"""Decoupled-PPO off-policy correction: behaviour (engine, ``behavior_logprobs``) vs old / proximal
(trainer, ``old_logprobs``) policy.

``rho = exp(new_logprobs - old_logprobs)`` drives the clipped objective as usual; each token (or
sequence) is weighted by ``w = exp(old_logprobs - behavior_logprobs)``, either truncated
``min(w, C)`` (truncated IS) or used as a 0/1 mask that drops elements with ``w`` outside
``[C_min, C_max]`` (no reweighting inside the band). ``level="sequence"`` uses
``exp(sum_t m (old_logprobs - behavior_logprobs))`` for every token of the sequence. The weight never carries a gradient.
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
    old_logprobs: Tensor,
    behavior_logprobs: Tensor,
    mask: Tensor,
    mode: OffPolicyMode,
    *,
    cap: float | None = None,
    c_min: float | None = None,
    c_max: float | None = None,
    level: OffPolicyLevel = "token",
) -> Tensor:
    """The importance weight per token ``[B, T]`` (0 where ``mask`` is 0)."""
    m = mask.to(old_logprobs.dtype)
    log_w = (old_logprobs - behavior_logprobs) * m
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
