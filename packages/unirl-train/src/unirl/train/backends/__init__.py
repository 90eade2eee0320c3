"""Training backends: own the model state (structure, optimizer, scheduler, EMA, checkpoints)."""

from unirl.train.backends.base import ExportsHFWeights, SeparateRolloutCopy, StepStats, TrainBackend

__all__ = ["ExportsHFWeights", "SeparateRolloutCopy", "StepStats", "TrainBackend"]
