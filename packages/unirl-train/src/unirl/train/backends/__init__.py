"""Training backends: own the model state (structure, optimizer, scheduler, EMA, checkpoints)."""

from unirl.train.backends.base import SeparateRolloutCopy, StepStats, TrainBackend

__all__ = ["SeparateRolloutCopy", "StepStats", "TrainBackend"]
