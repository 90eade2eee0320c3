"""Rollout engines. ``trainside`` is built in; dedicated engines (sglang, vllm) live behind extras."""

from unirl.rollout.engines.base import DedicatedRolloutEngine, RolloutEngine
from unirl.rollout.engines.trainside import TrainsideEngine

__all__ = ["DedicatedRolloutEngine", "RolloutEngine", "TrainsideEngine"]
