"""Reward scorers, RewardService, and an HTTP reward server and client. Installs without torch.

Model-based scorers live in `unirl.reward.models` behind extras (`pip install 'unirl-reward[models]'`);
the server is `unirl-reward serve --config scorers.yaml` (see README.md).
"""

from unirl.reward.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardClientError
from unirl.reward.combine import WeightedScorer
from unirl.reward.config import ScorerEntry, ServiceConfig
from unirl.reward.protocol import Modality, ScoreItem, Scorer, ScoreResult
from unirl.reward.service import RewardService, sample_to_item

__version__ = "0.1.0"

__all__ = [
    "AsyncRewardClient",
    "Modality",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardService",
    "ScoreItem",
    "ScoreResult",
    "Scorer",
    "ScorerEntry",
    "ServiceConfig",
    "WeightedScorer",
    "sample_to_item",
]
