"""GRPO for AR policies, with the DAPO and Dr.GRPO options as config.

Token PPO-clip (clip-higher ``eps_low`` / ``eps_high``, dual clip ``c`` for A < 0) aggregated
with global denominators. ``GRPOConfig.dapo()`` and ``GRPOConfig.dr_grpo(horizon)`` give the
published settings. DAPO's reward-side pieces (overlong shaping, truncation policy, dynamic
sampling) act before advantages: ``GRPO.shape_rewards(parts)`` and ``losses.dapo.group_has_signal``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator
from torch import Tensor

from unirl.train.algorithms._ar import ARPolicyAlgorithm, ARPolicyConfig
from unirl.train.algorithms.base import text_segment
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.dapo import TruncationPolicy, shape_reward
from unirl.train.algorithms.losses.ppo import ppo_token_loss
from unirl.train.algorithms.losses.ratio_stats import clip_fraction
from unirl.types import Part, Reward


class OverlongConfig(AlgorithmConfigBase):
    """DAPO overlong reward shaping, applied by ``GRPO.shape_rewards`` before advantages."""

    max_length: int = Field(ge=1, description="L: the response length limit (max_new_tokens).")
    buffer: int = Field(ge=1, description="B: the soft-penalty zone is the last B tokens before L.")
    factor: float = Field(default=1.0, ge=0.0, description="penalty at len == L is -factor.")
    truncation: TruncationPolicy = Field(
        default="soft", description="'zero': truncated -> reward 0; 'keep'; 'soft': add the length penalty."
    )

    @model_validator(mode="after")
    def _buffer(self) -> OverlongConfig:
        if self.buffer > self.max_length:
            raise ValueError(
                f"overlong.buffer={self.buffer} must be <= overlong.max_length={self.max_length}"
            )
        return self


class GRPOConfig(ARPolicyConfig):
    """GRPO / DAPO / Dr.GRPO token-level clipped policy gradient."""

    kind: Literal["grpo"] = "grpo"
    eps_low: float = Field(default=0.2, gt=0.0, lt=1.0, description="lower clip: rho >= 1 - eps_low.")
    eps_high: float = Field(default=0.2, gt=0.0, description="upper clip: rho <= 1 + eps_high (DAPO: 0.28).")
    dual_clip: float | None = Field(default=3.0, gt=1.0, description="dual-clip c for A < 0 (None = off).")
    overlong: OverlongConfig | None = Field(default=None, description="DAPO overlong shaping (None = off).")

    @classmethod
    def dapo(cls, **overrides: Any) -> GRPOConfig:
        """DAPO: clip-higher 0.2 / 0.28, token-mean, no KL (overlong shaping: pass ``overlong=``)."""
        base: dict[str, Any] = {
            "eps_low": 0.2,
            "eps_high": 0.28,
            "loss_agg_mode": "token-mean",
            "kl_coef": 0.0,
        }
        return cls(**{**base, **overrides})

    @classmethod
    def dr_grpo(cls, horizon: int, **overrides: Any) -> GRPOConfig:
        """Dr.GRPO: token sums over a constant horizon (pair with AdvantageConfig(mode='mean_only'))."""
        base: dict[str, Any] = {
            "loss_agg_mode": "seq-mean-token-sum-norm",
            "horizon": horizon,
            "kl_coef": 0.0,
        }
        return cls(**{**base, **overrides})

    def build(self) -> GRPO:
        return GRPO(self)


class GRPO(ARPolicyAlgorithm):
    """GRPO StageAlgorithm (DAPO / Dr.GRPO through the config)."""

    config: GRPOConfig

    def __init__(self, config: GRPOConfig) -> None:
        super().__init__(config, config.kind)

    def token_loss(
        self, new_logprobs: Tensor, old_logprobs: Tensor, adv: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        c = self.config
        return ppo_token_loss(new_logprobs, old_logprobs, adv, c.eps_low, c.eps_high, c.dual_clip)

    def clip_metrics(self, ratio: Tensor, mask: Tensor) -> dict[str, float]:
        return {"clip_frac": clip_fraction(ratio, self.config.eps_low, self.config.eps_high, mask).item()}

    def shape_rewards(self, parts: Sequence[Part]) -> None:
        """Apply the overlong / truncation policy to each Part's reward in place (no-op when off).

        The penalty is recorded as the ``overlong`` component; call before computing advantages.
        """
        ov = self.config.overlong
        if ov is None:
            return
        for p in parts:
            if p.reward is None:
                raise ValueError(f"part {p.name!r} has no reward; score it before shaping")
            n = len(text_segment(p, self.name).response_ids)
            truncated = p.status == "truncated"
            total = shape_reward(
                p.reward.total,
                n,
                truncated,
                ov.truncation,
                max_length=ov.max_length,
                buffer=ov.buffer,
                factor=ov.factor,
            )
            comps = {**p.reward.components, "overlong": total - p.reward.total}
            p.reward = Reward(total=total, components=comps)
