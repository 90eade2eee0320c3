"""``off_policy``: the decoupled-PPO correction shared by the AR and diffusion policy losses.

The behaviour policy (the sampler, possibly stale: async rollout, another engine) recorded its
log-probs (``behavior_logprobs``); the old (proximal) policy is the trainer's recomputation before
the update (``prepare``), the ``old_logprobs`` of the clipped objective.
The clipped objective runs on ``exp(new_logprobs - old_logprobs)``; each token (AR) or SDE step
(diffusion) is weighted by ``exp(old_logprobs - behavior_logprobs)``, truncated or band-masked (REFERENCE_MATH.md).
"""

from __future__ import annotations

from pydantic import Field, model_validator
from torch import Tensor

from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.off_policy import OffPolicyLevel, OffPolicyMode, decoupled_weight


class OffPolicyConfig(AlgorithmConfigBase):
    """Decoupled-PPO correction between the behaviour (engine) and proximal (trainer) policies."""

    mode: OffPolicyMode = Field(
        description="'truncate': weight min(w, cap); 'mask': drop w outside [c_min, c_max]."
    )
    cap: float | None = Field(default=None, gt=0.0, description="truncate: the cap C (e.g. 2.0).")
    c_min: float | None = Field(
        default=None, ge=0.0, description="mask: lower bound of kept weights (e.g. 0.5)."
    )
    c_max: float | None = Field(
        default=None, gt=0.0, description="mask: upper bound of kept weights (e.g. 2.0)."
    )
    level: OffPolicyLevel = Field(default="token", description="token weights or one weight per sequence.")

    @model_validator(mode="after")
    def _bounds(self) -> OffPolicyConfig:
        if self.mode == "truncate" and self.cap is None:
            raise ValueError("off_policy.mode='truncate' needs off_policy.cap (e.g. 2.0)")
        if self.mode == "mask" and (self.c_min is None or self.c_max is None or self.c_min >= self.c_max):
            raise ValueError(
                f"off_policy.mode='mask' needs c_min < c_max; got c_min={self.c_min}, c_max={self.c_max}"
            )
        return self


def off_policy_weights(
    cfg: OffPolicyConfig, old_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """The weights ``cfg`` applies (shape of ``mask``, no gradient) and their statistics."""
    kw = {"cap": cfg.cap, "c_min": cfg.c_min, "c_max": cfg.c_max, "level": cfg.level}
    w = decoupled_weight(old_logprobs, behavior_logprobs, mask, cfg.mode, **kw)  # type: ignore[arg-type]
    raw = decoupled_weight(
        old_logprobs, behavior_logprobs, mask, "truncate", cap=float("inf"), level=cfg.level
    )
    return w, is_weight_stats(w, raw, mask, cfg.mode)


def is_weight_stats(w: Tensor, raw: Tensor, mask: Tensor, mode: OffPolicyMode) -> dict[str, float]:
    """Statistics of the decoupled weights over response tokens: the mean applied weight ``w``, the
    largest and smallest raw weight exp(old_logprobs - behavior_logprobs), and the fraction clipped
    (truncated at the cap, or masked out of the band)."""
    m = mask.bool()
    n = max(int(m.sum()), 1)
    changed = ((w == 0) if mode == "mask" else (w < raw)) & m
    return {
        "is_weight_mean": (w * m).sum().item() / n,
        "is_weight_raw_max": raw[m].max().item() if m.any() else 1.0,
        "is_weight_raw_min": raw[m].min().item() if m.any() else 1.0,
        "is_weight_clipped_frac": changed.sum().item() / n,
    }
