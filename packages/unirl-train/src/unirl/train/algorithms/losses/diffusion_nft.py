"""DiffusionNFT (forward-process negative-aware fine-tuning): loss and old-policy EMA schedule.

No log-probs: with the clean sample ``x0``, fresh noise ``eps`` and ``t`` from the sampling grid,
``x_t = (1 - t) x0 + t eps``; the trainable velocity ``v_theta`` and the frozen old velocity
``v_old`` give an implicit positive and negative policy
``v+ = beta v_theta + (1 - beta) v_old`` and ``v- = (1 + beta) v_old - beta v_theta``.
Each is turned into an ``x0`` prediction ``x0± = x_t - t v±`` and regressed on ``x0`` with an
adaptive weight ``w± = max(mean|x0± - x0|, 1e-5)`` (no gradient through ``w``). The advantage
picks the mix: ``r = clip(clip(A, -Amax, Amax) / Amax / 2 + 0.5, 0, 1)``.
``loss_i = Amax * (r * mean((x0+ - x0)^2) / w+ + (1 - r) * mean((x0- - x0)^2) / w-) / beta``;
the mini-batch loss is the mean of ``loss_i`` over all (sample, t-draw) pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Advantage clip used by DiffusionNFT to map A to the mixing weight r; also the loss scale.
NFT_ADV_MAX = 5.0
#: Lower bound of the adaptive weights ``w±``.
NFT_WEIGHT_FLOOR = 1e-5


def nft_noisy_latent(x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
    """Forward process ``x_t = (1 - t) x0 + t eps``; ``t``: ``[B]`` broadcast over ``x0: [B, ...]``."""
    tb = _bcast(t, x0)
    return (1.0 - tb) * x0 + tb * noise


def nft_mix_weight(advantage: Tensor, adv_max: float = NFT_ADV_MAX) -> Tensor:
    """``r = clip(clip(A, -Amax, Amax) / Amax / 2 + 0.5, 0, 1)``: A = -Amax -> 0, 0 -> 0.5, Amax -> 1."""
    a = torch.clamp(advantage, -adv_max, adv_max)
    return torch.clamp(a / adv_max / 2.0 + 0.5, 0.0, 1.0)


def nft_sample_loss(
    v_theta: Tensor,
    v_old: Tensor,
    x_t: Tensor,
    x0: Tensor,
    t: Tensor,
    advantage: Tensor,
    beta: float,
    adv_max: float = NFT_ADV_MAX,
) -> Tensor:
    """Per-sample DiffusionNFT loss ``[B]`` (already multiplied by ``Amax`` and divided by ``beta``).

    Only ``v_theta`` carries a gradient. Shapes: ``v_theta, v_old, x_t, x0: [B, ...]``; ``t``,
    ``advantage``: ``[B]``.
    """
    if beta <= 0:
        raise ValueError(f"DiffusionNFT beta must be > 0, got {beta}")
    v_old = v_old.detach()
    tb = _bcast(t, x_t)
    v_pos = beta * v_theta + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    x0_pos = x_t - tb * v_pos
    x0_neg = x_t - tb * v_neg
    w_pos = _adaptive_weight(x0_pos, x0)
    w_neg = _adaptive_weight(x0_neg, x0)
    pos = ((x0_pos - x0) ** 2).flatten(1).mean(dim=1) / w_pos
    neg = ((x0_neg - x0) ** 2).flatten(1).mean(dim=1) / w_neg
    r = nft_mix_weight(advantage.detach(), adv_max)
    return adv_max * (r * pos + (1.0 - r) * neg) / beta


def nft_old_decay(step: int, rate: float = 0.001, cap: float = 0.5) -> float:
    """EMA decay of the old policy after optimizer step ``step``: ``d = min(rate * step, cap)``.

    The update is ``theta_old <- d theta_old + (1 - d) theta``: at step 0 the old policy is a copy.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return min(rate * step, cap)


@torch.no_grad()
def nft_ema_update(old: list[Tensor], new: list[Tensor], decay: float) -> None:
    """In place ``old <- decay * old + (1 - decay) * new`` for matching tensor lists."""
    if len(old) != len(new):
        raise ValueError(f"old/new parameter lists differ in length: {len(old)} vs {len(new)}")
    for o, n in zip(old, new):
        o.mul_(decay).add_(n.detach().to(o.dtype), alpha=1.0 - decay)


def _adaptive_weight(pred: Tensor, target: Tensor) -> Tensor:
    with torch.no_grad():
        w = (pred.detach().double() - target.double()).abs().flatten(1).mean(dim=1)
        return w.clamp_min(NFT_WEIGHT_FLOOR).to(pred.dtype)


def _bcast(t: Tensor, like: Tensor) -> Tensor:
    t = t.to(like.dtype)
    return t.view(-1, *([1] * (like.dim() - 1))) if t.dim() == 1 else t
