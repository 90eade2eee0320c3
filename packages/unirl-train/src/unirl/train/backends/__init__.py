"""Training backends: own the model state (structure, optimizer, scheduler, EMA, checkpoints)."""

from unirl.train.backends.base import StepStats, TrainBackend

__all__ = ["StepStats", "TrainBackend"]
