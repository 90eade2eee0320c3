"""Stage algorithms: the loss of one trainable Part, selected by a typed config.

``AlgorithmConfig`` is a discriminated union on ``kind``; ``config.build()`` gives the
StageAlgorithm. Pure loss math lives in ``unirl.train.algorithms.losses``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from unirl.train.algorithms.base import (
    BatchTotals,
    ContextReference,
    DrawsOwnRNG,
    ShapesRewards,
    StageAlgorithm,
    UsesOldPolicy,
    UsesReference,
)
from unirl.train.algorithms.diffusion_nft import DiffusionNFT, DiffusionNFTConfig
from unirl.train.algorithms.drpo import DRPO, DRPOConfig
from unirl.train.algorithms.flow_dppo import FlowDPPO, FlowDPPOConfig
from unirl.train.algorithms.flow_grpo import DanceGRPOConfig, FlowGRPO, FlowGRPOConfig, MixGRPOConfig
from unirl.train.algorithms.flow_sft import FlowSFT, FlowSFTConfig
from unirl.train.algorithms.grpo import GRPO, GRPOConfig, OverlongConfig
from unirl.train.algorithms.gspo import GSPO, GSPOConfig
from unirl.train.algorithms.off_policy import OffPolicyConfig
from unirl.train.algorithms.token_sft import TokenSFT, TokenSFTConfig

AlgorithmConfig = Annotated[
    FlowGRPOConfig
    | DanceGRPOConfig
    | MixGRPOConfig
    | FlowDPPOConfig
    | DiffusionNFTConfig
    | FlowSFTConfig
    | GRPOConfig
    | GSPOConfig
    | DRPOConfig
    | TokenSFTConfig,
    Field(discriminator="kind"),
]
"""Any algorithm config, selected by ``kind``."""

__all__ = [
    "DRPO",
    "GRPO",
    "GSPO",
    "AlgorithmConfig",
    "BatchTotals",
    "ContextReference",
    "DRPOConfig",
    "DanceGRPOConfig",
    "DiffusionNFT",
    "DiffusionNFTConfig",
    "DrawsOwnRNG",
    "FlowDPPO",
    "FlowDPPOConfig",
    "FlowGRPO",
    "FlowGRPOConfig",
    "FlowSFT",
    "FlowSFTConfig",
    "GRPOConfig",
    "GSPOConfig",
    "MixGRPOConfig",
    "OffPolicyConfig",
    "OverlongConfig",
    "ShapesRewards",
    "StageAlgorithm",
    "TokenSFT",
    "TokenSFTConfig",
    "UsesOldPolicy",
    "UsesReference",
]
