"""Rollout engines, model bundles and pipelines, SDE step kernels, sigma schedules for unirl."""

__version__ = "0.1.0"
