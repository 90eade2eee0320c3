"""Unified AR + flow-matching models: one backbone with a text head and an image head.

``UnifiedBundle`` is the protocol rollout and replay share; ``TinyUnifiedBundle`` the in-project
model; ``UnifiedTextPipeline`` (think) and ``UnifiedImagePipeline`` (draw) its two tracks.
"""

from unirl.rollout.unified.bundle import TinyUnifiedBundle, UnifiedBundle, WordVocab
from unirl.rollout.unified.pipeline import ImageHeadView, UnifiedImagePipeline, UnifiedTextPipeline
from unirl.rollout.unified.tiny import TinyUnifiedConfig, TinyUnifiedModel

__all__ = [
    "ImageHeadView",
    "TinyUnifiedBundle",
    "TinyUnifiedConfig",
    "TinyUnifiedModel",
    "UnifiedBundle",
    "UnifiedImagePipeline",
    "UnifiedTextPipeline",
    "WordVocab",
]
