"""Pipelines: a stage that fills one Part of each Sample, and replays it for training."""

from unirl.rollout.pipelines.base import Pipeline, PreparesPrompts
from unirl.rollout.pipelines.flow import FlowMatchPipeline, StepReplay, pin_sigmas

__all__ = ["FlowMatchPipeline", "Pipeline", "PreparesPrompts", "StepReplay", "pin_sigmas"]
