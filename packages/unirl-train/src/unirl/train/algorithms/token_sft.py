"""Token cross-entropy SFT for AR policies: teacher-forced ``-logp`` of the response tokens.

Log-probs come from ``pipeline.replay_logprobs`` (temperature from the Part's sampling params:
SFT Parts should use temperature 1). Aggregated with global denominators like the RL losses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator
from torch import Tensor

from unirl.train.algorithms.base import BatchTotals, require, text_segment
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.aggregation import AggregationMode, aggregate
from unirl.train.algorithms.losses.token_sft import token_nll
from unirl.types import Part


class TokenSFTConfig(AlgorithmConfigBase):
    """Cross-entropy on the loss-masked response tokens."""

    kind: Literal["token_sft"] = "token_sft"
    loss_agg_mode: AggregationMode = Field(default="token-mean", description="token/sequence aggregation.")
    horizon: int | None = Field(default=None, ge=1, description="H of 'seq-mean-token-sum-norm'.")

    @model_validator(mode="after")
    def _horizon(self) -> TokenSFTConfig:
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.horizon is None:
            raise ValueError("loss_agg_mode='seq-mean-token-sum-norm' needs horizon (e.g. max_new_tokens)")
        return self

    def build(self) -> TokenSFT:
        return TokenSFT(self)


class TokenSFT:
    """Token cross-entropy StageAlgorithm."""

    needs_old_logprobs = False

    def __init__(self, config: TokenSFTConfig) -> None:
        self.config = config
        self.name: str = config.kind

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        for p in parts:
            text_segment(p, self.name)

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        require(totals.num_samples > 0, f"{self.name}: BatchTotals.num_samples is 0")
        rep = pipeline.replay_logprobs(parts)
        logp, mask = rep.logp.float(), rep.mask.bool()
        nll = token_nll(logp)
        loss = aggregate(
            nll,
            mask,
            self.config.loss_agg_mode,
            num_tokens=totals.num_tokens,
            num_samples=totals.num_samples,
            horizon=self.config.horizon,
        )
        ntok = max(int(mask.sum()), 1)
        return loss, {"nll": (nll.detach() * mask).sum().item() / ntok}
