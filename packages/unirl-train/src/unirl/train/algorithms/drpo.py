"""DRPO for AR policies: unclipped token ratio with a token-adaptive quadratic trust region."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from unirl.train.algorithms._ar import ARPolicyAlgorithm, ARPolicyConfig
from unirl.train.algorithms.losses.drpo import DRPO_DEFAULT_EPS, drpo_token_loss


class DRPOConfig(ARPolicyConfig):
    """DRPO: ``-A rho + |A| w (rho - 1)^2 / (2 eps)`` per token."""

    kind: Literal["drpo"] = "drpo"
    eps: float = Field(default=DRPO_DEFAULT_EPS, gt=0.0, description="trust-region width (12.5).")
    token_adaptive: bool = Field(default=True, description="w = exp(old_logprobs) (True) or w = 1 (False).")

    def build(self) -> DRPO:
        return DRPO(self)


class DRPO(ARPolicyAlgorithm):
    """DRPO StageAlgorithm."""

    config: DRPOConfig

    def __init__(self, config: DRPOConfig) -> None:
        super().__init__(config, config.kind)

    def token_loss(
        self, new_logprobs: Tensor, old_logprobs: Tensor, adv: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        return drpo_token_loss(new_logprobs, old_logprobs, adv, self.config.eps, self.config.token_adaptive)
