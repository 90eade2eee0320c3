"""GSPO: sequence-level importance ratio (geometric mean of token ratios), clipped.

The per-sequence loss is broadcast to the sequence's tokens so the shared aggregation applies;
with the default ``seq-mean-token-mean`` that is exactly ``sum_i l_i / N_seq``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from unirl.train.algorithms._ar import ARPolicyAlgorithm, ARPolicyConfig
from unirl.train.algorithms.losses.aggregation import AggregationMode
from unirl.train.algorithms.losses.gspo import gspo_sequence_loss
from unirl.train.algorithms.losses.ratio_stats import clip_fraction


class GSPOConfig(ARPolicyConfig):
    """GSPO (Zheng et al. 2025): clip the sequence ratio with tiny bounds (3e-4 / 4e-4)."""

    kind: Literal["gspo"] = "gspo"
    eps_low: float = Field(default=3e-4, gt=0.0, lt=1.0, description="lower clip of the sequence ratio.")
    eps_high: float = Field(default=4e-4, gt=0.0, description="upper clip of the sequence ratio.")
    loss_agg_mode: AggregationMode = Field(
        default="seq-mean-token-mean", description="GSPO uses seq-mean-token-mean."
    )

    def build(self) -> GSPO:
        return GSPO(self)


class GSPO(ARPolicyAlgorithm):
    """GSPO StageAlgorithm."""

    config: GSPOConfig

    def __init__(self, config: GSPOConfig) -> None:
        super().__init__(config, config.kind)

    def token_loss(
        self, new_logprobs: Tensor, old_logprobs: Tensor, adv: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        c = self.config
        seq_loss, seq_ratio = gspo_sequence_loss(new_logprobs, old_logprobs, adv, mask, c.eps_low, c.eps_high)
        return seq_loss.unsqueeze(-1).expand_as(new_logprobs), seq_ratio.unsqueeze(-1).expand_as(new_logprobs)

    def clip_metrics(self, ratio: Tensor, mask: Tensor) -> dict[str, float]:
        return {"clip_frac": clip_fraction(ratio, self.config.eps_low, self.config.eps_high, mask).item()}
